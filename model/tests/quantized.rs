//! Quantized weights against transformers' f32 logits: the f32 fixture with its expert banks
//! and embedding quantized, or the whole model (attention's projections and the dense MLPs too),
//! at load or by `moek quantize`, and the checkpoint format's refusals.
//!
//! Bounds on the logits' relative L2 (docs/numerics.md, "Quantized weights", derives them): six
//! stages read quantized weights (the input embedding, four MoE blocks, the LM head), each moving
//! its output by the per-product error measured on this fixture (1.4% for Q8_0's MoE block, 15%
//! for Q4_0's); added coherently through all six that is 8% and 90%. The whole model adds four
//! stages (each layer's attention; this fixture's dense MLP, 48 wide, is not whole blocks and
//! stays f32): ten, 14% for Q8_0.
//! - Q8_0: 0.17 for the experts, 0.28 for the whole model: twice those.
//! - Q4_0: 0.8, the cap: above it logits carry no information (a swapped nibble order gives
//!   about 1.4).
//!
//! Greedy tokens must equal the reference's while its top-2 margin is more than twice the
//! largest logit error the quantized model shows on the prompt's rows.

use moek_kernels::Backend;
use moek_kernels::ir::BlockFormat;
use moek_model::checkpoint::{Checkpoint, Residence};
use moek_model::forward::{Cache, CausalLm, Head};
use moek_model::gemma4::config::Config;
use moek_model::gemma4::model::Model;
use moek_model::gemma4::weights;
use moek_model::generate::{Sampling, generate};
use moek_model::quantized::{DenseMlp, Quantize, Scope, Stored};
use std::path::{Path, PathBuf};

mod common;

/// The bound on the logits' relative L2 against transformers' f32 logits (module doc).
fn bound(quant: Quantize) -> f64 {
    match (quant.format, quant.scope) {
        (BlockFormat::Q8_0, Scope::Experts) => 0.17,
        (BlockFormat::Q8_0, Scope::Whole) => 0.28,
        _ => 0.8,
    }
}

fn fixture() -> PathBuf {
    common::fixture("tiny-gemma4-moe-f32").0
}

struct Expected {
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
    /// Greedy continuations with the reference's top-2 margin at each step: of `tokens`, and of
    /// the fixture's text prompt.
    streams: Vec<Stream>,
}

struct Stream {
    tokens: Vec<u32>,
    greedy: Vec<u32>,
    margins: Vec<f32>,
}

fn expected() -> Expected {
    let (_, v) = common::fixture("tiny-gemma4-moe-f32");
    let stream = |prefix: &str, tokens: &str| Stream {
        tokens: common::ids(&v[tokens]),
        greedy: common::ids(&v[format!("{prefix}greedy")]),
        margins: common::floats(&v[format!("{prefix}margins")]),
    };
    Expected {
        tokens: common::ids(&v["tokens"]),
        logits: common::rows(&v["logits"]),
        streams: vec![stream("", "tokens"), stream("prompt_", "prompt_ids")],
    }
}

/// (relative L2, largest absolute error) of `got` against `want`; NaN never passes.
fn deviation(got: &[Vec<f32>], want: &[Vec<f32>]) -> (f64, f64) {
    let (mut num, mut den, mut max) = (0f64, 0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            assert!(a.is_finite(), "non-finite logit");
            let e = f64::from(a - b);
            num += e * e;
            den += f64::from(*b).powi(2);
            max = max.max(e.abs());
        }
    }
    ((num / den).sqrt(), max)
}

fn model_of(dir: &Path, quantize: Option<Quantize>) -> Model<'static, f32> {
    model_on(dir, quantize, Backend::cpu())
}

fn model_on(dir: &Path, quantize: Option<Quantize>, backend: Backend) -> Model<'static, f32> {
    let cfg = Config::load(dir).unwrap();
    let ck: &'static Checkpoint = Box::leak(Box::new(Checkpoint::open(dir).unwrap()));
    let w = weights::load_quantized::<f32>(ck, &cfg, Residence::Mapped, quantize, |_| {}).unwrap();
    Model::new(cfg, w, backend)
}

fn all_logits(model: &impl CausalLm, tokens: &[u32]) -> Vec<Vec<f32>> {
    model
        .forward(tokens, &mut Cache::default(), Head::All, &mut vec![])
        .unwrap()
}

fn check(quant: Quantize) -> usize {
    check_on(quant, Backend::cpu())
}

