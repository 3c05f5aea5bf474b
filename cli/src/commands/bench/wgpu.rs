//! `moek bench --backend wgpu`: the decode and prefill kernels dispatch picks for wgpu, on the
//! adapter present, with the banks kept on the device (uploaded once). Times are per call from
//! the host: upload of activations and routes, every dispatch, readback of the output.

use super::BenchArgs;
use crate::commands::CommandError;
use crate::commands::figures::{Format, median, print_json};
use half::bf16;
use moek_kernels::dispatch::{self, Backend};
use moek_kernels::geometry;
use moek_kernels::ir::{DType, Op};
use moek_kernels::testing::{Case, routes};
use moek_kernels::wgpu::Session;
use std::process::ExitCode;
use std::time::Instant;

/// What one wgpu run measures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuFigures {
    pub adapter: String,
    pub decode_kernel: String,
    pub decode_ms: f64,
    pub decode_bytes: f64,
    pub decode_gbs: f64,
    pub prefill_kernel: String,
    pub prefill_ms: f64,
    pub prefill_gflops: f64,
}

pub fn run(args: &BenchArgs) -> Result<ExitCode, CommandError> {
    let f = measure(args.iters.max(3))?;
    match args.format {
        Format::Json => print_json(&f),
        Format::Text => {
            println!("wgpu adapter: {}", f.adapter);
            println!(
                "decode {} T=1 R=8 bf16: {:.3} ms per call, {:.1} MB of weights read, {:.1} GB/s",
                f.decode_kernel,
                f.decode_ms,
                f.decode_bytes / 1e6,
                f.decode_gbs
            );
            println!(
                "prefill {} T=512 top-8 bf16: {:.1} ms per call, {:.1} GFLOP/s",
                f.prefill_kernel, f.prefill_ms, f.prefill_gflops
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn backend_error(e: impl std::fmt::Display) -> CommandError {
    CommandError::Required {
        backend: "wgpu".into(),
        why: e.to_string(),
    }
}

pub fn measure(iters: usize) -> Result<GpuFigures, CommandError> {
    let backend = Backend::wgpu();
    let builtin = moek_kernels::Registry::builtin();
    let choose = |shape: &moek_kernels::Shape| {
        dispatch::choose(&builtin, &backend, Op::ExpertFfn, DType::Bf16, shape, None)
    };
    let decode = crate::commands::spec(&builtin, &choose(&geometry::DECODE)?.kernel)?;
    let prefill = crate::commands::spec(&builtin, &choose(&geometry::PREFILL)?.kernel)?;
    let shape = geometry::DECODE;
    let mut case = Case::<bf16>::new(Op::ExpertFfn, shape, 1);
    let w1 = std::mem::take(case.param_mut("gate_up"));
    let w2 = std::mem::take(case.param_mut("down"));
    let mut session = Session::new().map_err(backend_error)?;
    session.keep(&w1);
    session.keep(&w2);
    let adapter = session.gpu().name();
    let mut time = |case: &Case<bf16>, k: &moek_kernels::ir::Kernel, out: &mut [f32]| {
        let inputs = moek_kernels::Inputs::expert_ffn(&case.x, &case.idx, &case.weights, &w1, &w2);
        let start = Instant::now();
        session
            .run(k, &case.shape, &inputs, out)
            .map_err(backend_error)?;
        Ok::<f64, CommandError>(start.elapsed().as_secs_f64())
    };
    // The first call uploads the banks and compiles the program: not timed.
    let mut out = vec![0f32; shape.h];
    time(&case, decode.ir(), &mut out)?;
    let mut samples = vec![];
    for i in 0..iters as u64 {
        (case.idx, case.weights) = routes(1, 8, 128, 100 + i);
        samples.push(time(&case, decode.ir(), &mut out)?);
    }
    let decode_s = median(samples.into_iter());
    let bytes = 8.0 * 3.0 * 704.0 * 2816.0 * 2.0;

    let pshape = geometry::PREFILL;
    (case.x, case.shape) = (moek_kernels::testing::uniform(512 * 2816, 5, 1.0), pshape);
    (case.idx, case.weights) = routes(512, 8, 128, 6);
    let mut out = vec![0f32; 512 * 2816];
    time(&case, prefill.ir(), &mut out)?;
    let mut samples = vec![];
    for _ in 0..iters.min(3) {
        samples.push(time(&case, prefill.ir(), &mut out)?);
    }
    let prefill_s = median(samples.into_iter());
    let flops = 2.0 * 512.0 * 8.0 * 3.0 * 704.0 * 2816.0;
    Ok(GpuFigures {
        adapter,
        decode_kernel: decode.name().to_string(),
        decode_ms: decode_s * 1e3,
        decode_bytes: bytes,
        decode_gbs: bytes / decode_s / 1e9,
        prefill_kernel: prefill.name().to_string(),
        prefill_ms: prefill_s * 1e3,
        prefill_gflops: flops / prefill_s / 1e9,
    })
}
