#!/usr/bin/env python3
"""Makes the oracle fixtures under tests/fixtures/: tiny random Gemma-4 MoE checkpoints
(one f32 in the `gemma4_text` layout, one bf16 in the multimodal `gemma4` layout with hub-style
`global_head_dim` keys and `model.language_model.` names) and what Hugging Face transformers
computes for them: logits of every row and greedy tokens with each step's top-2 margin.

    pip install torch transformers safetensors
    python3 scripts/make_fixtures.py [gemma4] [qwen3] [gpt_oss]    (all when none is named)

Qwen3-MoE: tiny random Qwen3MoeForCausalLM checkpoints, one f32 (untied head, the config as
transformers 5 saves it: `num_local_experts`, `rope_parameters`) and one bf16 (tied head, the
hub's spellings: `num_experts`, top-level `rope_theta`), each with a dense layer
(`mlp_only_layers`), per-expert tensors, and for bf16 the gap between transformers' native
bf16 compute and f32 compute of the same weights (the yardstick the bf16 test is held to).

gpt-oss: tiny random GptOssForCausalLM checkpoints, one f32 (transformers 5's config), one bf16
(the hub's spellings: `rope_scaling` beside `rope_theta`), and one with its experts in MXFP4 as
the hub ships them (`*_blocks`/`*_scales`, every other tensor f32), the reference computed by
transformers from that same file; each with transformers' YaRN frequencies.

Both attention kinds, a prompt longer than the sliding window, MoE on, and norm weights, router
scales and layer scalars drawn away from their initial 1 (so mistakes in them show).
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
PROMPT_LEN = 20  # longer than the sliding window (8)
NEW_TOKENS = 8


def config():
    return Gemma4TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=48, num_hidden_layers=len(LAYER_TYPES),
        layer_types=LAYER_TYPES, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=8,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=32,
        hidden_size_per_layer_input=0, num_kv_shared_layers=0, use_double_wide_mlp=False,
        final_logit_softcapping=30.0, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, max_position_embeddings=1024, initializer_range=0.05,
        pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )


def build(seed):
    torch.manual_seed(seed)
    cfg = config()
    cfg._attn_implementation = "eager"
    model = Gemma4ForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("router.scale") or name.endswith(
                    "per_expert_scale"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.5 + torch.rand(()).item())
            # A decisive router: with near-ties a 16-bit rounding flips a route and moves a row
            # by O(1), which says nothing about the implementation.
            layer.router.proj.weight.mul_(12.0)
        # Embedding (and tied head) wide enough that greedy choices have margins to test.
        model.model.embed_tokens.weight.normal_(0.0, 0.08)
    for setter, value in (("set_attn_implementation", "eager"), ("set_experts_implementation", "eager")):
        if hasattr(model, setter):
            try:
                getattr(model, setter)(value)
            except Exception:  # noqa: BLE001 - older/newer transformers differ here
                pass
    return model


def reference(model, ids):
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    tokens = gen.sequences[0, ids.shape[1]:].tolist()
    margins = []
    for s in gen.scores:
        top = torch.topk(s[0].float(), 2).values
        margins.append(float(top[0] - top[1]))
    return logits, tokens, margins


PROMPT_TEXT = "the expert reads the route and the token goes down the layer"


def tokenizer(path):
    """A small byte-level BPE (vocabulary under the model's 512) saved as tokenizer.json, the
    format `moek generate --prompt` reads. Ids: <pad> 0, <eos> 1, <bos> 2, <unk> 3."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    g = torch.Generator().manual_seed(3)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(letters[i] for i in torch.randint(0, 26, (int(n),), generator=g))
             for n in torch.randint(2, 9, (3000,), generator=g)]
    corpus = [PROMPT_TEXT] * 20 + [" ".join(words[i:i + 12]) for i in range(0, len(words), 12)]
    # Exactly the model's vocabulary, so every id the model emits decodes.
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.save(os.path.join(path, "tokenizer.json"))
    return tok


