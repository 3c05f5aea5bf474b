//! The model against Hugging Face transformers: tiny random Gemma-4 MoE checkpoints and what
//! transformers computed for them (`scripts/make_fixtures.py`, committed under tests/fixtures).
//!
//! Tolerances (relative L2 over every row's logits):
//! - f32 checkpoint: 1e-4. Both compute in f32; they differ by summation order only (measured
//!   ~1.5e-6).
//! - bf16 checkpoint: 6e-2. transformers rounds every activation to bf16 (each linear output,
//!   norm, residual add, RoPE); moek keeps the residual stream in f32 and rounds only what the
//!   kernels read. transformers' own bf16 and f32 computations of this checkpoint differ by 2.7e-2
//!   and moek is 2.8e-2 from the bf16 one; 6e-2 is about twice that.
//!
//! Greedy tokens must equal the reference's up to the first step whose top-2 margin is 0.05 or
//! less (after a near-tie the two continuations may legitimately part).

use moek_kernels::Element;
use moek_kernels::dispatch::Backend;
use moek_model::checkpoint::Checkpoint;
use moek_model::forward::{Cache, CausalLm, Head, Trace};
use moek_model::gemma4::config::Config;
use moek_model::gemma4::model::Model;
use moek_model::gemma4::weights;
use moek_model::generate::{Sampling, generate};
use std::path::PathBuf;

mod common;

struct Expected {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<u32>,
    margins: Vec<f32>,
}

fn fixture(name: &str) -> (PathBuf, Expected) {
    let (dir, v) = common::fixture(name);
    let e = Expected {
        tokens: common::ids(&v["tokens"]),
        logits: common::rows(&v["logits"]),
        greedy: common::ids(&v["greedy"]),
        margins: common::floats(&v["margins"]),
    };
    (dir, e)
}

fn rel_l2(got: &[Vec<f32>], want: &[Vec<f32>]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
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

/// Runs the fixture on `backend` and checks logits and greedy tokens; returns the dispatch records
/// of the full forward.
fn check<W: Element>(
    dir: &std::path::Path,
    e: &Expected,
    backend: Backend,
    tol: f64,
) -> Vec<Trace> {
    let cfg = Config::load(dir).unwrap();
    let ck = Checkpoint::open(dir).unwrap();
    let weights =
        weights::load::<W>(&ck, &cfg, moek_model::checkpoint::Residence::Mapped, |_| {}).unwrap();
    let model = Model::new(cfg, weights, backend.clone());
    let mut forward = vec![];
    let rows = model
        .forward(&e.tokens, &mut Cache::default(), Head::All, &mut forward)
        .unwrap();
    let mut trace = vec![];
    assert_eq!(rows.len(), e.tokens.len());
    let dev = rel_l2(&rows, &e.logits);
    assert!(
        dev <= tol,
        "{:?}: logits rel L2 {dev:.3e} > {tol:.0e}",
        backend.target
    );
    let last = model
        .forward(&e.tokens, &mut Cache::default(), Head::Last, &mut trace)
        .unwrap();
    assert_eq!(last.len(), 1, "generation's head computes one row");
    assert_eq!(last[0], rows[rows.len() - 1]);
    let sure = e.margins.iter().take_while(|&&m| m > 0.05).count();
    assert!(sure >= 2, "the fixture has greedy steps to compare");
    for chunk in [None, Some(1), Some(6)] {
        let got = generate(
            &model,
            &e.tokens,
            e.greedy.len(),
            chunk,
            &Sampling::greedy(),
            &[],
            &mut trace,
        )
        .unwrap();
        assert_eq!(
            got[..sure],
            e.greedy[..sure],
            "{:?} prefill chunk {chunk:?}",
            backend.target
        );
    }
    // The MoE ran through kernel dispatch on this backend, or fell back visibly.
    assert!(forward.iter().any(|t| t.what == "moe"
        && (t.choice.target == backend.target || t.fallback.is_some())));
    forward
}

#[test]
fn f32_checkpoint_matches_transformers_on_cpu() {
    let (dir, e) = fixture("tiny-gemma4-moe-f32");
    check::<f32>(&dir, &e, Backend::cpu(), 1e-4);
}

#[test]
fn bf16_multimodal_checkpoint_matches_transformers_on_cpu() {
    let (dir, e) = fixture("tiny-gemma4-moe-bf16");
    check::<half::bf16>(&dir, &e, Backend::cpu(), 6e-2);
}

#[test]
fn f32_checkpoint_matches_transformers_on_wgpu() {
    let (dir, e) = fixture("tiny-gemma4-moe-f32");
    check::<f32>(&dir, &e, Backend::wgpu(), 1e-4);
}

#[test]
fn bf16_multimodal_checkpoint_matches_transformers_on_wgpu() {
    let (dir, e) = fixture("tiny-gemma4-moe-bf16");
    check::<half::bf16>(&dir, &e, Backend::wgpu(), 6e-2);
}

#[test]
fn on_spyre_the_tiny_sizes_fall_back_to_the_cpu_visibly_and_still_match() {
    // Spyre programs are fixed at the 26B-A4B sizes: nothing serves the tiny model there, so every
    // kernel call runs on the CPU and says why.
    let (dir, e) = fixture("tiny-gemma4-moe-bf16");
    let trace = check::<half::bf16>(&dir, &e, Backend::spyre(), 6e-2);
    for t in &trace {
        let why = t.fallback.as_deref().expect("every call fell back");
        assert!(why.contains("is eligible on spyre"), "{why}");
        assert_eq!(t.choice.target, moek_kernels::ir::Target::Cpu);
    }
}
