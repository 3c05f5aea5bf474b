//! `moek bench` (without `--geometry`): the kernel targets, measured against this machine's own floors in the same run.
//!
//! - Decode (T=1, 8 routes, bf16): per call, the weight bytes read over the call's time, against
//!   the memory read bandwidth probed just before it; the median over calls (target: >= 80%).
//! - Grouped prefill (T=512, top-8, bf16): GFLOP/s against a well-kept GEMM crate
//!   (`matrixmultiply`, f32) doing the same FLOPs as two dense GEMMs (target: >= 60%), and
//!   against the ISA's peak timed before each call (each call against its own, the median);
//!   the persistent prefill (one expert bank a trip) beside it.
//!
//! The machine is noisy: every figure is a median of repeated runs, and ratios are taken within
//! one run.

use super::BenchArgs;
use crate::commands::figures::{
    Format, median, median_ratio, prefill_roof, print_json, sample_probe,
};
use crate::commands::{CommandError, spec};
use half::bf16;
use moek_kernels::ir::Op;
use moek_kernels::testing::{Case, routes};
use moek_kernels::{CpuFn, geometry};
use std::process::ExitCode;
use std::time::Instant;

/// The figures one run measures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Figures {
    pub isa: &'static str,
    pub threads: usize,
    /// The median of the probes made before each decode call.
    pub read_bandwidth_gbs: f64,
    pub decode_kernel: String,
    pub decode_ms: f64,
    pub decode_bytes: f64,
    pub decode_gbs: f64,
    /// Per call of the blocked variant, its bytes over its time against the probe just before
    /// it; the median over calls.
    pub decode_ratio: f64,
    pub decode_unblocked_ms: f64,
    pub prefill_kernel: String,
    pub prefill_ms: f64,
    pub prefill_gflops: f64,
    pub gemm_crate_gflops: f64,
    pub prefill_ratio: f64,
    /// The ISA's bf16 GEMM peak on these threads, timed on the instruction the bf16 GEMM runs
    /// on (`tdpbf16ps`, `vdpbf16ps` or FMAs: `moek_cpu::peak`) before each prefill call: the
    /// median of those timings.
    pub isa_peak_gflops: f64,
    /// Per grouped call, its GFLOP/s against the peak timed just before it; the median.
    pub prefill_peak_ratio: f64,
    /// The most a prefill call could reach: the lower of that peak and the probed read
    /// bandwidth times its FLOPs per byte of the expert bank (every expert is read at least
    /// once, the bank being far larger than the caches).
    pub prefill_roof_gflops: f64,
    /// The persistent prefill variant on the same inputs, calls alternated with the grouped.
    pub persistent_kernel: String,
    pub persistent_ms: f64,
    pub persistent_gflops: f64,
    pub persistent_peak_ratio: f64,
}

pub const DECODE_FLOOR: f64 = 0.80;
pub const PREFILL_FLOOR: f64 = 0.60;

