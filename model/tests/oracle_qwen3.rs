//! Qwen3-MoE against Hugging Face transformers: tiny random `Qwen3MoeForCausalLM` checkpoints and
//! what transformers computed for them (`scripts/make_fixtures.py qwen3`, under tests/fixtures):
//! one f32 with an untied head in transformers 5's config spelling, one bf16 with a tied head in
//! the hub's. Both have a dense layer (`mlp_only_layers`) and per-expert tensors.
//!
//! Tolerances (relative L2 over every row's logits):
//! - f32: 1e-4 against transformers' f32 logits (summation order only).
//! - bf16: against transformers' f32 compute of the same bf16 weights, within twice the gap
//!   between transformers' own native bf16 compute and that f32 compute (stored with the
//!   fixture). moek rounds only what its kernels read, so it should sit nearer the f32 compute
//!   than transformers' bf16 run does; twice the gap leaves room for its rounding elsewhere.
//!
//! Greedy tokens must equal the reference's up to the first step whose top-2 margin is 0.05 or
//! less.

use moek_kernels::Element;
use moek_kernels::dispatch::Backend;
use moek_model::checkpoint::{Checkpoint, Residence};
use moek_model::forward::{Cache, CausalLm, Head, Trace};
use moek_model::generate::{Sampling, generate};
use moek_model::qwen3::config::Config;
use moek_model::qwen3::model::Model;
use moek_model::qwen3::weights;
mod common;

use common::{fixture, ids, rows};

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

/// Runs the fixture on `backend`: logits against `against` within `tol`, greedy tokens, and
/// the MoE through dispatch on the backend (or a visible fallback). Returns the forward's records.
fn check<W: Element>(name: &str, backend: Backend, against: &str, tol: f64) -> Vec<Trace> {
    let (dir, e) = fixture(name);
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let w = weights::load::<W>(&ck, &cfg, Residence::Mapped, |_| {}).unwrap();
    let model = Model::new(cfg, w, backend.clone());
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
    let margins: Vec<f64> = e["margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    let sure = margins.iter().take_while(|&&m| m > 0.05).count();
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
    assert!(forward.iter().any(|t| t.what == "moe"
        && t.choice.kernel.contains("silu")
        && (t.choice.target == backend.target || t.fallback.is_some())));
    assert!(
        forward.iter().any(|t| t.what == "dense_mlp"),
        "the dense layer ran its MLP"
    );
    forward
}

/// The bf16 bound: twice transformers' own native-bf16 gap.
fn bf16_bound(name: &str) -> f64 {
    2.0 * fixture(name).1["native_gap_rel_l2"].as_f64().unwrap()
}

#[test]
fn f32_checkpoint_matches_transformers_on_cpu() {
    check::<f32>("tiny-qwen3-moe-f32", Backend::cpu(), "logits", 1e-4);
}

#[test]
fn bf16_hub_spelled_checkpoint_matches_transformers_on_cpu() {
    let name = "tiny-qwen3-moe-bf16";
    check::<half::bf16>(name, Backend::cpu(), "logits_f32_compute", bf16_bound(name));
}

#[test]
fn f32_checkpoint_matches_transformers_on_wgpu() {
    check::<f32>("tiny-qwen3-moe-f32", Backend::wgpu(), "logits", 1e-4);
}

#[test]
fn bf16_hub_spelled_checkpoint_matches_transformers_on_wgpu() {
    let name = "tiny-qwen3-moe-bf16";
    check::<half::bf16>(
        name,
        Backend::wgpu(),
        "logits_f32_compute",
        bf16_bound(name),
    );
}

#[test]
fn on_spyre_the_tiny_sizes_fall_back_to_the_cpu_visibly_and_still_match() {
    let name = "tiny-qwen3-moe-bf16";
    let trace = check::<half::bf16>(
        name,
        Backend::spyre(),
        "logits_f32_compute",
        bf16_bound(name),
    );
    for t in &trace {
        let why = t.fallback.as_deref().expect("every call fell back");
        assert!(why.contains("is eligible on spyre"), "{why}");
    }
}
