//! `moek bench --geometry 26b-a4b|qwen3-30b-a3b --layers N`: the whole model at a real layer geometry with
//! random bf16 weights built in memory (or written to a file and loaded back: `--from-file`):
//! prefill of a 512-token prompt and decode steps, tokens/s, the MoE block's share, bytes read
//! per decode step against the read bandwidth probed before each step, and peak memory against
//! the weights' bytes.

use super::{BenchArgs, Geometry};
use crate::commands::CommandError;
use crate::commands::figures::{
    Format, median, median_ratio, prefill_roof, print_json, sample_probe,
};
use half::bf16;
use moek_kernels::ir::BlockFormat;
use moek_model::checkpoint::{Checkpoint, LoadError};
use moek_model::forward::{CausalLm, Head, Kernels, Trace};
use moek_model::gemma4::model::Model;
use moek_model::quantized::{Quantize, Scope};
use std::process::ExitCode;
use std::time::Instant;

/// What one run measures; the field names are the ones scripts check. Every time is a median of
/// repeated runs; every ratio is taken against a floor measured or computed in the same run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelFigures {
    pub geometry: String,
    pub layers: usize,
    pub backend: String,
    /// Where the weights live: `memory` (built in huge pages), or the `--from-file` residence
    /// (`mapped`, `huge-pages`).
    pub weights: String,
    /// The MoE variant `--variant` forced, if any (else dispatch chose per call).
    pub variant: Option<String>,
    /// The block format of the quantized matrices (`--dtype`), if any; every other matrix is
    /// bf16.
    pub quantized: Option<String>,
    /// Which matrices are in `quantized`'s blocks: `whole` (every one but the router) or
    /// `experts` (the expert banks and the embedding).
    pub quantized_scope: Option<&'static str>,
    pub isa: &'static str,
    pub threads: usize,
    pub prompt_tokens: usize,
    /// Prefills timed (the median is reported) and decode steps timed.
    pub prefill_runs: usize,
    pub decode_steps: usize,
    pub prefill_tokens_per_s: f64,
    /// FLOPs of the prefill (matrix products, attention, LM head row) over its median time.
    pub prefill_gflops: f64,
    /// The ISA's peak bf16 GEMM rate on all threads, timed on the instruction the bf16 GEMM
    /// runs on (`tdpbf16ps`, `vdpbf16ps` or FMAs: `moek_cpu::peak`) before each timed prefill
    /// (a VM's core can lend its units to a neighbour for seconds): the median of those.
    pub isa_peak_gflops: f64,
    /// The f32 FMA peak beside it.
    pub f32_peak_gflops: f64,
    /// Where the quantized matrices' GEMM multiplies in integers (Q8_0 and Q4_0 on AVX-512),
    /// its `vpdpbusd` peak on all threads, a byte multiply-add counted as two operations: the
    /// roof prefill is then judged against.
    pub integer_peak_gflops: Option<f64>,
    /// Bytes of every matrix a prefill multiplies (every expert, the whole LM head), as
    /// stored: each is read from memory at least once, the weights being far larger than the
    /// caches.
    pub prefill_weight_bytes: f64,
    /// What a prefill could reach: the lower of the peak it is judged against (the integer one
    /// where the GEMM multiplies in integers) and the probed read bandwidth times its FLOPs per
    /// weight byte. At 512 tokens the AMX tiles outrun the memory: the bandwidth is the roof.
    pub prefill_roof_gflops: f64,
    /// The same roof for the MoE blocks alone (their FLOPs over every expert's bytes).
    pub prefill_moe_roof_gflops: f64,
    /// The tile the bf16 GEMM runs: `fma`, `dot` (`vdpbf16ps`) or `amx`.
    pub bf16_gemm: &'static str,
    pub decode_tokens_per_s: f64,
    /// Read bandwidth over bytes per decode step: what decode could reach if it only streamed.
    pub decode_ceiling_tokens_per_s: f64,
    /// Per step, bytes per decode step / the bandwidth probed just before it, over the step's
    /// time; the median over steps.
    pub decode_bandwidth_ratio: f64,
    /// Where a decode step's time goes.
    pub decode_step_ms: StepParts,
    pub moe_decode_ms_per_layer: f64,
    /// Bytes of one layer's eight selected experts per decode step: what the timed MoE kernel
    /// reads (the router's matrix is read before it, timed with the rest of the step).
    pub moe_decode_bytes_per_layer: f64,
    /// Per step, moe_decode_bytes_per_layer / the bandwidth probed just before it, over the
    /// step's MoE time per layer; the median over steps.
    pub moe_decode_bandwidth_ratio: f64,
    pub moe_prefill_ms_per_token_layer: f64,
    /// The MoE blocks' expert FLOPs of a prefill over their traced time: the MoE kernel's rate
    /// inside the model.
    pub prefill_moe_gflops: f64,
    /// Every other FLOP of a prefill but the LM head row's (attention's projections and
    /// products, the dense MLP, the router) over the rest of its time: the work prefill's
    /// target holds to a share of the MoE kernel's rate.
    pub prefill_rest_gflops: f64,
    /// The LM head on the prompt's last row: one row product, as long as a decode step's (it
    /// reads the whole head), so judged by bandwidth, not FLOPs.
    pub prefill_head_ms: f64,
    pub bytes_per_decode_step: f64,
    /// The median of the probes made before each decode step.
    pub read_bandwidth_gbs: f64,
    /// The lowest and highest of those probes (how much the machine drifted during the run).
    pub read_bandwidth_range_gbs: [f64; 2],
    pub peak_rss_bytes: u64,
    pub weights_bytes: u64,
    /// On a device backend, bytes sent to the device per decode step: weights (the most of any
    /// step: none once resident) and everything else (the median).
    pub decode_step_uploaded_weight_bytes: Option<u64>,
    pub decode_step_uploaded_other_bytes: Option<u64>,
}

