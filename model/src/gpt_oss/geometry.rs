//! The gpt-oss-20b geometry with random weights, for `moek bench --geometry gpt-oss-20b`:
//! matrices uniform in +-1/sqrt(fan-in) from fixed seeds, the experts drawn straight into blocks
//! (MXFP4, as the checkpoints ship them, unless another format is named), biases and sinks
//! small, norms 1; built in memory, in huge pages, as the other benches'.

use super::config::{Config, LayerType, Moe, Yarn};
use super::weights::{DecoderLayer, Experts, Linear, Mlp, SelfAttn, Weights};
use crate::quantized::Stored;
use moek_kernels::Element;
use moek_kernels::ir::BlockFormat;
use moek_kernels::ir::quant::{BlockMxfp4, BlockQ4_0, BlockQ8_0};
use moek_kernels::testing::{uniform, uniform_blocks};
use std::borrow::Cow;

/// gpt-oss-20b's config.json with `layers` of its 24 layers (sliding first, alternating).
pub fn gpt_oss_20b(layers: usize) -> Config {
    Config {
        vocab_size: 201_088,
        hidden_size: 2880,
        num_attention_heads: 64,
        num_key_value_heads: 8,
        head_dim: 64,
        rms_norm_eps: 1e-5,
        rope: Yarn {
            rope_theta: 150_000.0,
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_max_position_embeddings: 4096,
            truncate: false,
            attention_factor: 0.1 * 32f64.ln() + 1.0,
        },
        sliding_window: 128,
        max_position_embeddings: 131_072,
        layers: (0..layers)
            .map(|i| match i % 2 {
                0 => LayerType::Sliding,
                _ => LayerType::Full,
            })
            .collect(),
        moe: Moe {
            num_local_experts: 32,
            num_experts_per_tok: 4,
            intermediate_size: 2880,
            swiglu_limit: 7.0,
            swiglu_alpha: 1.702,
        },
        eos_token_id: vec![200_002],
    }
}

/// Random weights for `cfg` in `W`, the expert banks in `experts`' blocks.
pub fn weights<W: Element>(cfg: &Config, experts: BlockFormat) -> Weights<'static, W> {
    let seed = std::cell::Cell::new(0x6770_746f_u64);
    let next = || {
        seed.set(seed.get() + 1);
        seed.get()
    };
    let matrix = |rows: usize, cols: usize| {
        Cow::Owned(uniform::<W>(
            rows * cols,
            next(),
            1.0 / (cols as f32).sqrt(),
        ))
    };
    let (h, v, d) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim);
    let (nh, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let (e, f) = (cfg.moe.num_local_experts, cfg.moe.intermediate_size);
    let small = |n: usize, seed: u64| uniform::<f32>(n, seed, 0.1);
    let bank = |rows: usize, cols: usize, seed: u64| {
        let (n, scale) = (rows * cols, 1.0 / (cols as f32).sqrt());
        match experts {
            BlockFormat::Mxfp4 => {
                Stored::Mxfp4(Cow::Owned(uniform_blocks::<W, BlockMxfp4>(n, seed, scale)))
            }
            BlockFormat::Q8_0 => {
                Stored::Q8_0(Cow::Owned(uniform_blocks::<W, BlockQ8_0>(n, seed, scale)))
            }
            BlockFormat::Q4_0 => {
                Stored::Q4_0(Cow::Owned(uniform_blocks::<W, BlockQ4_0>(n, seed, scale)))
            }
        }
    };
    let embed_tokens = matrix(v, h);
    let lm_head = Stored::Plain(matrix(v, h));
    let mut layers = vec![];
    for _ in &cfg.layers {
        let linear = |out: usize, inp: usize| Linear {
            weight: Stored::Plain(matrix(out, inp)),
            bias: small(out, 1),
        };
        let self_attn = SelfAttn {
            q_proj: linear(nh * d, h),
            k_proj: linear(kv * d, h),
            v_proj: linear(kv * d, h),
            o_proj: linear(h, nh * d),
            sinks: small(nh, 2),
        };
        let router = linear(e, h);
        layers.push(DecoderLayer {
            input_layernorm: vec![1.0; h],
            post_attention_layernorm: vec![1.0; h],
            self_attn,
            mlp: Mlp {
                router,
                experts: Experts {
                    gate_up_proj: bank(e * 2 * f, h, next()),
                    gate_up_proj_bias: small(e * 2 * f, 3),
                    down_proj: bank(e * h, f, next()),
                    down_proj_bias: small(e * h, 4),
                },
            },
        });
    }
    Weights {
        embed_tokens,
        lm_head,
        norm: vec![1.0; h],
        layers,
    }
}
