"""A synthetic gpt-oss-20b cut to N layers for llama.cpp beside `moek bench --geometry
gpt-oss-20b` (scripts/side-by-side): laid out as the hub ships it (experts as MXFP4
`*_blocks`/`*_scales`, everything else bf16), random weights, and a synthetic byte-level BPE
tokenizer of the real vocabulary size (llama-bench feeds token ids, so only the shapes matter).

    PEER_DIR/venv/bin/python scripts/peer/make_gpt_oss.py OUT_DIR [LAYERS]
    LLAMA_SRC=.../llama.cpp PEER_DIR/venv/bin/python scripts/peer/convert_gpt_oss.py OUT_DIR \
        --outtype bf16 --outfile PEER_DIR/gpt-oss-20b-2L-mxfp4.gguf

Run with the llama.cpp kit's venv (torch, safetensors, tokenizers); nothing here runs at test time."""
import json, os, sys, itertools
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, AddedToken, decoders, pre_tokenizers
from tokenizers.models import BPE

out = sys.argv[1]; layers = int(sys.argv[2]) if len(sys.argv) > 2 else 2
os.makedirs(out, exist_ok=True)
H, E, F, V, NH, KV, D = 2880, 32, 2880, 201088, 64, 8, 64
torch.manual_seed(0)
def bf(*shape, std=0.02): return (torch.randn(*shape) * std).to(torch.bfloat16)
t = {"model.embed_tokens.weight": bf(V, H), "lm_head.weight": bf(V, H), "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
g = torch.Generator().manual_seed(1)
for i in range(layers):
    p = f"model.layers.{i}."
    t[p+"input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    t[p+"post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    for n, o, inp in [("q_proj", NH*D, H), ("k_proj", KV*D, H), ("v_proj", KV*D, H), ("o_proj", H, NH*D)]:
        t[p+f"self_attn.{n}.weight"] = bf(o, inp); t[p+f"self_attn.{n}.bias"] = bf(o)
    t[p+"self_attn.sinks"] = bf(NH, std=1.0)
    t[p+"mlp.router.weight"] = bf(E, H); t[p+"mlp.router.bias"] = bf(E)
    for n, o, inp in [("gate_up_proj", 2*F, H), ("down_proj", H, F)]:
        t[p+f"mlp.experts.{n}_blocks"] = torch.randint(0, 256, (E, o, inp//32, 16), dtype=torch.uint8, generator=g)
        t[p+f"mlp.experts.{n}_scales"] = torch.randint(119, 124, (E, o, inp//32), dtype=torch.uint8, generator=g)
        t[p+f"mlp.experts.{n}_bias"] = bf(E, o)
save_file(dict(sorted(t.items())), os.path.join(out, "model.safetensors"), metadata={"format": "pt"})

# byte-level BPE: the 256 byte symbols, then 2-, 3-char strings over 64 of them, specials last.
bs = list(range(ord("!"), ord("~")+1)) + list(range(ord("¡"), ord("¬")+1)) + list(range(ord("®"), ord("ÿ")+1))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256+n); n += 1
byte_syms = [chr(c) for c in cs]
specials = ["<|endoftext|>", "<|return|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|call|>"]
vocab, merges = {}, []
for s in byte_syms: vocab[s] = len(vocab)
alpha = byte_syms[:64]; prev = alpha[:]
target = V - len(specials)
while len(vocab) < target:
    cur = []
    for left, c in itertools.product(prev, alpha):
        if len(vocab) >= target: break
        tok = left + c
        if tok in vocab: continue
        vocab[tok] = len(vocab); merges.append((left, c)); cur.append(tok)
    prev = cur
tok = Tokenizer(BPE(vocab=vocab, merges=merges))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
tok.save(os.path.join(out, "tokenizer.json"))
json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
           "model_max_length": 131072},
          open(os.path.join(out, "tokenizer_config.json"), "w"))
eos = V - len(specials) + 1; pad = V - len(specials)
cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": H, "intermediate_size": F,
       "num_hidden_layers": layers, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": D,
       "num_local_experts": E, "num_experts_per_tok": 4, "experts_per_token": 4, "vocab_size": V,
       "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * (layers // 2),
       "rope_theta": 150000.0, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
       "truncate": False, "original_max_position_embeddings": 4096}, "max_position_embeddings": 131072,
       "initial_context_length": 4096, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0, "tie_word_embeddings": False,
       "attention_bias": True, "hidden_act": "silu", "eos_token_id": eos, "pad_token_id": pad, "torch_dtype": "bfloat16",
       "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
       "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
print("wrote", out)