/// Median milliseconds per decode step by what ran, all layers together: the traced kernels, and
/// the rest of the step (attention, norms, the router: CPU code outside the kernels).
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepParts {
    pub lm_head: f64,
    pub moe: f64,
    pub dense_mlp: f64,
    pub rest: f64,
}

pub fn run(args: &BenchArgs, layers: usize) -> Result<ExitCode, CommandError> {
    // `--plot` without a storage format measures each one: bf16, then every block format.
    let runs: Vec<BenchArgs> = match (&args.plot, args.dtype, args.quantize) {
        (Some(_), None, None) => std::iter::once(None)
            .chain(moek_kernels::ir::BlockFormat::ALL.iter().copied().map(Some))
            .map(|dtype| BenchArgs {
                dtype,
                ..args.clone()
            })
            .collect(),
        _ => vec![args.clone()],
    };
    let mut all = Vec::with_capacity(runs.len());
    for (i, run) in runs.iter().enumerate() {
        if i > 0 && !reset_peak_rss() {
            eprintln!(
                "note: this run's peak RSS includes the runs before it (it cannot be reset here)"
            );
        }
        let f = measure(run, layers)?;
        report(&f, args.format);
        all.push(f);
    }
    if let Some(path) = &args.plot {
        super::plot::draw(path, &all)?;
        eprintln!(
            "drew {} run(s) against their roofs: {}",
            all.len(),
            path.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints one run's figures.
fn report(f: &ModelFigures, format: Format) {
    match format {
        Format::Json => print_json(f),
        Format::Text => {
            println!(
                "{} x {} layers on {} ({}, {} threads), {}, random weights ({})",
                f.geometry,
                f.layers,
                f.backend,
                f.isa,
                f.threads,
                match (&f.quantized, f.quantized_scope) {
                    (Some(q), Some("whole")) => format!("{q} whole model, bf16 router"),
                    (Some(q), _) => format!("{q} experts and embedding, bf16 elsewhere"),
                    (None, _) => "bf16".into(),
                },
                f.weights
            );
            if let Some(v) = &f.variant {
                println!("MoE variant forced: {v}");
            }
            println!(
                "read bandwidth (probed before each decode step): median {:.1} GB/s, {:.1}-{:.1}",
                f.read_bandwidth_gbs, f.read_bandwidth_range_gbs[0], f.read_bandwidth_range_gbs[1]
            );
            println!(
                "prefill {} tokens (median of {}): {:.1} tokens/s, {:.0} GFLOP/s = {:.0}% of the ISA's \
                 bf16 GEMM peak {:.0} (timed before each; {} tile; f32 FMA peak {:.0}); MoE {:.3} ms per \
                 token per layer",
                f.prompt_tokens,
                f.prefill_runs,
                f.prefill_tokens_per_s,
                f.prefill_gflops,
                f.prefill_gflops / f.isa_peak_gflops * 100.0,
                f.isa_peak_gflops,
                f.bf16_gemm,
                f.f32_peak_gflops,
                f.moe_prefill_ms_per_token_layer
            );
            println!(
                "  prefill by part: MoE blocks {:.0} GFLOP/s; attention, dense MLP and router {:.0} \
                 GFLOP/s ({:.0}% of the MoE blocks' rate); the LM head's last row {:.1} ms",
                f.prefill_moe_gflops,
                f.prefill_rest_gflops,
                f.prefill_rest_gflops / f.prefill_moe_gflops * 100.0,
                f.prefill_head_ms
            );
            if let Some(peak) = f.integer_peak_gflops {
                println!(
                    "  the quantized matrices multiply in integers: {:.0}% of the vpdpbusd peak {:.0}",
                    f.prefill_gflops / peak * 100.0,
                    peak
                );
            }
            println!(
                "  against the roof (the lower of that peak and the probed bandwidth x FLOPs per \
                 weight byte, every weight read once: {:.2} GB): prefill {:.0}% of {:.0} GFLOP/s, \
                 MoE blocks {:.0}% of {:.0}",
                f.prefill_weight_bytes / 1e9,
                f.prefill_gflops / f.prefill_roof_gflops * 100.0,
                f.prefill_roof_gflops,
                f.prefill_moe_gflops / f.prefill_moe_roof_gflops * 100.0,
                f.prefill_moe_roof_gflops
            );
            println!(
                "decode (median of {} steps): {:.2} tokens/s; {:.1} MB read per step -> ceiling \
                 {:.2} tokens/s; each step against its own probe: {:.0}% (median)",
                f.decode_steps,
                f.decode_tokens_per_s,
                f.bytes_per_decode_step / 1e6,
                f.decode_ceiling_tokens_per_s,
                f.decode_bandwidth_ratio * 100.0,
            );
            let p = &f.decode_step_ms;
            println!(
                "decode step: LM head {:.1} ms, MoE {:.1} ms, dense MLP {:.1} ms, the rest \
                 (attention, norms, router) {:.1} ms",
                p.lm_head, p.moe, p.dense_mlp, p.rest
            );
            println!(
                "MoE decode: {:.3} ms per layer per token for {:.1} MB -> floor {:.3} ms; each step \
                 against its own probe: {:.0}% of read bandwidth (median)",
                f.moe_decode_ms_per_layer,
                f.moe_decode_bytes_per_layer / 1e6,
                f.moe_decode_bytes_per_layer / (f.read_bandwidth_gbs * 1e9) * 1e3,
                f.moe_decode_bandwidth_ratio * 100.0
            );
            if let (Some(w), Some(o)) = (
                f.decode_step_uploaded_weight_bytes,
                f.decode_step_uploaded_other_bytes,
            ) {
                println!("sent to the device per decode step: {w} weight bytes, {o} other bytes");
            }
            println!(
                "peak RSS {:.2} GB for {:.2} GB of weights ({:.2}x)",
                f.peak_rss_bytes as f64 / 1e9,
                f.weights_bytes as f64 / 1e9,
                f.peak_rss_bytes as f64 / f.weights_bytes as f64
            );
        }
    }
}

/// Seconds the traced kernels of kind `what` took in one forward.
fn seconds_of(trace: &[Trace], what: &str) -> f64 {
    trace
        .iter()
        .filter(|t| t.what == what)
        .map(|t| t.seconds)
        .fold(0.0, |a, b| a + b) // not `sum`, which is -0.0 for no records
}

/// The bench's random weights written to a fresh safetensors file and mapped back. The file is
/// unlinked once mapped (the map keeps its pages), so nothing is left behind.
fn written(
    cfg: &moek_model::gemma4::config::Config,
    draw: moek_model::gemma4::tiny::Draw,
) -> Result<Checkpoint, CommandError> {
    let dir = std::env::temp_dir().join(format!("moek-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| LoadError::Io {
        path: dir.clone(),
        source,
    })?;
    let path = dir.join("model.safetensors");
    let saved = moek_model::gemma4::weights::save::<bf16>(draw, cfg, &path);
    let ck = saved.and_then(|()| Checkpoint::from_files(std::slice::from_ref(&path)));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ck?)
}

/// The traced kernels a decode step's time is split into ([`StepParts`]).
const PARTS: [&str; 3] = ["lm_head", "moe", "dense_mlp"];

pub fn measure(args: &BenchArgs, layers: usize) -> Result<ModelFigures, CommandError> {
    const PROMPT: usize = 512;
    match args.geometry.unwrap_or(Geometry::Gemma4_26bA4b) {
        Geometry::Gemma4_26bA4b => {
            let cfg = moek_model::gemma4::tiny::gemma4_26b(layers);
            let ck;
            let experts_only = args.quantize_experts_only;
            let drawn = crate::commands::quantize(args.dtype, experts_only);
            let draw = moek_model::gemma4::tiny::Draw::quantized(drawn);
            let weights = match args.from_file {
                None => moek_model::gemma4::weights::build(&mut { draw }, &cfg, |_| {})?,
                Some(residence) => {
                    ck = written(&cfg, draw)?;
                    let q = crate::commands::quantize(args.quantize, experts_only);
                    moek_model::gemma4::weights::load_quantized::<bf16>(
                        &ck,
                        &cfg,
                        residence,
                        q,
                        |_| {},
                    )?
                }
            };
            let weights_bytes = weights.bytes() as u64;
            let quant = crate::commands::quantize(args.dtype.or(args.quantize), experts_only);
            let work = Work::gemma4(&cfg, PROMPT, quant);
            let vocab = cfg.vocab_size;
            let model = Model::new(cfg, weights, kernels(args));
            let at = ("26b-a4b", layers, quant);
            timed(args, at, &model, vocab, weights_bytes, work)
        }
        Geometry::Qwen3_30bA3b => {
            if args.dtype.or(args.quantize).is_some() {
                return Err(CommandError::Usage(
                    "`--dtype` and `--quantize` quantize the 26b-a4b geometry; qwen3-30b-a3b \
                     runs bf16"
                        .into(),
                ));
            }
            if args.from_file.is_some() {
                return Err(CommandError::Usage(
                    "`--from-file` writes and loads the 26b-a4b geometry's checkpoint; \
                     qwen3-30b-a3b is built in memory only"
                        .into(),
                ));
            }
            let cfg = moek_model::qwen3::geometry::qwen3_30b_a3b(layers);
            let weights = moek_model::qwen3::geometry::weights::<bf16>(&cfg);
            let weights_bytes = weights.bytes() as u64;
            let work = Work::qwen3(&cfg, PROMPT);
            let vocab = cfg.vocab_size;
            let model = moek_model::qwen3::model::Model::new(cfg, weights, kernels(args));
            let at = ("qwen3-30b-a3b", layers, None);
            timed(args, at, &model, vocab, weights_bytes, work)
        }
        Geometry::GptOss20b => {
            if args.quantize.is_some() || args.from_file.is_some() {
                return Err(CommandError::Usage(
                    "gpt-oss-20b is built in memory, its experts drawn straight into blocks: \
                     `--dtype` names the format (MXFP4 by default); `--from-file` and \
                     `--quantize` are the 26b-a4b geometry's"
                        .into(),
                ));
            }
            let experts = args.dtype.unwrap_or(BlockFormat::Mxfp4);
            let cfg = moek_model::gpt_oss::geometry::gpt_oss_20b(layers);
            let weights = moek_model::gpt_oss::geometry::weights::<bf16>(&cfg, experts);
            let weights_bytes = weights.bytes() as u64;
            let work = Work::gpt_oss(&cfg, PROMPT, experts);
            let vocab = cfg.vocab_size;
            let model = moek_model::gpt_oss::model::Model::new(cfg, weights, kernels(args));
            let shipped = Quantize {
                format: experts,
                scope: Scope::Experts,
            };
            let at = ("gpt-oss-20b", layers, Some(shipped));
            timed(args, at, &model, vocab, weights_bytes, work)
        }
    }
}

/// The built-in kernels on the chosen backend, the forced variant if any.
fn kernels(args: &BenchArgs) -> Kernels {
    Kernels::new(args.backend.backend()).with_variant(args.variant.clone())
}

/// Times prefills of a 512-token prompt and decode steps of `model` (at `geometry` with `layers`
/// layers, the matrices `quantized` covers in its blocks if set), each step against the read
/// bandwidth probed just before it.
fn timed(
    args: &BenchArgs,
    (geometry, layers, quantized): (&str, usize, Option<Quantize>),
    model: &impl CausalLm,
    vocab: usize,
    weights_bytes: u64,
    work: Work,
) -> Result<ModelFigures, CommandError> {
    let backend = args.backend;
    let prompt: Vec<u32> = (0..512u32)
        .map(|i| (i * 7919 + 13) % vocab as u32)
        .collect();
    // A forced variant serves both shapes, or nothing is timed.
    model.check_variant(prompt.len())?;
    model.check_variant(1)?;
    // Prefill: a fresh cache each run; the last run's cache goes on to decode.
    const PREFILL_RUNS: usize = 3;
    let mut trace = vec![];
    let mut prefill = vec![];
    let mut moe_prefill = vec![];
    let mut head_prefill = vec![];
    let mut peaks = vec![];
    let mut state = None;
    let (isa, threads) = (moek_cpu::isa(), rayon::current_num_threads());
    let steps = args.iters.max(3);
    for _ in 0..PREFILL_RUNS {
        peaks.push(isa.peak_gflops_now(threads));
        trace.clear();
        // Room for the decode steps, as generation makes it.
        let mut cache = model.cache_for(prompt.len() + steps);
        let start = Instant::now();
        let last = model.forward(&prompt, &mut cache, Head::Last, &mut trace)?;
        prefill.push(start.elapsed().as_secs_f64());
        moe_prefill.push(seconds_of(&trace, "moe"));
        head_prefill.push(seconds_of(&trace, "lm_head"));
        state = Some((cache, last));
    }
    let (mut cache, mut last) = state.expect("at least one prefill");
    let prefill_s = median(prefill.into_iter());
    let moe_prefill_s = median(moe_prefill.into_iter());
    let head_prefill_s = median(head_prefill.into_iter());
    // Peak memory through prefill, before the step probe's buffer: decode steps add only rows of
    // the KV cache.
    let peak_rss_bytes = peak_rss();
    let probe = sample_probe();
    let mut bandwidth = vec![];
    let mut samples = vec![];
    let mut parts: [Vec<f64>; PARTS.len()] = Default::default();
    let mut uploads = vec![];
    for _ in 0..steps {
        bandwidth.push(probe.best_of(2));
        let next = moek_model::generate::argmax(&last[0]);
        trace.clear();
        let start = Instant::now();
        last = model.forward(&[next], &mut cache, Head::Last, &mut trace)?;
        samples.push(start.elapsed().as_secs_f64());
        for (p, what) in parts.iter_mut().zip(PARTS) {
            p.push(seconds_of(&trace, what));
        }
        uploads.extend(moek_model::forward::uploaded(&trace));
    }

    drop(probe);
    let decode_bandwidth_ratio = median_ratio(work.decode_bytes, &bandwidth, &samples);
    let [_, moe_times, _] = &parts;
    let moe_decode_bandwidth_ratio =
        median_ratio(work.moe_decode_bytes * layers as f64, &bandwidth, moe_times);
    let read_bandwidth = median(bandwidth.iter().copied());
    let range = bandwidth
        .iter()
        .fold([f64::MAX, 0.0], |[lo, hi], &b| [lo.min(b), hi.max(b)]);
    let step_s = median(samples.into_iter());
    let [lm_head, moe_all, dense_mlp] = parts.map(|p| median(p.into_iter()) * 1e3);
    let decode_step_ms = StepParts {
        lm_head,
        moe: moe_all,
        dense_mlp,
        rest: step_s * 1e3 - lm_head - moe_all - dense_mlp,
    };
    // The MoE blocks of all layers, per layer.
    let moe_s = moe_all / 1e3 / layers as f64;
    let isa_peak_gflops = median(peaks.into_iter());
    let integer_peak_gflops = quantized.and_then(|q| isa.integer_peak_gflops(q.format, threads));
    let peak = integer_peak_gflops.unwrap_or(isa_peak_gflops);
    let roof = |flops: f64, bytes: f64| prefill_roof(peak, flops, bytes, read_bandwidth);
    Ok(ModelFigures {
        variant: args.variant.clone(),
        geometry: geometry.into(),
        layers,
        backend: format!("{backend:?}").to_lowercase(),
        quantized: quantized.map(|q| q.format.to_string()),
        quantized_scope: quantized.map(|q| match q.scope {
            Scope::Whole => "whole",
            Scope::Experts => "experts",
        }),
        weights: args
            .from_file
            .and_then(|r| clap::ValueEnum::to_possible_value(&r))
            .map_or("memory".into(), |v| v.get_name().to_string()),
        isa: isa.name(),
        threads,
        prompt_tokens: prompt.len(),
        prefill_runs: PREFILL_RUNS,
        decode_steps: steps,
        prefill_tokens_per_s: prompt.len() as f64 / prefill_s,
        prefill_gflops: work.prefill_flops / prefill_s / 1e9,
        isa_peak_gflops,
        f32_peak_gflops: isa.f32_peak_gflops(threads),
        integer_peak_gflops,
        prefill_weight_bytes: work.prefill_bytes,
        prefill_roof_gflops: roof(work.prefill_flops, work.prefill_bytes),
        prefill_moe_roof_gflops: roof(work.moe_prefill_flops, work.moe_prefill_bytes),
        bf16_gemm: match (isa, moek_cpu::gemm::bf16_tile()) {
            (moek_cpu::Isa::Amx, _) => "amx",
            (_, moek_cpu::gemm::Bf16Tile::Dot) => "dot",
            (_, moek_cpu::gemm::Bf16Tile::Fma) => "fma",
        },
        decode_tokens_per_s: 1.0 / step_s,
        decode_ceiling_tokens_per_s: read_bandwidth / work.decode_bytes,
        decode_bandwidth_ratio,
        decode_step_ms,
        moe_decode_ms_per_layer: moe_s * 1e3,
        moe_decode_bytes_per_layer: work.moe_decode_bytes,
        moe_decode_bandwidth_ratio,
        moe_prefill_ms_per_token_layer: moe_prefill_s / (layers * prompt.len()) as f64 * 1e3,
        prefill_moe_gflops: work.moe_prefill_flops / moe_prefill_s / 1e9,
        prefill_rest_gflops: (work.prefill_flops - work.moe_prefill_flops - work.head_flops)
            / (prefill_s - moe_prefill_s - head_prefill_s)
            / 1e9,
        prefill_head_ms: head_prefill_s * 1e3,
        bytes_per_decode_step: work.decode_bytes,
        read_bandwidth_gbs: read_bandwidth / 1e9,
        read_bandwidth_range_gbs: range.map(|b| b / 1e9),
        peak_rss_bytes,
        weights_bytes,
        decode_step_uploaded_weight_bytes: uploads.iter().map(|u| u.weights).max(),
        decode_step_uploaded_other_bytes: (!uploads.is_empty())
            .then(|| median(uploads.iter().map(|u| u.other as f64)) as u64),
    })
}

/// What a prefill computes and a decode step reads, counted from the config.
struct Work {
    prefill_flops: f64,
    /// The part of `prefill_flops` the MoE blocks compute: the selected experts' products.
    moe_prefill_flops: f64,
    /// The part the LM head computes: its one row.
    head_flops: f64,
    /// Bytes of every matrix the prefill multiplies (every expert), as stored.
    prefill_bytes: f64,
    /// The part of `prefill_bytes` the MoE blocks read: every expert of every layer.
    moe_prefill_bytes: f64,
    decode_bytes: f64,
    moe_decode_bytes: f64,
}

impl Work {
    /// Per decode step: the LM head row product, and per layer attention, dense MLP, router, the
    /// eight selected experts and the KV cache over the prompt ([`cache_bytes`]). Per
    /// prefill of `s` tokens: two FLOPs per multiply-add of every matrix product, attention over
    /// the visible keys, and the LM head on the final row.
    /// The matrices `quant` covers take its bytes per value as stored (scales included).
    fn gemma4(cfg: &moek_model::gemma4::config::Config, s: usize, quant: Option<Quantize>) -> Work {
        let (h, e, st) = (cfg.hidden_size as f64, 2.0, s as f64);
        let bytes = |q: Option<BlockFormat>| {
            let block = moek_kernels::ir::quant::BLOCK;
            q.map_or(e, |q| q.block_bytes(block) as f64 / block as f64)
        };
        let (banks, linears) = Quantize::formats(quant);
        let (quantized_bytes, dense_bytes) = (bytes(banks), bytes(linears));
        let head_bytes = cfg.vocab_size as f64 * h * quantized_bytes;
        let mut decode_bytes = head_bytes;
        let mut prefill_bytes = head_bytes;
        let mut moe_prefill_bytes = 0.0;
        let head_flops = 2.0 * cfg.vocab_size as f64 * h;
        let mut prefill_flops = head_flops;
        let mut moe_decode = 0.0;
        let mut moe_prefill_flops = 0.0;
        for l in &cfg.layers {
            let (d, kv, nh) = (
                l.head_dim as f64,
                l.num_key_value_heads as f64,
                cfg.num_attention_heads as f64,
            );
            let v = if l.attention_k_eq_v { 0.0 } else { kv * d * h };
            let dense =
                (2.0 * nh * d * h + kv * d * h + v) + 3.0 * cfg.intermediate_size as f64 * h;
            decode_bytes += dense * dense_bytes;
            prefill_bytes += dense * dense_bytes;
            prefill_flops += 2.0 * st * dense;
            // Causal: query i sees i + 1 keys, at most the window on sliding layers.
            let window = cfg.window(l).unwrap_or(usize::MAX);
            let visible: f64 = (0..s).map(|i| (i + 1).min(window) as f64).sum();
            prefill_flops += 2.0 * 2.0 * nh * d * visible;
            decode_bytes += cache_bytes(s.min(window), kv, d);
            if let Some(m) = cfg.moe {
                let experts = (m.top_k_experts * 3 * m.moe_intermediate_size) as f64 * h;
                let router = m.num_experts as f64 * h;
                moe_decode = experts * quantized_bytes;
                decode_bytes += moe_decode + router * e;
                let bank = (m.num_experts * 3 * m.moe_intermediate_size) as f64 * h;
                moe_prefill_bytes += bank * quantized_bytes;
                prefill_bytes += bank * quantized_bytes + router * e;
                prefill_flops += 2.0 * st * (experts + router);
                moe_prefill_flops += 2.0 * st * experts;
            }
        }
        Work {
            prefill_flops,
            moe_prefill_flops,
            head_flops,
            prefill_bytes,
            moe_prefill_bytes,
            decode_bytes,
            moe_decode_bytes: moe_decode,
        }
    }
}

impl Work {
    /// As [`Work::gemma4`] for Qwen3-MoE: per layer GQA attention (q and o of all heads, k and v
    /// of the KV heads), the router and the top-k experts; causal attention over every key.
    /// gpt-oss: attention with its biases, the router, four experts of three matrices in
    /// `experts`' blocks (their biases are a few KB), the untied LM head row; prefill attention
    /// over the visible keys, the window on sliding layers.
    fn gpt_oss(cfg: &moek_model::gpt_oss::config::Config, s: usize, experts: BlockFormat) -> Work {
        let (h, e, st) = (cfg.hidden_size as f64, 2.0, s as f64);
        let (d, kv, nh) = (
            cfg.head_dim as f64,
            cfg.num_key_value_heads as f64,
            cfg.num_attention_heads as f64,
        );
        let m = cfg.moe;
        let block = moek_kernels::ir::quant::BLOCK;
        let expert_bytes = experts.block_bytes(block) as f64 / block as f64;
        let attention = 2.0 * nh * d * h + 2.0 * kv * d * h;
        let experts = (m.num_experts_per_tok * 3 * m.intermediate_size) as f64 * h;
        let router = m.num_local_experts as f64 * h;
        let head = cfg.vocab_size as f64 * h;
        let mut prefill_flops = 2.0 * head;
        let mut cache = 0.0;
        for layer in 0..cfg.layers.len() {
            let window = cfg.window(layer).unwrap_or(usize::MAX);
            let visible: f64 = (0..s).map(|i| (i + 1).min(window) as f64).sum();
            prefill_flops += 2.0 * st * (attention + experts + router) + 4.0 * nh * d * visible;
            cache += cache_bytes(s.min(window), kv, d);
        }
        let layers = cfg.layers.len() as f64;
        let every = (m.num_local_experts * 3 * m.intermediate_size) as f64 * h * expert_bytes;
        Work {
            prefill_flops,
            moe_prefill_flops: layers * 2.0 * st * experts,
            head_flops: 2.0 * head,
            prefill_bytes: (head + layers * (attention + router)) * e + layers * every,
            moe_prefill_bytes: layers * every,
            decode_bytes: (head + layers * (attention + router)) * e
                + layers * experts * expert_bytes
                + cache,
            moe_decode_bytes: experts * expert_bytes,
        }
    }

    fn qwen3(cfg: &moek_model::qwen3::config::Config, s: usize) -> Work {
        let (h, e, st) = (cfg.hidden_size as f64, 2.0, s as f64);
        let (d, kv, nh) = (
            cfg.head_dim as f64,
            cfg.num_key_value_heads as f64,
            cfg.num_attention_heads as f64,
        );
        let m = cfg.moe;
        let attention = 2.0 * nh * d * h + 2.0 * kv * d * h;
        let experts = (m.num_experts_per_tok * 3 * m.moe_intermediate_size) as f64 * h;
        let router = m.num_experts as f64 * h;
        let every = (m.num_experts * 3 * m.moe_intermediate_size) as f64 * h;
        let layers = cfg.layers.len() as f64;
        let visible: f64 = (0..s).map(|i| (i + 1) as f64).sum();
        let head = cfg.vocab_size as f64 * h;
        Work {
            prefill_flops: 2.0 * head
                + layers * (2.0 * st * (attention + experts + router) + 4.0 * nh * d * visible),
            moe_prefill_flops: layers * 2.0 * st * experts,
            head_flops: 2.0 * head,
            prefill_bytes: (head + layers * (attention + every + router)) * e,
            moe_prefill_bytes: layers * every * e,
            decode_bytes: (head + layers * (attention + experts + router)) * e
                + layers * cache_bytes(s, kv, d),
            moe_decode_bytes: experts * e,
        }
    }
}

/// Bytes a decode step reads of one layer's KV cache over `positions` earlier tokens: keys and
/// values in the model's type, bf16 in every geometry here (a layer whose values share the
/// keys' projection still caches both: the keys are normed and rotated, the values only
/// normed). After a 512-token prompt that is 4% of a 30-layer Q4_0 26B-A4B step's bytes.
fn cache_bytes(positions: usize, kv_heads: f64, head_dim: f64) -> f64 {
    positions as f64 * kv_heads * head_dim * 2.0 * size_of::<bf16>() as f64
}

/// Starts the peak resident set afresh (Linux: `5` into `/proc/self/clear_refs`), so each of
/// several runs in one process reports its own; false where that cannot be done.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// The process's peak resident set (`VmHWM`), bytes; 0 where /proc is absent.
pub fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}