def write(name, model, dtype, multimodal):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model = model.to(dtype)
    ids = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    logits, tokens, margins = reference(model, ids)
    # The same stored weights computed in f32: separates what the implementation does from how
    # transformers rounds activations to bf16 at every step.
    with torch.no_grad():
        logits_f32 = model.float()(input_ids=ids, use_cache=False).logits[0].float()
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    for extra in ("generation_config.json",):
        p = os.path.join(path, extra)
        if os.path.exists(p):
            os.remove(p)
    if multimodal:
        # The multimodal layout: `gemma4` config with text_config (hub-style global_* keys) and
        # `model.language_model.` tensor names.
        st = os.path.join(path, "model.safetensors")
        tensors = {k.replace("model.", "model.language_model.", 1): v for k, v in load_file(st).items()}
        save_file(tensors, st, metadata={"format": "pt"})
        text = json.load(open(os.path.join(path, "config.json")))
        text.pop("per_layer_config", None)
        text["head_dim"] = 32
        text["num_key_value_heads"] = 2
        text["global_head_dim"] = 64
        text["num_global_key_value_heads"] = 1
        text["model_type"] = "gemma4_text"
        json.dump({"model_type": "gemma4", "architectures": ["Gemma4ForConditionalGeneration"],
                   "text_config": text, "tie_word_embeddings": True},
                  open(os.path.join(path, "config.json"), "w"), indent=1)
    prompt = {}
    if not multimodal:
        tok = tokenizer(path)
        pids = torch.tensor([tok.encode(PROMPT_TEXT).ids])
        _, ptokens, pmargins = reference(model.to(dtype), pids)
        prompt = {"prompt": PROMPT_TEXT, "prompt_ids": pids[0].tolist(), "prompt_greedy": ptokens,
                  "prompt_margins": pmargins, "prompt_greedy_text": tok.decode(ptokens)}
    json.dump({
        **prompt,
        "tokens": ids[0].tolist(),
        "logits": logits.tolist(),
        "logits_f32_compute": logits_f32.tolist(),
        "greedy": tokens,
        "margins": margins,
        "dtype": str(dtype).replace("torch.", ""),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }, open(os.path.join(path, "expected.json"), "w"))
    print(name, "greedy", tokens, "min margin", min(margins))


def qwen3_build(seed, tied):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(seed)
    cfg = Qwen3MoeConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[2], max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=tied, initializer_range=0.05, pad_token_id=0, bos_token_id=2,
        eos_token_id=1,
    )
    cfg._attn_implementation = "eager"
    model = Qwen3MoeForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                # Router logits of std ~2: decisive routes (a 16-bit rounding does not flip them)
                # that are not one-hot either.
                layer.mlp.gate.weight.normal_(0.0, 0.3)
        # Logits with top-2 margins to test greedy choices by, neither flat nor one token
        # everywhere (a tied head scores each row against the embedding itself).
        model.model.embed_tokens.weight.normal_(0.0, 0.3 if tied else 0.5)
        if not tied:
            model.lm_head.weight.normal_(0.0, 0.15)
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception:  # noqa: BLE001
            pass
    return model


def rel_l2(a, b):
    return float(((a - b).double().norm() / b.double().norm()).item())


def qwen3_write(name, model, dtype, hub_spelling):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model = model.to(dtype)
    ids = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    logits, tokens, margins = reference(model, ids)
    with torch.no_grad():
        logits_f32 = model.float()(input_ids=ids, use_cache=False).logits[0].float()
    model = model.to(dtype)
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    cfgp = os.path.join(path, "config.json")
    c = json.load(open(cfgp))
    if hub_spelling:
        c["num_experts"] = c.pop("num_local_experts")
        c["rope_theta"] = c.pop("rope_parameters")["rope_theta"]
    json.dump(c, open(cfgp, "w"), indent=1)
    json.dump({
        "tokens": ids[0].tolist(),
        "logits": logits.tolist(),
        "logits_f32_compute": logits_f32.tolist(),
        # transformers' own bf16 compute against f32 compute of the same stored weights.
        "native_gap_rel_l2": rel_l2(logits, logits_f32),
        "greedy": tokens,
        "margins": margins,
        "dtype": str(dtype).replace("torch.", ""),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }, open(os.path.join(path, "expected.json"), "w"))
    print(name, "greedy", tokens, "min margin", min(margins), "native gap", rel_l2(logits, logits_f32))