fn check_on(quant: Quantize, backend: Backend) -> usize {
    let bound = bound(quant);
    let e = expected();
    let target = backend.target;
    let model = model_on(&fixture(), Some(quant), backend);
    let layer = &model.weights.layers[0];
    let bank = &layer.moe.as_ref().unwrap().experts.gate_up_proj;
    assert!(
        matches!(bank, Stored::Q8_0(_) | Stored::Q4_0(_)),
        "--quantize quantizes the expert banks"
    );
    let whole = quant.scope == Scope::Whole;
    assert_eq!(
        matches!(layer.self_attn.q_proj, Stored::Q8_0(_) | Stored::Q4_0(_)),
        whole,
        "attention is quantized with the whole model only"
    );
    // This fixture's dense MLP is 48 wide, not whole blocks: it stays in f32 (the Qwen3 test
    // below runs a dense MLP in blocks).
    let whole_rows = model.cfg.intermediate_size.is_multiple_of(32);
    assert_eq!(
        matches!(layer.mlp, DenseMlp::Blocks { .. }),
        whole && whole_rows
    );
    let (rel, max) = deviation(&all_logits(&model, &e.tokens), &e.logits);
    let (format, scope) = (quant.format, quant.scope);
    eprintln!(
        "{format} ({scope:?}) on tiny-gemma4-moe-f32 ({target}): logits rel L2 {rel:.3e} (bound {bound:.0e}), max abs {max:.3e}"
    );
    assert!(
        rel <= bound,
        "{quant:?}: logits rel L2 {rel:.3e} > {bound:.0e}"
    );
    let plain = model_of(&fixture(), None);
    e.streams
        .iter()
        .map(|st| certain_steps(quant, &model, &plain, st))
        .sum()
}

/// Checks `model`'s greedy tokens on `st` while they are certain, and says how many were.
///
/// Per greedy step, the quantized model's largest logit error on that step's row, against the
/// plain f32 model (which matches transformers to 1e-6, tests/oracle.rs) on the reference's
/// own token stream: a token can change only where the margin is at most twice it.
fn certain_steps(
    quant: Quantize,
    model: &impl CausalLm,
    plain: &impl CausalLm,
    st: &Stream,
) -> usize {
    let stream = [&st.tokens[..], &st.greedy[..st.greedy.len() - 1]].concat();
    let (q, f) = (all_logits(model, &stream), all_logits(plain, &stream));
    let first = st.tokens.len() - 1;
    let sure = (0..st.greedy.len())
        .take_while(|&k| {
            let err = deviation(&q[first + k..=first + k], &f[first + k..=first + k]).1;
            f64::from(st.margins[k]) > 2.0 * err
        })
        .count();
    let got = generate(
        model,
        &st.tokens,
        st.greedy.len(),
        None,
        &Sampling::greedy(),
        &[],
        &mut vec![],
    )
    .unwrap();
    eprintln!(
        "{quant:?}: {sure} of {} greedy steps have a margin over twice their logit error",
        st.greedy.len()
    );
    assert_eq!(got[..sure], st.greedy[..sure], "{quant:?}");
    sure
}

/// `format` over the experts, embedding and head only.
fn experts(format: BlockFormat) -> Quantize {
    Quantize {
        format,
        scope: Scope::Experts,
    }
}

#[test]
fn q8_0_logits_stay_within_the_formats_bound() {
    for quant in [
        experts(BlockFormat::Q8_0),
        Quantize::whole(BlockFormat::Q8_0),
    ] {
        let compared = check(quant);
        assert!(
            compared >= 1,
            "Q8_0 keeps at least the first greedy step certain"
        );
    }
}

#[test]
fn q4_0_logits_stay_within_the_formats_bound() {
    check(experts(BlockFormat::Q4_0));
    check(Quantize::whole(BlockFormat::Q4_0));
}

/// The wgpu variants (blocks dequantized exactly, f32 activations never rounded) carry the
/// weights' own error only, so the same bounds hold; each MoE block and the head must have run
/// a quantized variant on wgpu, not fallen back.
#[test]
fn quantized_logits_on_wgpu_stay_within_the_formats_bounds() {
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
        let quant = Quantize::whole(format);
        check_on(quant, Backend::wgpu());
        let model = model_on(&fixture(), Some(quant), Backend::wgpu());
        let mut trace = vec![];
        model
            .forward(&[2, 5, 7], &mut Cache::default(), Head::Last, &mut trace)
            .unwrap();
        let quantized: Vec<_> = trace
            .iter()
            .filter(|t| t.what == "moe" || t.what == "lm_head")
            .collect();
        assert!(
            !quantized.is_empty(),
            "{quant:?}: no MoE or head in the trace"
        );
        for t in quantized {
            assert!(
                t.fallback.is_none()
                    && t.choice.target == moek_kernels::ir::Target::Wgpu
                    && t.choice.dtype.is_quantized(),
                "{quant:?}: {t:?}"
            );
        }
    }
}