/// The kernel bench: runs it and prints its figures.
pub fn run(args: &BenchArgs) -> Result<ExitCode, CommandError> {
    let f = measure(args.iters.max(3))?;
    match args.format {
        Format::Json => print_json(&f),
        Format::Text => {
            println!("isa {}, {} threads", f.isa, f.threads);
            println!(
                "memory read bandwidth (probed before each decode call): median {:.1} GB/s",
                f.read_bandwidth_gbs
            );
            println!(
                "decode {} T=1 R=8 bf16: {:.3} ms, {:.1} MB read, {:.1} GB/s = {:.0}% of read bandwidth (floor {:.0}%); unblocked: {:.3} ms",
                f.decode_kernel,
                f.decode_ms,
                f.decode_bytes / 1e6,
                f.decode_gbs,
                f.decode_ratio * 100.0,
                DECODE_FLOOR * 100.0,
                f.decode_unblocked_ms
            );
            println!(
                "prefill {} T=512 top-8 bf16: {:.1} ms, {:.1} GFLOP/s = {:.0}% of matrixmultiply sgemm's {:.1} GFLOP/s on the same FLOPs (floor {:.0}%)",
                f.prefill_kernel,
                f.prefill_ms,
                f.prefill_gflops,
                f.prefill_ratio * 100.0,
                f.gemm_crate_gflops,
                PREFILL_FLOOR * 100.0
            );
            println!(
                "prefill against the {} bf16 GEMM peak of {:.1} GFLOP/s ({} threads, timed before each call; median): {:.0}% (each call against its own)",
                f.isa,
                f.isa_peak_gflops,
                f.threads,
                f.prefill_peak_ratio * 100.0
            );
            println!(
                "prefill {} T=512 top-8 bf16: {:.1} ms, {:.1} GFLOP/s = {:.0}% of the peak (each call against its own)",
                f.persistent_kernel,
                f.persistent_ms,
                f.persistent_gflops,
                f.persistent_peak_ratio * 100.0
            );
            println!(
                "prefill against the roof, {:.1} GFLOP/s (the lower of the peak and the probed bandwidth x FLOPs per bank byte): grouped {:.0}%, persistent {:.0}%",
                f.prefill_roof_gflops,
                f.prefill_gflops / f.prefill_roof_gflops * 100.0,
                f.persistent_gflops / f.prefill_roof_gflops * 100.0
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs every measurement once, in a fixed order.
pub fn measure(iters: usize) -> Result<Figures, CommandError> {
    let threads = rayon::current_num_threads();
    let builtin = moek_kernels::Registry::builtin();
    let decode = spec(&builtin, "decode_expert_ffn_blocked")?;
    let unblocked = spec(&builtin, "general_expert_ffn_gather")?;
    let prefill = spec(&builtin, "prefill_expert_ffn_grouped")?;
    let persistent = spec(&builtin, "prefill_expert_ffn_persistent")?;

    let shape = geometry::DECODE;
    let mut case = Case::<bf16>::new(Op::ExpertFfn, shape, 1);
    let bytes = 8.0 * 3.0 * 704.0 * 2816.0 * 2.0;
    // The two decode variants take turns, call by call, each on routes no call used before: the
    // order of measurement (warm caches, a quiet moment) favours neither.
    let fns: [CpuFn<bf16>; 2] = [
        decode.cpu.bf16.expect("bf16 decode"),
        unblocked.cpu.bf16.expect("bf16 general"),
    ];
    let mut times = [vec![], vec![]];
    let mut bandwidth = [vec![], vec![]];
    let mut out = vec![0f32; 2816];
    let probe = sample_probe();
    for i in 0..2 * iters {
        (case.idx, case.weights) = routes(1, 8, 128, 100 + i as u64);
        let inputs = case.inputs();
        bandwidth[i % 2].push(probe.best_of(2));
        let start = Instant::now();
        fns[i % 2](&shape, &inputs, &mut out);
        times[i % 2].push(start.elapsed().as_secs_f64());
    }
    drop(probe);
    let decode_ratio = median_ratio(bytes, &bandwidth[0], &times[0]);
    let read_bandwidth = median(bandwidth.iter().flatten().copied());
    let [decode_s, unblocked_s] = times.map(|t| median(t.into_iter()));

    let pshape = geometry::PREFILL;
    (case.x, case.shape) = (moek_kernels::testing::uniform(512 * 2816, 5, 1.0), pshape);
    (case.idx, case.weights) = routes(512, 8, 128, 6);
    let flops = 2.0 * 512.0 * 8.0 * 3.0 * 704.0 * 2816.0;
    // The grouped and persistent variants take turns, as the decode variants do.
    let fns: [CpuFn<bf16>; 2] = [
        prefill.cpu.bf16.expect("bf16 prefill"),
        persistent.cpu.bf16.expect("bf16 persistent prefill"),
    ];
    // Each call is judged against the peak timed just before it, as decode calls against their
    // probes: on a shared core both move together.
    let mut out = vec![0f32; 512 * 2816];
    let (mut times, mut peaks) = ([vec![], vec![]], [vec![], vec![]]);
    for i in 0..2 * iters.min(7) {
        let inputs = case.inputs();
        peaks[i % 2].push(moek_cpu::isa().peak_gflops_now(threads) * 1e9);
        let start = Instant::now();
        fns[i % 2](&pshape, &inputs, &mut out);
        times[i % 2].push(start.elapsed().as_secs_f64());
    }
    let [prefill_peak_ratio, persistent_peak_ratio] =
        [0, 1].map(|v| median_ratio(flops, &peaks[v], &times[v]));
    let peak = median(peaks.iter().flatten().copied()) / 1e9;
    // Every expert of the bank, as the persistent variant reads it and top-8 routes of 512
    // tokens over 128 experts all but surely touch.
    let bank_bytes = (pshape.e * 3 * pshape.f * pshape.h * size_of::<bf16>()) as f64;
    let [prefill_s, persistent_s] = times.map(|t| median(t.into_iter()));
    drop(case);
    let gemm_s = median((0..iters.min(7)).map(|_| sgemm_same_flops(threads)));
    Ok(Figures {
        isa: moek_cpu::isa().name(),
        threads,
        read_bandwidth_gbs: read_bandwidth / 1e9,
        decode_kernel: decode.name().to_string(),
        decode_ms: decode_s * 1e3,
        decode_bytes: bytes,
        decode_gbs: bytes / decode_s / 1e9,
        decode_ratio,
        decode_unblocked_ms: unblocked_s * 1e3,
        prefill_kernel: prefill.name().to_string(),
        prefill_ms: prefill_s * 1e3,
        prefill_gflops: flops / prefill_s / 1e9,
        gemm_crate_gflops: flops / gemm_s / 1e9,
        prefill_ratio: gemm_s / prefill_s,
        isa_peak_gflops: peak,
        prefill_peak_ratio,
        prefill_roof_gflops: prefill_roof(peak, flops, bank_bytes, read_bandwidth),
        persistent_kernel: persistent.name().to_string(),
        persistent_ms: persistent_s * 1e3,
        persistent_gflops: flops / persistent_s / 1e9,
        persistent_peak_ratio,
    })
}

/// The grouped prefill's FLOPs as two dense f32 GEMMs through `matrixmultiply`: [4096 x 2816] x
/// [2816 x 1408] (gate/up) and [4096 x 704] x [704 x 2816] (down). Returns seconds.
fn sgemm_same_flops(threads: usize) -> f64 {
    // matrixmultiply reads its thread count from the environment once.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        // SAFETY: set before matrixmultiply first reads it, while no other thread reads the environment.
        unsafe { std::env::set_var("MATMUL_NUM_THREADS", threads.to_string()) };
    }
    let m = 512 * 8;
    let run = |k: usize, n: usize| {
        let a: Vec<f32> = moek_kernels::testing::uniform(m * k, 1, 1.0);
        let b: Vec<f32> = moek_kernels::testing::uniform(k * n, 2, 1.0);
        let mut c = vec![0f32; m * n];
        let start = Instant::now();
        // SAFETY: a, b, c are row-major with the strides given and the lengths allocated above.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                a.as_ptr(),
                k as isize,
                1,
                b.as_ptr(),
                1,
                k as isize,
                0.0,
                c.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        start.elapsed().as_secs_f64()
    };
    run(2816, 1408) + run(704, 2816)
}
