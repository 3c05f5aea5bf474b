//! The optimised built-in variants inside the model: one MoE layer at the real 26B-A4B size (128
//! experts, top-8, H 2816, F 704, bf16, random weights), its output through the variants
//! dispatch picks on the CPU (blocked decode; grouped prefill) against the same layer forced onto
//! the general gather variant. Each is within the bf16 tolerance of the f64 reference, so they may
//! differ by twice it.

use moek_kernels::dispatch::Backend;
use moek_kernels::testing::uniform;
use moek_model::forward::Kernels;
use moek_model::gemma4::model::Model;
use moek_model::gemma4::tiny;
use moek_model::gemma4::weights::{DecoderLayer, Experts, MoeBlock, Router, SelfAttn, Weights};
use moek_model::quantized::{DenseMlp, Stored};
use std::borrow::Cow;

/// A one-layer model at the 26B-A4B MoE geometry whose expert banks borrow `mw`'s (only the MoE
/// block runs, so attention and dense weights are left empty).
fn model<'w>(
    variant: Option<&str>,
    mw: &'w MoeBlock<'static, half::bf16>,
) -> Model<'w, half::bf16> {
    let cfg = tiny::gemma4_26b(1);
    let none = || Cow::Owned(vec![]);
    let weights = Weights {
        embed_tokens: Stored::Plain(none()),
        lm_head: None,
        norm: vec![],
        layers: vec![DecoderLayer {
            input_layernorm: vec![],
            post_attention_layernorm: vec![],
            pre_feedforward_layernorm: vec![],
            post_feedforward_layernorm: vec![],
            self_attn: SelfAttn {
                q_proj: Stored::Plain(none()),
                k_proj: Stored::Plain(none()),
                v_proj: None,
                o_proj: Stored::Plain(none()),
                q_norm: vec![],
                k_norm: vec![],
            },
            mlp: DenseMlp::Plain {
                gate_proj: none(),
                up_proj: none(),
                down_proj: none(),
            },
            moe: Some(MoeBlock {
                pre_feedforward_layernorm_2: mw.pre_feedforward_layernorm_2.clone(),
                post_feedforward_layernorm_1: mw.post_feedforward_layernorm_1.clone(),
                post_feedforward_layernorm_2: mw.post_feedforward_layernorm_2.clone(),
                router: Router {
                    proj: Cow::Borrowed(&mw.router.proj),
                    scale: mw.router.scale.clone(),
                    per_expert_scale: mw.router.per_expert_scale.clone(),
                },
                experts: Experts {
                    gate_up_proj: mw.experts.gate_up_proj.borrowed(),
                    down_proj: mw.experts.down_proj.borrowed(),
                },
            }),
            layer_scalar: 1.0,
        }],
    };
    Model {
        cfg,
        weights,
        kernels: Kernels::new(Backend::cpu()).with_variant(variant.map(str::to_string)),
    }
}

fn moe_weights() -> MoeBlock<'static, half::bf16> {
    let (h, e, f) = (2816, 128, 704);
    let norm = |seed| -> Vec<f32> {
        uniform::<f32>(h, seed, 0.2)
            .iter()
            .map(|x| 1.0 + x)
            .collect()
    };
    MoeBlock {
        pre_feedforward_layernorm_2: norm(1),
        post_feedforward_layernorm_1: norm(2),
        post_feedforward_layernorm_2: norm(3),
        router: Router {
            proj: Cow::Owned(uniform(e * h, 4, 0.5)),
            scale: norm(5),
            per_expert_scale: uniform::<f32>(e, 6, 0.2).iter().map(|x| 1.0 + x).collect(),
        },
        experts: Experts {
            gate_up_proj: Stored::Plain(Cow::Owned(uniform(
                e * 2 * f * h,
                7,
                1.0 / (h as f32).sqrt(),
            ))),
            down_proj: Stored::Plain(Cow::Owned(uniform(e * h * f, 8, 1.0 / (f as f32).sqrt()))),
        },
    }
}

#[test]
fn the_optimised_variants_match_the_general_variant_in_the_model() {
    let mw = moe_weights();
    let fast = model(None, &mw);
    let general = model(Some("general_expert_ffn_gather"), &mw);
    let tol = moek_ir::tolerance::tolerance(moek_kernels::ir::DType::Bf16);
    for (tokens, expected) in [
        (1, "decode_expert_ffn_blocked"),
        (64, "prefill_expert_ffn_grouped"),
    ] {
        let h: Vec<f32> = uniform(tokens * 2816, 10 + tokens as u64, 1.0);
        let mut trace = vec![];
        let a = fast.moe_block(0, &h, &mut trace).unwrap();
        assert_eq!(trace[0].choice.kernel, expected, "{}", trace[0].choice);
        let mut trace = vec![];
        let b = general.moe_block(0, &h, &mut trace).unwrap();
        assert_eq!(trace[0].choice.kernel, "general_expert_ffn_gather");
        let want: Vec<f64> = b.iter().map(|&v| f64::from(v)).collect();
        let dev = moek_ir::tolerance::Deviation::measure(&a, &want);
        assert!(
            dev.rel_l2 <= 2.0 * tol.rel_l2 && dev.max_abs <= 2.0 * tol.max_abs,
            "{tokens} tokens: {dev}"
        );
        assert!(a.iter().all(|v| v.is_finite()));
    }
}
