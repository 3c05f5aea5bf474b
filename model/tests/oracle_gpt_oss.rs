//! gpt-oss against Hugging Face transformers: tiny random `GptOssForCausalLM` checkpoints and what
//! transformers computed for them (`scripts/make_fixtures.py gpt_oss`, under tests/fixtures): one
//! f32 in transformers 5's config spelling, one bf16 in the hub's (`rope_scaling` beside
//! `rope_theta`), and one whose experts are MXFP4 as the hub ships them (`*_blocks`, `*_scales`),
//! its reference transformers' own reading of that file. Each has sliding and full layers with a
//! prompt longer than the window, attention sinks, biases everywhere and YaRN.
//!
//! Tolerances (relative L2 over every row's logits):
//! - f32 and MXFP4: 1e-4 against transformers' f32 logits (summation order only: the MXFP4
//!   weights dequantize exactly and the kernels do not round the activation beside them).
//! - bf16: against transformers' f32 compute of the same bf16 weights, within twice the gap
//!   between transformers' own native bf16 compute and that f32 compute (stored with the
//!   fixture).
//!
//! Greedy tokens must equal the reference's up to the first step whose top-2 margin is 0.05 or
//! less.

use moek_kernels::Element;
use moek_kernels::dispatch::Backend;
use moek_kernels::ir::quant::dequantize;
use moek_model::checkpoint::{Checkpoint, Residence};
use moek_model::forward::{Cache, CausalLm, Head, Trace};
use moek_model::generate::{Sampling, generate};
use moek_model::gpt_oss::config::Config;
use moek_model::gpt_oss::model::Model;
use moek_model::gpt_oss::weights;
use moek_model::quantized::{Quantize, Stored};
mod common;

use common::{fixture, floats, ids, rows};

fn rel_l2(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "non-finite logit");
            num += f64::from(a - b).powi(2);
            den += f64::from(*b).powi(2);
        }
    }
    (num / den).sqrt()
}

fn model<W: Element>(ck: &Checkpoint, cfg: Config, backend: Backend) -> Model<'_, W> {
    let w = weights::load_quantized::<W>(ck, &cfg, Residence::Mapped, None, |_| {}).unwrap();
    Model::new(cfg, w, backend)
}

/// Runs the fixture on `backend`: logits against `against` within `tol`, greedy tokens (one-shot
/// and chunked prefill), and the MoE through dispatch on the backend (or a visible fallback) with
/// the biased clamped SwiGLU. Returns the forward's records.
fn check<W: Element>(name: &str, backend: Backend, against: &str, tol: f64) -> Vec<Trace> {
    let (dir, e) = fixture(name);
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let model = model::<W>(&ck, cfg, backend.clone());
    let tokens = ids(&e["tokens"]);
    let mut forward = vec![];
    let got = model
        .forward(&tokens, &mut Cache::default(), Head::All, &mut forward)
        .unwrap();
    let dev = rel_l2(&got, &rows(&e[against]));
    eprintln!(
        "{name} on {:?}: rel L2 {dev:.3e} against `{against}` (bound {tol:.3e})",
        backend.target
    );
    assert!(
        dev <= tol,
        "{name} on {:?}: logits rel L2 {dev:.3e} > {tol:.3e}",
        backend.target
    );
    let sure = floats(&e["margins"])
        .iter()
        .take_while(|&&m| m > 0.05)
        .count();
    assert!(sure >= 2, "the fixture has greedy steps to compare");
    let greedy = ids(&e["greedy"]);
    for chunk in [None, Some(1), Some(6)] {
        let out = generate(
            &model,
            &tokens,
            greedy.len(),
            chunk,
            &Sampling::greedy(),
            &[],
            &mut vec![],
        )
        .unwrap();
        assert_eq!(
            out[..sure],
            greedy[..sure],
            "{:?} prefill chunk {chunk:?}",
            backend.target
        );
    }
    assert!(
        forward.iter().any(|t| t.what == "moe"
            && t.choice.kernel.contains("swiglu_biased")
            && (t.choice.target == backend.target || t.fallback.is_some())),
        "{forward:#?}"
    );
    forward
}

