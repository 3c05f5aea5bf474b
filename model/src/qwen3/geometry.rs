//! The Qwen3-30B-A3B geometry with random weights, for `moek bench --geometry qwen3-30b-a3b`:
//! matrices uniform in +-1/sqrt(fan-in) from fixed seeds, norms 1, built in memory (in huge
//! pages, as the Gemma-4 bench's).

use super::config::{Config, Mlp, Moe};
use super::weights::{DecoderLayer, Feedforward, SelfAttn, SparseMoe, Weights};
use crate::ops::Rope;
use crate::quantized::Stored;
use moek_kernels::Element;
use moek_kernels::testing::uniform;
use std::borrow::Cow;

/// Qwen3-30B-A3B's config.json with `layers` of its 48 layers (all routed), untied head.
pub fn qwen3_30b_a3b(layers: usize) -> Config {
    Config {
        vocab_size: 151_936,
        hidden_size: 2048,
        intermediate_size: 6144,
        num_attention_heads: 32,
        num_key_value_heads: 4,
        head_dim: 128,
        rms_norm_eps: 1e-6,
        rope: Rope {
            theta: 1e6,
            pairs: 64,
            factor: 1.0,
        },
        max_position_embeddings: 40_960,
        layers: vec![Mlp::Sparse; layers],
        moe: Moe {
            num_experts: 128,
            num_experts_per_tok: 8,
            moe_intermediate_size: 768,
            norm_topk_prob: true,
        },
        tie_word_embeddings: false,
        eos_token_id: vec![151_645],
    }
}

/// Random weights for `cfg` (routed layers only: the bench geometry has no dense ones).
pub fn weights<W: Element>(cfg: &Config) -> Weights<'static, W> {
    let mut seed = 0x5157_454e_u64;
    let mut matrix = |rows: usize, cols: usize| {
        seed += 1;
        uniform::<W>(rows * cols, seed, 1.0 / (cols as f32).sqrt())
    };
    let (h, v, d) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim);
    let (nh, kv, e, f) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.moe.num_experts,
        cfg.moe.moe_intermediate_size,
    );
    let embed_tokens = Cow::Owned(matrix(v, h));
    let lm_head = (!cfg.tie_word_embeddings).then(|| Stored::Plain(Cow::Owned(matrix(v, h))));
    let layers = cfg
        .layers
        .iter()
        .map(|kind| {
            assert_eq!(
                *kind,
                Mlp::Sparse,
                "the bench geometry's layers are all routed"
            );
            DecoderLayer {
                input_layernorm: vec![1.0; h],
                post_attention_layernorm: vec![1.0; h],
                self_attn: SelfAttn {
                    q_proj: Stored::Plain(Cow::Owned(matrix(nh * d, h))),
                    k_proj: Stored::Plain(Cow::Owned(matrix(kv * d, h))),
                    v_proj: Stored::Plain(Cow::Owned(matrix(kv * d, h))),
                    o_proj: Stored::Plain(Cow::Owned(matrix(h, nh * d))),
                    q_norm: vec![1.0; d],
                    k_norm: vec![1.0; d],
                },
                mlp: Feedforward::Sparse(SparseMoe {
                    gate: Cow::Owned(matrix(e, h)),
                    gate_up_proj: Stored::Plain(Cow::Owned(matrix(e * 2 * f, h))),
                    down_proj: Stored::Plain(Cow::Owned(matrix(e * h, f))),
                }),
            }
        })
        .collect();
    Weights {
        embed_tokens,
        lm_head,
        norm: vec![1.0; h],
        layers,
    }
}