# OCP MXFP4: e2m1 code -> value (bit 3 the sign); what the gpt-oss checkpoints store.
FP4 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def mxfp4(w_out_in):
    """`[..., OUT, IN]` f32 as gpt-oss's `*_blocks` `[..., OUT, IN/32, 16]` (element 2j of a block
    in byte j's low nibble, 2j+1 in its high) and `*_scales` `[..., OUT, IN/32]` (e8m0, bias
    127): the smallest power of two putting the block's largest value within 6, each value to
    the nearest e2m1. Written here, independently of transformers, which then reads it back."""
    *pre, out, inp = w_out_in.shape
    g = w_out_in.reshape(*pre, out, inp // 32, 32).float()
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax.clamp_min(1e-30) / 6.0)), torch.zeros_like(amax))
    e = e.clamp(-127, 128)
    scaled = g / torch.pow(2.0, e)[..., None]
    mags = torch.tensor(FP4[:8])
    code = (scaled.abs()[..., None] - mags).abs().argmin(-1).to(torch.uint8)
    code = code | torch.where(scaled < 0, 8, 0).to(torch.uint8)
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)
    return blocks.contiguous(), (e + 127).to(torch.uint8).contiguous()


GPT_OSS_LAYERS = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def gpt_oss_build(seed):
    """A tiny GptOssForCausalLM: H 64, expert width 96 (whole MXFP4 blocks both ways, no square
    matrix), 4 layers alternating sliding (window 8) and full attention, 8 experts top-2, 4 heads
    over 2 KV heads of 16, gpt-oss's YaRN (theta 150000, factor 32, beta 32/1, 4096 original
    positions, no truncation: the ramp falls across this head's pairs 2..4). Biases, sinks and
    norms drawn away from their initial values; gate/up weights wide enough that the SwiGLU's
    clamp at 7 is reached; a decisive router; an untied head with margins for greedy tokens."""
    from transformers import GptOssConfig, GptOssForCausalLM
    torch.manual_seed(seed)
    cfg = GptOssConfig(
        vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=len(GPT_OSS_LAYERS),
        layer_types=GPT_OSS_LAYERS, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                         "original_max_position_embeddings": 4096},
        max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
        initializer_range=0.05, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )
    cfg._attn_implementation = "eager"
    model = GptOssForCausalLM(cfg).to(torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith("sinks"):
                p.normal_(0.0, 1.0)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.3)
        for layer in model.model.layers:
            layer.mlp.router.weight.normal_(0.0, 0.3)
            layer.mlp.experts.gate_up_proj.normal_(0.0, 0.6)
            layer.mlp.experts.down_proj.normal_(0.0, 0.08)
        model.model.embed_tokens.weight.normal_(0.0, 0.5)
        model.lm_head.weight.normal_(0.0, 0.15)
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("eager")
        except Exception:  # noqa: BLE001
            pass
    return model


def gpt_oss_expected(model, path, ids, dtype, extra):
    logits, tokens, margins = reference(model, ids)
    with torch.no_grad():
        logits_f32 = model.float()(input_ids=ids, use_cache=False).logits[0].float()
    rotary = model.model.rotary_emb
    json.dump({
        "tokens": ids[0].tolist(),
        "logits": logits.tolist(),
        "logits_f32_compute": logits_f32.tolist(),
        "native_gap_rel_l2": rel_l2(logits, logits_f32),
        "greedy": tokens,
        "margins": margins,
        # transformers' own YaRN frequencies and cosine scale for this head.
        "inv_freq": rotary.inv_freq.float().tolist(),
        "attention_scaling": float(rotary.attention_scaling),
        "dtype": str(dtype).replace("torch.", ""),
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
        **extra,
    }, open(os.path.join(path, "expected.json"), "w"))
    print(os.path.basename(path), "greedy", tokens, "min margin", min(margins), "native gap",
          rel_l2(logits, logits_f32))


