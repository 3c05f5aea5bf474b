//! `moek check`: every spec's variants at their real size (26B-A4B sizes for free dims) against the
//! f64 reference, on every backend this build has (or those `--backend` names), with the variant
//! dispatch would choose for that problem, the time and the rate (for Spyre: the simulator's
//! time, and the cost model's time, LX peak and bytes moved). Then the built-in tiny Gemma-4 MoE through every backend, greedy tokens
//! compared. Exits non-zero when any variant is outside its tolerance or the backends disagree.
//!
//! Every backend and every spec of one op and shape run on the same random case (drawing a
//! 26B-A4B expert bank takes seconds). On a CPU wgpu driver (lavapipe), wgpu rows run at
//! smaller sizes (16-expert banks, 32-token prefill, a 32768-row head:
//! `testing::cpu_driver_shape`) and say so; `--full` runs every row at the spec's size.

use super::{BackendArg, CommandError};
use moek_kernels::dispatch::{self, Backend};
use moek_kernels::geometry;
use moek_kernels::ir::Target;
use moek_kernels::testing::{self, Cases, Report};
use std::process::ExitCode;
use std::time::Instant;

pub fn run(
    registry: &moek_kernels::Registry,
    require: &[BackendArg],
    only: &[BackendArg],
    filter: Option<&str>,
    full: bool,
) -> Result<ExitCode, CommandError> {
    let started = Instant::now();
    // Its cases are gigabytes drawn and dropped one after another.
    moek_cpu::memory::retain_freed_memory();
    // Every backend named is built in (clap has refused names that are none).
    for &named in require.iter().chain(only) {
        if !named.backend().compiled() {
            return Err(required(
                named.target().name(),
                &format!("this build has no `{}` feature", named.target()),
            ));
        }
    }
    let backends: Vec<Backend> = [Backend::cpu(), Backend::wgpu(), Backend::spyre()]
        .into_iter()
        .filter(|b| {
            b.compiled() && (only.is_empty() || only.iter().any(|n| n.target() == b.target))
        })
        .collect();
    // Without an adapter the wgpu rows say so and the other backends still run; a run without
    // wgpu rows does not ask for one.
    let runs_wgpu = backends.iter().any(|b| b.target == Target::Wgpu);
    let needs_wgpu = require.contains(&BackendArg::Wgpu);
    let adapter = if runs_wgpu || needs_wgpu {
        wgpu_adapter()
    } else {
        Err("not asked for".to_string())
    };
    if let (true, Err(why)) = (needs_wgpu, &adapter) {
        return Err(required("wgpu", why));
    }
    if runs_wgpu {
        match &adapter {
            Ok(a) => {
                println!("wgpu adapter: {}", a.name);
                if a.gl_cpu {
                    println!(
                        "note: wgpu runs on a GL CPU driver (llvmpipe), several times slower than \
                         Vulkan's lavapipe: `apt-get install mesa-vulkan-drivers` (Debian, Ubuntu) \
                         gives it"
                    );
                }
            }
            Err(why) => println!("wgpu: no adapter ({why})"),
        }
    }
    println!(
        "{:<44} {:<9} {:<31} {:<30} {:>10} {:>10} {:>9} {:>12}  ok",
        "kernel", "dtype", "shape", "dispatch chooses", "max abs", "rel L2", "ms", "rate"
    );
    let mut failed = 0;
    let seed = testing::fresh_seeds(1)[0];
    let mut cases = Cases::default();
    let mut not_run = 0;
    // Rows that read the same random case run one after another, so each case (a few GB at
    // these sizes; `Cases` keeps two or three) is drawn once: by op, the weights' dims (a case
    // serves every token count, so decode and prefill rows share one) and their storage (a
    // block format's f32 and bf16 activations share a case), then tokens and routes, then spec
    // declaration order.
    let mut rows = vec![];
    for entry in registry
        .entries()
        .filter(|e| filter.is_none_or(|f| e.name().contains(f)))
    {
        let k = entry.ir();
        let full_shape = geometry::real_shape(k);
        for backend in backends.iter().filter(|b| k.targets.contains(&b.target)) {
            let cut = (!full)
                .then(|| testing::cpu_driver_shape(backend.target, &full_shape))
                .flatten();
            for &dtype in &k.dtypes {
                rows.push((entry, backend, dtype, full_shape, cut));
            }
        }
    }
    rows.sort_by_key(|&(entry, _, dtype, full_shape, cut)| {
        let s = cut.unwrap_or(full_shape);
        let weights = match dtype.blocks() {
            Some(format) => (1, format as u8, entry.ir().quant_block),
            None => (0, dtype as u8, 1),
        };
        (entry.ir().op as u8, [s.e, s.h, s.f, s.v], weights, s.t, s.r)
    });
    for (entry, backend, dtype, full_shape, cut) in rows {
        let k = entry.ir();
        if backend.target == Target::Wgpu && adapter.is_err() {
            println!(
                "{:<44} {:<9} {:<31} no adapter: not run",
                format!("{} [wgpu]", k.name),
                dtype.to_string(),
                moek_kernels::inputs::describe(k.op, &full_shape),
            );
            continue;
        }
        let shape = cut.unwrap_or(full_shape);
        // What dispatch serves a caller asking for this spec's function (op, activation,
        // optional tensors) stored as it stores it, at this size.
        let storage = moek_kernels::ir::Storage::new(dtype, k.quant_block);
        let chosen = dispatch::choose(registry, backend, k.function(), storage, &shape, None)
            .map_or_else(|e| format!("none ({e})"), |c| c.kernel);
        let report = match cases.run(entry, backend.target, dtype, &shape, seed) {
            Ok(report) => report,
            Err(why) => {
                // A wgpu device that cannot run the program (too few bindings) is not a
                // numerical failure; any other backend's refusal is a bug here.
                let device = backend.target == Target::Wgpu;
                println!(
                    "{:<44} {:<9} {:<31} {}: {why}",
                    format!("{} [{}]", k.name, backend.target),
                    dtype.to_string(),
                    moek_kernels::inputs::describe(k.op, &shape),
                    if device { "not run" } else { "FAILED to run" }
                );
                not_run += usize::from(device);
                failed += usize::from(!device);
                continue;
            }
        };
        failed += usize::from(!report.passed());
        print_row(&report, &chosen);
        if cut.is_some() {
            println!(
                "{:<44} run at {}, not the spec's {}: this wgpu adapter is a CPU driver (`--full` runs it)",
                "",
                moek_kernels::inputs::describe(k.op, &shape),
                moek_kernels::inputs::describe(k.op, &full_shape),
            );
        }
    }
    println!("seed {seed}; tolerances: moek_ir::tolerance (docs/numerics.md)");
    // `--filter tiny` runs the tiny model alone.
    if filter.is_none_or(|f| "tiny_gemma4".contains(f)) {
        failed += usize::from(!tiny_model(&backends, adapter.is_ok()));
    }
    #[cfg(feature = "spyre")]
    println!(
        "spyre rows: simulated in DL16; {}",
        moek_spyre::cost::assumptions()
    );
    if not_run > 0 {
        println!(
            "{not_run} wgpu row(s) not run: this device cannot run their programs (see above)"
        );
    }
    println!(
        "check took {:.1} s (CPU ISA {})",
        started.elapsed().as_secs_f64(),
        moek_cpu::isa().name()
    );
    if failed > 0 {
        println!("{failed} variant(s) outside tolerance");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The shared wgpu device as `moek check` describes it.
struct Adapter {
    /// Its name and f16 mode.
    name: String,
    /// Whether it is a CPU driver reached through GL (llvmpipe).
    gl_cpu: bool,
}

/// The shared wgpu device, or why there is none.
fn wgpu_adapter() -> Result<Adapter, String> {
    #[cfg(feature = "wgpu")]
    {
        moek_kernels::wgpu::Gpu::shared()
            .map(|g| Adapter {
                name: format!("{}, f16 loads {:?}", g.name(), g.f16),
                gl_cpu: g.is_gl_cpu(),
            })
            .map_err(|e| e.to_string())
    }
    #[cfg(not(feature = "wgpu"))]
    {
        Err("this build has no `wgpu` feature".to_string())
    }
}

/// The built-in tiny Gemma-4 MoE through every backend: greedy tokens, and whether those that
/// ran agree. A backend with no variant for the tiny sizes says so and is not counted.
fn tiny_model(backends: &[Backend], adapter: bool) -> bool {
    let cfg = moek_model::gemma4::tiny::config();
    let prompt = [2, 17, 5, 9, 33, 41, 7, 12, 3];
    let mut runs: Vec<(Target, Vec<u32>)> = vec![];
    println!(
        "tiny Gemma-4 MoE ({} layers, window {}, {} experts top-{}), bf16, greedy after {} prompt tokens:",
        cfg.layers.len(),
        cfg.sliding_window,
        cfg.moe.map_or(0, |m| m.num_experts),
        cfg.moe.map_or(0, |m| m.top_k_experts),
        prompt.len()
    );
    for backend in backends {
        if backend.target == Target::Wgpu && !adapter {
            println!("  {:<6} no adapter: not run", backend.target.to_string());
            continue;
        }
        let weights = moek_model::gemma4::tiny::weights::<half::bf16>(&cfg);
        let model = moek_model::gemma4::model::Model::new(cfg.clone(), weights, backend.clone());
        let sampling = moek_model::generate::Sampling::greedy();
        let mut trace = vec![];
        match moek_model::generate::generate(
            &model,
            &prompt,
            8,
            Some(4),
            &sampling,
            &[],
            &mut trace,
        ) {
            Ok(tokens) => {
                let fell = trace.iter().filter(|t| t.fallback.is_some()).count();
                let note = if fell > 0 {
                    format!(
                        " ({fell} of {} kernel calls fell back to the CPU: no {} variant at these sizes)",
                        trace.len(),
                        backend.target
                    )
                } else {
                    String::new()
                };
                println!("  {:<6} {tokens:?}{note}", backend.target.to_string());
                // A backend that ran nothing itself adds nothing to the comparison.
                if fell < trace.len() {
                    runs.push((backend.target, tokens));
                }
            }
            Err(e) => println!("  {:<6} not run: {e}", backend.target.to_string()),
        }
    }
    let agree = runs.windows(2).all(|w| w[0].1 == w[1].1);
    println!(
        "  {} backend(s) ran kernels themselves; their greedy tokens {}",
        runs.len(),
        if agree { "agree" } else { "DISAGREE" }
    );
    agree && !runs.is_empty()
}

fn required(backend: &str, why: &str) -> CommandError {
    CommandError::Required {
        backend: backend.to_string(),
        why: why.to_string(),
    }
}

/// One result row; for Spyre the rate is the modeled one (`~`), the time the simulator's.
fn print_row(r: &Report, chosen: &str) {
    let (seconds, mark) = r
        .modeled
        .as_ref()
        .map_or((r.seconds, ""), |m| (m.seconds, "~"));
    let rate = if r.shape.starts_with("T=1 ") || r.flops / r.bytes.max(1.0) < 8.0 {
        format!("{mark}{:.1} GB/s", r.bytes / seconds / 1e9)
    } else {
        format!("{mark}{:.1} GF/s", r.flops / seconds / 1e9)
    };
    let kernel = format!("{} [{}]", r.kernel, r.target);
    println!(
        "{:<44} {:<9} {:<31} {:<30} {:>10.3e} {:>10.3e} {:>9.2} {:>12}  {}",
        kernel,
        r.dtype.to_string(),
        r.shape,
        chosen,
        r.deviation.max_abs,
        r.deviation.rel_l2,
        r.seconds * 1e3,
        rate,
        if r.passed() { "yes" } else { "NO" }
    );
    if let Some(q) = &r.quantization {
        println!(
            "{:<44} the {} quantization itself (reference on the blocks against the reference on bf16 weights): max abs {:.3e}, rel L2 {:.3e}",
            "", r.dtype, q.max_abs, q.rel_l2
        );
    }
    if let Some(m) = &r.modeled {
        println!(
            "{:<44} modeled {:.3} ms ({} bound), {:.1} MB device<->LX, {:.1} KB ring, LX peak {} B",
            "",
            m.seconds * 1e3,
            m.dominant,
            m.dev_bytes as f64 / 1e6,
            m.ring_bytes as f64 / 1e3,
            m.lx_peak
        );
    }
}
