//! One module per `moek` subcommand.

pub mod bench;
pub mod check;
pub mod emit;
pub mod figures;
#[cfg(feature = "spyre")]
pub mod ktir_io;
pub mod list;
pub mod npy;
pub mod quantize;
pub mod run;
pub mod spec_text;
#[cfg(feature = "spyre")]
pub mod spyre;
pub mod tune;

use moek_kernels::dispatch::Backend;
use moek_kernels::ir::{BlockFormat, Target};
use thiserror::Error;

/// The one command-line name of a backend (`--backend`). `wgsl` is accepted for `wgpu`: it is
/// the language `moek emit` prints for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    Cpu,
    #[value(alias = "wgsl")]
    Wgpu,
    Spyre,
}

impl BackendArg {
    pub fn target(self) -> Target {
        match self {
            BackendArg::Cpu => Target::Cpu,
            BackendArg::Wgpu => Target::Wgpu,
            BackendArg::Spyre => Target::Spyre,
        }
    }

    pub fn backend(self) -> Backend {
        match self {
            BackendArg::Cpu => Backend::cpu(),
            BackendArg::Wgpu => Backend::wgpu(),
            BackendArg::Spyre => Backend::spyre(),
        }
    }
}

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
    #[error("spec `{name}` has no {backend} program: {why}")]
    NoProgram {
        name: String,
        backend: String,
        why: String,
    },
    #[error("spec `{name}` has no `{dtype}` variant (dtypes: {valid})")]
    DType {
        name: String,
        dtype: String,
        valid: String,
    },
    #[error("backend `{backend}` is required but {why}")]
    Required { backend: String, why: String },
    #[error("{0}")]
    Dispatch(#[from] moek_kernels::DispatchError),
    #[error(transparent)]
    Load(#[from] moek_model::checkpoint::LoadError),
    #[error(transparent)]
    Model(#[from] moek_model::forward::ModelError),
    #[error("{0}")]
    Usage(String),
}

/// A block format as specs spell it (`q8_0`, `q4_0`), the one spelling on the command line too.
pub fn block_formats() -> impl clap::builder::TypedValueParser<Value = BlockFormat> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(BlockFormat::ALL.iter().map(|b| b.name()))
        .map(|s| BlockFormat::from_name(&s).expect("one of the possible values"))
}

/// The spec named `name` in `registry`.
pub fn spec(
    registry: &moek_kernels::Registry,
    name: &str,
) -> Result<moek_kernels::KernelEntry, CommandError> {
    registry
        .get(name)
        .cloned()
        .ok_or_else(|| CommandError::UnknownSpec {
            name: name.to_string(),
        })
}