def gpt_oss_write(name, model, dtype, hub_spelling):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model = model.to(dtype)
    ids = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    cfgp = os.path.join(path, "config.json")
    c = json.load(open(cfgp))
    if hub_spelling:
        # The hub's config.json: `rope_scaling` beside a top-level `rope_theta`,
        # `experts_per_token` beside `num_experts_per_tok`.
        rope = c.pop("rope_parameters")
        c["rope_theta"] = rope.pop("rope_theta")
        c["rope_scaling"] = rope
        c["experts_per_token"] = c["num_experts_per_tok"]
    json.dump(c, open(cfgp, "w"), indent=1)
    gpt_oss_expected(model.to(dtype), path, ids, dtype, {})


def gpt_oss_write_mxfp4(name, model):
    """The experts in MXFP4 as the hub ships them (`*_blocks`, `*_scales`, output by input),
    every other tensor f32; the reference is transformers reading that same file
    (`Mxfp4Config(dequantize=True)`, f32)."""
    from transformers import GptOssForCausalLM, Mxfp4Config
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    model.save_pretrained(path, safe_serialization=True)
    gen = os.path.join(path, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    st = os.path.join(path, "model.safetensors")
    tensors = {}
    for k, v in load_file(st).items():
        if k.endswith("mlp.experts.gate_up_proj") or k.endswith("mlp.experts.down_proj"):
            blocks, scales = mxfp4(v.float().transpose(1, 2))
            tensors[k + "_blocks"], tensors[k + "_scales"] = blocks, scales
        else:
            tensors[k] = v
    save_file(tensors, st, metadata={"format": "pt"})
    cfgp = os.path.join(path, "config.json")
    c = json.load(open(cfgp))
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(c, open(cfgp, "w"), indent=1)
    loaded = GptOssForCausalLM.from_pretrained(path, quantization_config=Mxfp4Config(dequantize=True),
                                               dtype=torch.float32).eval()
    loaded.config._attn_implementation = "eager"
    ids = torch.randint(3, model.config.vocab_size, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))
    # What quantization did to the model: transformers on the blocks against the f32 weights.
    with torch.no_grad():
        unquantized = model(input_ids=ids, use_cache=False).logits[0].float()
        quantized = loaded(input_ids=ids, use_cache=False).logits[0].float()
    gpt_oss_expected(loaded, path, ids, torch.float32,
                     {"quantization_rel_l2": rel_l2(quantized, unquantized)})


if __name__ == "__main__":
    import sys
    os.makedirs(OUT, exist_ok=True)
    families = sys.argv[1:] or ["gemma4", "qwen3", "gpt_oss"]
    if "gemma4" in families:
        write("tiny-gemma4-moe-f32", build(1), torch.float32, multimodal=False)
        write("tiny-gemma4-moe-bf16", build(2), torch.bfloat16, multimodal=True)
    if "qwen3" in families:
        qwen3_write("tiny-qwen3-moe-f32", qwen3_build(11, tied=False), torch.float32, hub_spelling=False)
        qwen3_write("tiny-qwen3-moe-bf16", qwen3_build(12, tied=True), torch.bfloat16, hub_spelling=True)
    if "gpt_oss" in families:
        gpt_oss_write("tiny-gpt-oss-f32", gpt_oss_build(21), torch.float32, hub_spelling=False)
        gpt_oss_write("tiny-gpt-oss-bf16", gpt_oss_build(28), torch.bfloat16, hub_spelling=True)
        gpt_oss_write_mxfp4("tiny-gpt-oss-mxfp4", gpt_oss_build(23))
