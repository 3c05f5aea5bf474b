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
        EmitBackend::Wgsl | EmitBackend::Spyre => {
            return Err(CommandError::NoEmitter {
                backend: format!("{backend:?}").to_lowercase(),
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