/// The bf16 bound: twice transformers' own native-bf16 gap.
fn bf16_bound(name: &str) -> f64 {
    2.0 * fixture(name).1["native_gap_rel_l2"].as_f64().unwrap()
}

#[test]
fn yarn_frequencies_are_transformers() {
    let (dir, e) = fixture("tiny-gpt-oss-f32");
    let cfg = Config::load(&dir).unwrap();
    let want = floats(&e["inv_freq"]);
    let got = cfg.rope.inv_freq(cfg.head_dim);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-6 * w.abs(), "pair {i}: {g} vs {w}");
    }
    let scaling = e["attention_scaling"].as_f64().unwrap();
    assert!((cfg.rope.attention_factor - scaling).abs() < 1e-12);
}

#[test]
fn f32_checkpoint_matches_transformers_on_cpu() {
    check::<f32>("tiny-gpt-oss-f32", Backend::cpu(), "logits", 1e-4);
}

#[test]
fn bf16_hub_spelled_checkpoint_matches_transformers_on_cpu() {
    let name = "tiny-gpt-oss-bf16";
    check::<half::bf16>(name, Backend::cpu(), "logits_f32_compute", bf16_bound(name));
}

#[test]
fn mxfp4_experts_read_in_the_hub_layout_match_transformers_on_cpu() {
    let trace = check::<f32>("tiny-gpt-oss-mxfp4", Backend::cpu(), "logits", 1e-4);
    assert!(
        trace
            .iter()
            .any(|t| t.what == "moe" && t.choice.kernel.contains("quantized")),
        "the MXFP4 banks ran the quantized variant"
    );
}

#[test]
fn f32_checkpoint_matches_transformers_on_wgpu() {
    check::<f32>("tiny-gpt-oss-f32", Backend::wgpu(), "logits", 1e-4);
}

#[test]
fn bf16_hub_spelled_checkpoint_matches_transformers_on_wgpu() {
    let name = "tiny-gpt-oss-bf16";
    check::<half::bf16>(
        name,
        Backend::wgpu(),
        "logits_f32_compute",
        bf16_bound(name),
    );
}

#[test]
fn mxfp4_experts_match_transformers_on_wgpu() {
    check::<f32>("tiny-gpt-oss-mxfp4", Backend::wgpu(), "logits", 1e-4);
}

#[test]
fn on_spyre_the_experts_fall_back_to_the_cpu_visibly_and_still_match() {
    let trace = check::<f32>("tiny-gpt-oss-f32", Backend::spyre(), "logits", 1e-4);
    for t in &trace {
        let why = t.fallback.as_deref().expect("every call fell back");
        assert!(why.contains("is eligible on spyre"), "{why}");
    }
}

/// Every row's logits of `tokens` on the CPU with the quantized weights `blocks`, asserting
/// their MoE ran a quantized variant, and with `values` (the same weights dequantized).
fn blocks_against_values<W: Element>(
    cfg: &Config,
    tokens: &[u32],
    blocks: weights::Weights<'_, W>,
    values: weights::Weights<'_, W>,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let run = |w| {
        let mut trace = vec![];
        let m = Model::new(cfg.clone(), w, Backend::cpu());
        let logits = m
            .forward(tokens, &mut Cache::default(), Head::All, &mut trace)
            .unwrap();
        (logits, trace)
    };
    let ((got, trace), (want, _)) = (run(blocks), run(values));
    assert!(
        trace
            .iter()
            .any(|t| t.what == "moe" && t.choice.kernel.contains("quantized")),
        "{trace:#?}"
    );
    (got, want)
}

