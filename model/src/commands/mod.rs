//! One module per `moek` subcommand.

pub mod bench;
pub mod check;
pub mod emit;
pub mod list;
#[cfg(feature = "spyre")]
pub mod spyre;

use thiserror::Error;

/// What a command can fail with (besides a failed check, which is an exit code).
#[derive(Debug, Error)]
pub enum CommandError {
    #[error("no spec is named `{name}`; run `moek list` to see them")]
    UnknownSpec { name: String },
    #[error("spec `{name}` does not target {backend} (targets: {targets})")]
    NotTargeted {
        name: String,
        backend: String,
        targets: String,
    },
    #[error("the {backend} emitter is not part of this build yet; available: cpu, spyre")]
    NoEmitter { backend: String },
    #[error("spec `{name}` has no Spyre program: {why}")]
    NoProgram { name: String, why: String },
    #[error("backend `{backend}` is required but {why}")]
    Required { backend: String, why: String },
    #[error("{0}")]
    Dispatch(#[from] moek_kernels::DispatchError),
}

/// The built-in spec named `name`.
pub fn spec(name: &str) -> Result<&'static moek_kernels::KernelEntry, CommandError> {
    moek_kernels::specs::all()
        .iter()
        .find(|e| e.name() == name)
        .ok_or_else(|| CommandError::UnknownSpec {
            name: name.to_string(),
        })
}
