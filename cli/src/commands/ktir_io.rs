//! `moek ktir-io NAME --dir DIR [--seed S] [--compare OUT]`: moek's two ends of the KTIR
//! crosscheck (`scripts/ktir-crosscheck`, docs/ktir.md). Without `--compare`, it draws the spec's
//! f16 inputs from the seed, binds them to its Spyre program's device tensors as the simulator
//! does, writes each as `DIR/<tensor>.npy` in the program's layout and prints the interpreter's
//! arguments (`<tensor>_ptr=DIR/<tensor>.npy ...`). With `--compare OUT`, it draws the same
//! inputs again and holds the interpreter's output (`OUT/<output>_ptr.npy`) to moek's f64
//! reference under the f16 tolerance and to the simulator's DL16 result under the DL16 one,
//! prints the errors, ktir-cpu's latency estimate beside our cost model's, and fails on any
//! mismatch.

use super::npy::{self, Array};
use super::{CommandError, SpecSource, spec};
use half::f16;
use moek_kernels::ir::spyre::{DeviceRole, Program};
use moek_kernels::ir::tolerance::{Deviation, tolerance, tolerance_dl16};
use moek_kernels::ir::{DType, Kernel, Target};
use moek_kernels::testing::Case;
use moek_spyre::Mode;
use moek_spyre::simulate::PhaseCounters;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct KtirIoArgs {
    /// The spec's name (it must target spyre in f16).
    pub name: String,
    /// Where the inputs are written (and read back from with `--compare`).
    #[arg(long)]
    pub dir: PathBuf,
    /// The seed the inputs are drawn from.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The interpreter's output directory: compare its result instead of writing inputs.
    #[arg(long)]
    pub compare: Option<PathBuf>,
    #[command(flatten)]
    pub source: SpecSource,
}

pub fn run(args: &KtirIoArgs) -> Result<ExitCode, CommandError> {
    let entry = spec(&args.source.registry()?, &args.name)?;
    let k = entry.ir();
    if !k.targets.contains(&Target::Spyre) || !k.dtypes.contains(&DType::F16) {
        return Err(CommandError::Usage(format!(
            "`{}` has no f16 Spyre program (KTIR is rendered in f16)",
            k.name
        )));
    }
    let shape = moek_kernels::geometry::real_shape(k);
    let mut case = Case::<f16>::new(k.op, shape, args.seed);
    case.optional = k.optional;
    let p =
        moek_lower::spyre::lower::program_within(k, DType::F16, args.source.lx()).map_err(spyre)?;
    match &args.compare {
        None => write(&p, &case, &args.dir),
        Some(out) => compare(k, &p, &case, out),
    }
}

fn spyre(e: impl std::fmt::Display) -> CommandError {
    CommandError::Usage(format!("the Spyre simulator: {e}"))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> CommandError + '_ {
    move |e| CommandError::Usage(format!("`{}`: {e}", path.display()))
}

/// Every device tensor as `.npy` in the program's layout; prints the interpreter's arguments.
fn write(p: &Program, case: &Case<f16>, dir: &Path) -> Result<ExitCode, CommandError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let dev =
        moek_kernels::spyre::bind(p, &case.shape, &case.inputs(), Mode::F32).map_err(spyre)?;
    let mut args = vec![];
    for t in &p.tensors {
        let path = dir.join(format!("{}.npy", t.name));
        let written = match t.role {
            DeviceRole::Routes => {
                let idx: Vec<i32> = dev.routes[&t.name].iter().map(|&i| i as i32).collect();
                npy::write(&path, Array::I32(&idx), &t.shape)
            }
            _ => {
                let v = dev.tensors[&t.name].to_f32();
                match t.elem_bytes {
                    2 => {
                        let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
                        npy::write(&path, Array::F16(&h), &t.shape)
                    }
                    _ => npy::write(&path, Array::F32(&v), &t.shape),
                }
            }
        };
        written.map_err(io(&path))?;
        args.push(format!("{}_ptr={}", t.name, path.display()));
    }
    println!("{}", args.join(" "));
    Ok(ExitCode::SUCCESS)
}