/// `--quantize mxfp4` on the f32 checkpoint (its banks transposed, de-interleaved, then put in
/// blocks at load, attention's projections and the LM head) computes the model on those blocks' exact values: against the
/// same model with every quantized matrix replaced by its dequantized f32 copy, f32 sums apart;
/// and the quantization itself moved the logits (they are not the f32 checkpoint's).
#[test]
fn quantized_at_load_mxfp4_computes_on_the_blocks_exact_values() {
    let (dir, e) = fixture("tiny-gpt-oss-f32");
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let quant = Some(Quantize::whole(moek_kernels::ir::BlockFormat::Mxfp4));
    let load = || weights::load_quantized::<f32>(&ck, &cfg, Residence::Mapped, quant, |_| {});
    let (blocks, mut exact) = (load().unwrap(), load().unwrap());
    let dequantized = |m: &Stored<'_, f32>| match m {
        Stored::Mxfp4(b) => Stored::Plain(dequantize(b).into()),
        other => panic!("asked for MXFP4, got {}", other.dtype()),
    };
    exact.lm_head = dequantized(&exact.lm_head);
    for l in &mut exact.layers {
        let ex = &mut l.mlp.experts;
        (ex.gate_up_proj, ex.down_proj) =
            (dequantized(&ex.gate_up_proj), dequantized(&ex.down_proj));
        let a = &mut l.self_attn;
        for p in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj] {
            p.weight = dequantized(&p.weight);
        }
    }
    let tokens = ids(&e["tokens"]);
    let (got, want) = blocks_against_values(&cfg, &tokens, blocks, exact);
    let dev = rel_l2(&got, &want);
    let moved = rel_l2(&got, &rows(&e["logits"]));
    eprintln!("--quantize mxfp4: rel L2 {dev:.3e} to its exact values, {moved:.3e} to f32");
    assert!(
        dev <= 1e-4,
        "rel L2 {dev:.3e} against the blocks' exact values"
    );
    assert!(moved > 1e-3, "the banks were quantized ({moved:.3e})");
}

/// In a bf16 model, MXFP4 experts take the activation in bf16 and keep the gated activation in
/// bf16 between their two products, as its bf16 experts do (which is what lets both products
/// run on the bf16 tiles exactly): `--quantize-experts-only mxfp4` on the bf16 checkpoint
/// against the same model with the banks replaced by their dequantized bf16 copies (exact: an
/// MXFP4 value is a bf16 value), summation order apart. Both keep the same LM head.
#[test]
fn in_a_bf16_model_mxfp4_experts_compute_what_bf16_experts_of_their_values_do() {
    use half::bf16;
    use moek_model::quantized::Scope;
    let (dir, e) = fixture("tiny-gpt-oss-bf16");
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let quant = Some(Quantize {
        format: moek_kernels::ir::BlockFormat::Mxfp4,
        scope: Scope::Experts,
    });
    let load = || weights::load_quantized::<bf16>(&ck, &cfg, Residence::Mapped, quant, |_| {});
    let (mut blocks, mut exact) = (load().unwrap(), load().unwrap());
    let dequantized = |m: &Stored<'_, bf16>| match m {
        Stored::Mxfp4(b) => {
            let values: Vec<bf16> = dequantize(b).into_iter().map(bf16::from_f32).collect();
            Stored::Plain(values.into())
        }
        other => panic!("asked for MXFP4, got {}", other.dtype()),
    };
    blocks.lm_head = dequantized(&blocks.lm_head);
    exact.lm_head = dequantized(&exact.lm_head);
    for l in &mut exact.layers {
        let ex = &mut l.mlp.experts;
        (ex.gate_up_proj, ex.down_proj) =
            (dequantized(&ex.gate_up_proj), dequantized(&ex.down_proj));
    }
    let tokens = ids(&e["tokens"]);
    let (got, want) = blocks_against_values(&cfg, &tokens, blocks, exact);
    let dev = rel_l2(&got, &want);
    eprintln!("bf16 model, MXFP4 experts: rel L2 {dev:.3e} to bf16 experts of their values");
    assert!(dev <= 1e-4, "rel L2 {dev:.3e}");
}
