//! `moek emit NAME --backend B`: the generated source, from the same IR the macro validated.

use super::{CommandError, spec};
use moek_kernels::ir::Target;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EmitBackend {
    Cpu,
    Wgsl,
    Spyre,
}

pub fn run(name: &str, backend: EmitBackend) -> Result<ExitCode, CommandError> {
    let entry = spec(name)?;
    let ir = entry.ir();
    let target = match backend {
        EmitBackend::Cpu => Target::Cpu,
        EmitBackend::Wgsl => Target::Wgpu,
        EmitBackend::Spyre => Target::Spyre,
    };
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
    match backend {
        EmitBackend::Cpu => print!("{}", moek_dsl::emit::cpu_source(ir)),
        EmitBackend::Spyre => {
            // The same lowering the macro ran; programs differ by dtype only in their `dtype`.
            let program = moek_dsl::spyre::lower::program(ir, ir.dtypes[0]).map_err(|why| {
                CommandError::NoProgram {
                    name: name.to_string(),
                    why: why.to_string(),
                }
            })?;
            println!(
                "{}",
                serde_json::to_string_pretty(&program).expect("programs serialise")
            );
        }
        EmitBackend::Wgsl => {
            return Err(CommandError::NoEmitter {
                backend: "wgsl".into(),
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