/// The interpreter's output against the reference and the simulator.
fn compare(
    k: &Kernel,
    p: &Program,
    case: &Case<f16>,
    out: &Path,
) -> Result<ExitCode, CommandError> {
    let output = p
        .tensors
        .iter()
        .find(|t| t.role == DeviceRole::Output)
        .expect("a program has an output");
    let path = out.join(format!("{}_ptr.npy", output.name));
    let got = npy::read_f32(&path).map_err(CommandError::Usage)?;
    let len = moek_kernels::inputs::output_len(k.op, &case.shape);
    if got.len() < len {
        return Err(CommandError::Usage(format!(
            "`{}` holds {} values; the output has {len}",
            path.display(),
            got.len()
        )));
    }
    let got = &got[..len];
    let rows = case.rows().0;
    let want: Vec<f64> = (0..rows)
        .flat_map(|r| case.reference_row(k.activation, r))
        .collect();
    let versus_reference = Deviation::measure(got, &want);
    let mut dl16 = vec![f32::NAN; len];
    let ran =
        moek_kernels::spyre::run_program(p, &case.shape, &case.inputs(), &mut dl16, Mode::Dl16)
            .map_err(spyre)?;
    let simulated: Vec<f64> = dl16.iter().map(|&v| f64::from(v)).collect();
    let versus_simulator = Deviation::measure(got, &simulated);
    let (tol, tol_dl16) = (tolerance(DType::F16), tolerance_dl16(DType::F16));
    let ok = versus_reference.within(tol) && versus_simulator.within(tol_dl16);
    println!(
        "{}: ktir-cpu vs f64 reference {versus_reference} (f16 tolerance {tol:?}); vs the simulator's DL16 result {versus_simulator} (DL16 tolerance {tol_dl16:?})",
        k.name
    );
    let report = std::fs::read_to_string(out.join("latency.json"))
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .unwrap_or_default();
    let latency = report["kernel_time_us"].as_f64();
    println!(
        "{}: ktir-cpu's latency estimate {} (uncalibrated defaults) beside our cost model's {:.1} us",
        k.name,
        latency.map_or("none".to_string(), |us| format!("{us:.1} us")),
        ran.cost.seconds * 1e6
    );
    if let Some(theirs) = report["cores"].as_array() {
        print_counts(&k.name, theirs, &ran.counters);
    }
    println!("{}: {}", k.name, if ok { "PASS" } else { "FAIL" });
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What each core moved and multiplied, per the interpreter's counters and per our simulator's
/// (summed over phases): device memory <-> LX bytes, ring bytes, multiply-adds. The two count
/// differently where docs/ktir.md says (shared broadcast reads, whole sticks, the route reads).
fn print_counts(name: &str, theirs: &[serde_json::Value], phases: &[PhaseCounters]) {
    let cores = phases.iter().map(|p| p.cores.len()).max().unwrap_or(0);
    let ours: Vec<[u64; 3]> = (0..cores)
        .map(|c| {
            phases
                .iter()
                .filter_map(|p| p.cores.get(c))
                .fold([0; 3], |[d, r, m], x| {
                    [d + x.dev_to_lx + x.lx_to_dev, r + x.ring, m + x.macs]
                })
        })
        .collect();
    let theirs: Vec<[u64; 3]> = theirs
        .iter()
        .map(|c| {
            let n = |key: &str| c[key].as_f64().unwrap_or(f64::NAN);
            [n("dram_bytes"), n("comm_bytes"), n("matmul_flops") / 2.0].map(|v| v as u64)
        })
        .collect();
    for (i, what) in ["device<->LX bytes", "ring bytes", "multiply-adds"]
        .iter()
        .enumerate()
    {
        let total = |v: &[[u64; 3]]| v.iter().map(|c| c[i]).sum::<u64>();
        let range = |v: &[[u64; 3]]| {
            let (lo, hi) = v
                .iter()
                .fold((u64::MAX, 0), |(l, h), c| (l.min(c[i]), h.max(c[i])));
            if lo == hi {
                format!("{lo}")
            } else {
                format!("{lo}..{hi}")
            }
        };
        let same = ours
            .iter()
            .zip(&theirs)
            .filter(|(a, b)| a[i] == b[i])
            .count();
        println!(
            "{name}: {what} per core: ktir-cpu {} (total {}), ours {} (total {}); equal on {same} of {} cores",
            range(&theirs),
            total(&theirs),
            range(&ours),
            total(&ours),
            cores.max(theirs.len())
        );
    }
}
