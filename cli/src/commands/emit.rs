//! `moek emit NAME --backend B`: the generated source, from the same IR the macro validated.

use super::{BackendArg, CommandError, SpecSource, spec};
use moek_ir::plan::{DeviceCaps, Step};
use moek_kernels::ir::DType;
use moek_lower::wgsl;
use std::process::ExitCode;

/// The binding limit WGSL is emitted for without an adapter: lavapipe's (and WebGPU's usual).
const BINDING_LIMIT: u64 = 128 << 20;

/// How a Spyre program is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgramFormat {
    /// Our program format (docs/spyre-program.md).
    Json,
    /// torch-spyre's KTIR, rendered from the same program in f16 (docs/ktir.md).
    Ktir,
}

pub fn run(
    source: &SpecSource,
    name: &str,
    backend: BackendArg,
    dtype: Option<&str>,
    f16: bool,
    format: ProgramFormat,
) -> Result<ExitCode, CommandError> {
    let entry = spec(&source.registry()?, name)?;
    let ir = entry.ir();
    let target = backend.target();
    if !ir.targets.contains(&target) {
        let targets = ir
            .targets
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(CommandError::NotTargeted {
            name: name.to_string(),
            backend: target.to_string(),
            targets,
        });
    }
    if format == ProgramFormat::Ktir && backend != BackendArg::Spyre {
        return Err(CommandError::Usage(
            "`--format ktir` renders a Spyre program: add `--backend spyre`".into(),
        ));
    }
    match backend {
        BackendArg::Cpu => print!("{}", entry.cpu_source()),
        BackendArg::Spyre => {
            // The same lowering the macro ran; programs differ by dtype only in their `dtype`.
            // KTIR is rendered in f16, the one 16-bit type its interpreter has.
            let dtype = match format {
                ProgramFormat::Json => ir.dtypes[0],
                ProgramFormat::Ktir if ir.dtypes.contains(&DType::F16) => DType::F16,
                ProgramFormat::Ktir => {
                    return Err(CommandError::Usage(format!(
                        "`{name}` has no f16 variant, and KTIR is rendered in f16 (its interpreter has no bf16)"
                    )));
                }
            };
            let program = moek_lower::spyre::lower::program_within(ir, dtype, source.lx())
                .map_err(|why| CommandError::NoProgram {
                    name: name.to_string(),
                    backend: "spyre".into(),
                    why: why.to_string(),
                })?;
            match format {
                ProgramFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&program).expect("programs serialise")
                ),
                ProgramFormat::Ktir => {
                    let text = moek_lower::ktir::render(&program).map_err(|why| {
                        CommandError::NoProgram {
                            name: name.to_string(),
                            backend: "ktir".into(),
                            why: why.to_string(),
                        }
                    })?;
                    print!("{text}");
                }
            }
        }
        BackendArg::Wgpu => {
            let valid = || {
                ir.dtypes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let dtype = match dtype {
                None => ir.dtypes[0],
                Some(d) => DType::from_name(d)
                    .filter(|d| ir.dtypes.contains(d))
                    .ok_or_else(|| CommandError::DType {
                        name: name.to_string(),
                        dtype: d.to_string(),
                        valid: valid(),
                    })?,
            };
            // Free dims take the 26B-A4B sizes `moek check` runs.
            let shape = moek_kernels::geometry::real_shape(ir);
            let dev = DeviceCaps {
                binding_limit: BINDING_LIMIT,
                f16,
            };
            let program =
                wgsl::program(ir, dtype, &shape, &dev).map_err(|why| CommandError::NoProgram {
                    name: name.to_string(),
                    backend: "wgsl".into(),
                    why: why.to_string(),
                })?;
            println!(
                "// emitted for a {} MiB binding limit; steps: {}",
                BINDING_LIMIT >> 20,
                steps(&program.steps)
            );
            print!("{}", program.source);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `gate_up, down_routes_cols0, ..., combine`; a persistent loop shows as `trip[..] x N`.
fn steps(steps: &[Step]) -> String {
    let mut names = vec![];
    let mut trips = 0;
    for s in steps {
        match s {
            Step::Trip(_) => trips += 1,
            Step::Rows { entry, .. } | Step::Elems { entry, .. } | Step::Indirect { entry, .. } => {
                if trips <= 1 {
                    names.push(if trips == 1 {
                        format!("trip[{entry}]")
                    } else {
                        entry.clone()
                    });
                }
            }
            Step::IndirectArgs(_) => {}
        }
    }
    let mut out = names.join(", ");
    if trips > 1 {
        out.push_str(&format!(" ({trips} trips)"));
    }
    out
}
