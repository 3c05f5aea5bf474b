//! A built-in tiny Gemma-4 MoE (deterministic weights made in code): both attention kinds, a
//! window shorter than the test sequences, non-trivial norms, router scales and layer scalars.
//! `moek check` runs it through every backend; tests use it without a checkpoint.

use crate::config::{Attention, Config, Layer, Moe, Rope};
use crate::weights::{LayerWeights, MoeWeights, Weights};
use moek_kernels::Elem;
use moek_kernels::testing::uniform;
use std::borrow::Cow;

pub fn config() -> Config {
    let sliding = Layer {
        attention: Attention::Sliding,
        head_dim: 16,
        kv_heads: 2,
        k_eq_v: false,
        rope: Rope {
            theta: 1e4,
            pairs: 8,
            factor: 1.0,
        },
    };
    let full = Layer {
        attention: Attention::Full,
        head_dim: 32,
        kv_heads: 1,
        k_eq_v: true,
        rope: Rope {
            theta: 1e6,
            pairs: 4,
            factor: 1.0,
        },
    };
    Config {
        vocab: 96,
        hidden: 64,
        intermediate: 48,
        heads: 4,
        eps: 1e-6,
        window: 4,
        softcap: Some(30.0),
        layers: vec![sliding.clone(), full, sliding],
        moe: Some(Moe {
            experts: 8,
            top_k: 2,
            intermediate: 32,
        }),
        eos: vec![1],
    }
}

/// Weights for any `cfg` in `W`, drawn from fixed seeds (the tiny model's, and the real-geometry
/// layers `moek bench --geometry 26b-a4b` builds in memory).
pub fn weights<W: Elem>(cfg: &Config) -> Weights<'static, W> {
    let (h, v, f) = (cfg.hidden, cfg.vocab, cfg.intermediate);
    let mut seed = 1000u64;
    let mut mat = |n: usize, fan_in: usize| -> Cow<'static, [W]> {
        seed += 1;
        Cow::Owned(uniform(n, seed, 1.0 / (fan_in as f32).sqrt()))
    };
    let mut norm_seed = 5000u64;
    let mut norm = |n: usize| -> Vec<f32> {
        norm_seed += 1;
        uniform::<f32>(n, norm_seed, 0.3)
            .into_iter()
            .map(|x| 1.0 + x)
            .collect()
    };
    // Narrow enough that greedy tokens vary (a wide tied embedding makes one token win).
    let embed = mat(v * h, 44);
    let final_norm = norm(h);
    let layers = cfg
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let (d, kv, nh) = (l.head_dim, l.kv_heads, cfg.heads);
            let moe = cfg.moe.map(|m| MoeWeights {
                pre_norm_2: norm(h),
                post_norm_1: norm(h),
                post_norm_2: norm(h),
                router: mat(m.experts * h, h),
                router_scale: norm(h),
                per_expert_scale: norm(m.experts),
                gate_up: mat(m.experts * 2 * m.intermediate * h, h),
                down: mat(m.experts * h * m.intermediate, m.intermediate),
            });
            LayerWeights {
                input_norm: norm(h),
                post_attn_norm: norm(h),
                pre_ffn_norm: norm(h),
                post_ffn_norm: norm(h),
                q: mat(nh * d * h, h),
                k: mat(kv * d * h, h),
                v: (!l.k_eq_v).then(|| mat(kv * d * h, h)),
                o: mat(h * nh * d, nh * d),
                q_norm: norm(d),
                k_norm: norm(d),
                gate: mat(f * h, h),
                up: mat(f * h, h),
                down: mat(h * f, f),
                moe,
                layer_scalar: 0.6 + 0.1 * i as f32,
            }
        })
        .collect();
    Weights {
        embed,
        lm_head: None,
        final_norm,
        layers,
    }
}

/// The 26B-A4B geometry with `layers` layers alternating sliding and full (sliding first).
pub fn gemma4_26b(layers: usize) -> Config {
    let sliding = Layer {
        attention: Attention::Sliding,
        head_dim: 256,
        kv_heads: 8,
        k_eq_v: false,
        rope: Rope {
            theta: 1e4,
            pairs: 128,
            factor: 1.0,
        },
    };
    let full = Layer {
        attention: Attention::Full,
        head_dim: 512,
        kv_heads: 2,
        k_eq_v: true,
        rope: Rope {
            theta: 1e6,
            pairs: 64,
            factor: 1.0,
        },
    };
    Config {
        vocab: 262_144,
        hidden: 2816,
        intermediate: 2112,
        heads: 16,
        eps: 1e-6,
        window: 1024,
        softcap: Some(30.0),
        layers: (0..layers)
            .map(|i| {
                if i % 2 == 0 {
                    sliding.clone()
                } else {
                    full.clone()
                }
            })
            .collect(),
        moe: Some(Moe {
            experts: 128,
            top_k: 8,
            intermediate: 704,
        }),
        eos: vec![1],
    }
}
