//! `moek bench --geometry 26b-a4b --layers N`: the whole model at the real layer geometry with
//! random bf16 weights built in memory: prefill of a 512-token prompt and decode steps, tokens/s,
//! the MoE block's share, bytes read per decode step against the read bandwidth measured in the
//! same run, and peak memory against the weights' bytes.

use super::bench::{BenchArgs, Format, median, print_json};
use super::run::BackendArg;
use crate::commands::CommandError;
use crate::forward::{Cache, Head, Model, Trace};
use half::bf16;
use std::process::ExitCode;
use std::time::Instant;

/// What one run measures; the field names are the ones scripts check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelFigures {
    pub geometry: String,
    pub layers: usize,
    pub backend: String,
    pub threads: usize,
    pub prompt_tokens: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub moe_decode_ms_per_layer: f64,
    pub moe_prefill_ms_per_token_layer: f64,
    pub bytes_per_decode_step: f64,
    pub read_bandwidth_gbs: f64,
    /// bytes per decode step / measured read bandwidth, over the measured step time.
    pub decode_bandwidth_ratio: f64,
    pub peak_rss_bytes: u64,
    pub weights_bytes: u64,
}

pub fn run(args: &BenchArgs, layers: usize) -> Result<ExitCode, CommandError> {
    let f = measure(args, layers)?;
    match args.format {
        Format::Json => print_json(&f),
        Format::Text => {
            println!(
                "{} x {} layers on {} ({} threads), bf16, random weights",
                f.geometry, f.layers, f.backend, f.threads
            );
            println!(
                "prefill {} tokens: {:.1} tokens/s; MoE {:.3} ms per token per layer",
                f.prompt_tokens, f.prefill_tokens_per_s, f.moe_prefill_ms_per_token_layer
            );
            println!(
                "decode: {:.2} tokens/s; {:.1} MB read per step; read bandwidth {:.1} GB/s (same run) \
                 -> ceiling {:.2} tokens/s, {:.0}% of it; MoE {:.3} ms per layer per token",
                f.decode_tokens_per_s,
                f.bytes_per_decode_step / 1e6,
                f.read_bandwidth_gbs,
                f.read_bandwidth_gbs * 1e9 / f.bytes_per_decode_step,
                f.decode_bandwidth_ratio * 100.0,
                f.moe_decode_ms_per_layer
            );
            println!(
                "peak RSS {:.2} GB for {:.2} GB of weights ({:.2}x)",
                f.peak_rss_bytes as f64 / 1e9,
                f.weights_bytes as f64 / 1e9,
                f.peak_rss_bytes as f64 / f.weights_bytes as f64
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn moe_seconds(trace: &[Trace]) -> f64 {
    trace
        .iter()
        .filter(|t| t.what == "moe")
        .map(|t| t.seconds)
        .sum()
}

pub fn measure(args: &BenchArgs, layers: usize) -> Result<ModelFigures, CommandError> {
    let backend = match args.backend {
        super::bench::BenchBackend::Cpu => BackendArg::Cpu,
        super::bench::BenchBackend::Wgpu => BackendArg::Wgpu,
    };
    let read_bandwidth = moek_cpu::bandwidth::read_bandwidth(1 << 30, 5);
    let cfg = crate::tiny::gemma4_26b(layers);
    let weights = crate::tiny::weights::<bf16>(&cfg);
    let weights_bytes = weights.bytes() as u64;
    let model = Model {
        cfg,
        weights,
        backend: backend.backend(),
        variant: None,
    };
    let cfg = &model.cfg;
    let prompt: Vec<u32> = (0..512u32)
        .map(|i| (i * 7919 + 13) % cfg.vocab as u32)
        .collect();
    let mut trace = vec![];
    let mut cache = Cache::default();
    let start = Instant::now();
    let mut last = model.forward(&prompt, &mut cache, Head::Last, &mut trace)?;
    let prefill_s = start.elapsed().as_secs_f64();
    let moe_prefill = moe_seconds(&trace);
    let steps = args.iters.max(3);
    let mut samples = vec![];
    let mut moe = vec![];
    for _ in 0..steps {
        let next = crate::generate::argmax(&last[0]);
        trace.clear();
        let start = Instant::now();
        last = model.forward(&[next], &mut cache, Head::Last, &mut trace)?;
        samples.push(start.elapsed().as_secs_f64());
        moe.push(moe_seconds(&trace) / layers as f64);
    }
    let step_s = median(samples.into_iter());
    // Per decode step: the LM head row product, and per layer attention, dense MLP and the
    // eight selected experts (the KV cache is small beside them at this length).
    let (h, e) = (cfg.hidden as f64, 2.0);
    let mut bytes = cfg.vocab as f64 * h * e;
    for l in &cfg.layers {
        let (d, kv, nh) = (l.head_dim as f64, l.kv_heads as f64, cfg.heads as f64);
        let v = if l.k_eq_v { 0.0 } else { kv * d * h };
        bytes += (2.0 * nh * d * h + kv * d * h + v) * e;
        bytes += 3.0 * cfg.intermediate as f64 * h * e;
        if let Some(m) = cfg.moe {
            bytes += (m.top_k * 3 * m.intermediate) as f64 * h * e + (m.experts as f64 * h * e);
        }
    }
    Ok(ModelFigures {
        geometry: "26b-a4b".into(),
        layers,
        backend: format!("{backend:?}").to_lowercase(),
        threads: rayon::current_num_threads(),
        prompt_tokens: prompt.len(),
        prefill_tokens_per_s: prompt.len() as f64 / prefill_s,
        decode_tokens_per_s: 1.0 / step_s,
        moe_decode_ms_per_layer: median(moe.into_iter()) * 1e3,
        moe_prefill_ms_per_token_layer: moe_prefill / (layers * prompt.len()) as f64 * 1e3,
        bytes_per_decode_step: bytes,
        read_bandwidth_gbs: read_bandwidth / 1e9,
        decode_bandwidth_ratio: bytes / read_bandwidth / step_s,
        peak_rss_bytes: peak_rss(),
        weights_bytes,
    })
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