/// Qwen3-MoE quantized at load against transformers' f32 logits on its f32 fixture: its
/// gathered banks and untied head, and for the whole model attention and the dense layer's MLP
/// (96 wide: three blocks) through the one-expert spec. Three MoE layers and the head read
/// quantized weights, so the experts-only bound is twice four stages' per-stage error (1.4%,
/// as Gemma's fixture of the same width): 0.11; the whole model adds five (each layer's
/// attention, the dense layer's MLP): nine stages, 0.25.
#[test]
fn qwen3_quantized_at_load_stays_within_the_formats_bound() {
    use moek_model::qwen3;
    let (dir, v) = common::fixture("tiny-qwen3-moe-f32");
    let (tokens, want) = (common::ids(&v["tokens"]), common::rows(&v["logits"]));
    let cfg = qwen3::config::Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    for (quant, bound) in [
        (experts(BlockFormat::Q8_0), 0.11),
        (Quantize::whole(BlockFormat::Q8_0), 0.25),
    ] {
        let w = qwen3::weights::load_quantized::<f32>(
            &ck,
            &cfg,
            Residence::Mapped,
            Some(quant),
            |_| {},
        )
        .unwrap();
        assert!(
            matches!(w.head(), Stored::Q8_0(_)),
            "the untied head is quantized"
        );
        let dense = w.layers.iter().find_map(|l| match &l.mlp {
            qwen3::weights::Feedforward::Dense(m) => Some(m),
            _ => None,
        });
        let whole = quant.scope == Scope::Whole;
        assert_eq!(
            matches!(dense, Some(DenseMlp::Blocks { .. })),
            whole,
            "the dense layer's MLP is in blocks with the whole model only"
        );
        let model = qwen3::model::Model::new(cfg.clone(), w, moek_kernels::Backend::cpu());
        // The dense MLP runs in its blocks: one row (decode) on the row products, a prompt of
        // several on GEMMs over the blocks (docs/quantization.md).
        for (n, prefill) in [(1, false), (tokens.len(), true)] {
            let mut trace = vec![];
            model
                .forward(&tokens[..n], &mut Cache::default(), Head::Last, &mut trace)
                .unwrap();
            let dense = trace.iter().find(|t| t.what == "dense_mlp").unwrap();
            assert_eq!(dense.choice.dtype.is_quantized(), whole, "{dense:?}");
            let gemm = dense.choice.kernel == "dense_mlp_quantized_prefill_silu";
            assert_eq!(
                gemm,
                whole && prefill,
                "{n} tokens: {}",
                dense.choice.kernel
            );
        }
        let got = all_logits(&model, &tokens);
        let (rel, max) = deviation(&got, &want);
        eprintln!(
            "Q8 ({:?}) on tiny-qwen3-moe-f32: logits rel L2 {rel:.3e} (bound {bound:.1e}), max abs {max:.3e}",
            quant.scope
        );
        assert!(rel <= bound, "logits rel L2 {rel:.3e}");
    }
}

/// A forced variant that serves the model's dtype but not its quantized banks fails before the
/// forward changes anything: no KV cache is written (it once failed inside layer 0's MoE, after
/// attention had appended to the cache).
#[test]
fn a_forced_plain_variant_over_quantized_banks_fails_before_the_cache_changes() {
    let options = moek_model::Options {
        quantize: Some(Quantize::whole(BlockFormat::Q8_0)),
        variant: Some("general_expert_ffn_gather".into()),
        weights: Some(Residence::Mapped),
        ..moek_model::Options::default()
    };
    let model = moek_model::open(&fixture(), &options).expect("the fixture opens");
    let (mut cache, mut trace) = (Cache::default(), vec![]);
    let err = model
        .forward(&[2, 17, 5], &mut cache, Head::Last, &mut trace)
        .expect_err("the variant has no q8_0 variant");
    let msg = err.to_string();
    assert!(msg.contains("general_expert_ffn_gather"), "{msg}");
    assert!(msg.contains("q8_0"), "{msg}");
    assert_eq!(cache.len, 0);
    assert!(
        cache
            .layers
            .iter()
            .all(|l| l.pos.is_empty() && l.k.is_empty()),
        "the KV cache was written before the refusal"
    );
    assert!(trace.is_empty(), "nothing ran: {trace:?}");
}
