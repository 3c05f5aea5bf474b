//! One module per `moek` subcommand.

pub mod bench;
pub mod check;
pub mod emit;
pub mod figures;
#[cfg(feature = "spyre")]
pub mod ktir_io;
pub mod list;
#[cfg(feature = "spyre")]
pub mod npy;
pub mod quantize;
pub mod run;
pub mod spec_text;
#[cfg(feature = "spyre")]
pub mod spyre;
pub mod tune;

use moek_kernels::dispatch::Backend;
use moek_kernels::ir::{BlockFormat, Target};
use moek_model::quantized::{Quantize, Scope};
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

/// A block format as specs spell it (`q8_0`, `q4_0`, `mxfp4`), the one spelling on the command
/// line too.
pub fn block_formats() -> impl clap::builder::TypedValueParser<Value = BlockFormat> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(BlockFormat::ALL.iter().map(|b| b.name()))
        .map(|s| BlockFormat::from_name(&s).expect("one of the possible values"))
}

/// `--quantize FORMAT` and `--quantize-experts-only` as the model reads them.
pub fn quantize(format: Option<BlockFormat>, experts_only: bool) -> Option<Quantize> {
    format.map(|format| Quantize {
        format,
        scope: match experts_only {
            true => Scope::Experts,
            false => Scope::Whole,
        },
    })
}

/// Where a command finds its spec: the built-ins, and specs read from a file ahead of them.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct SpecSource {
    /// Specs as `moek tune --write` writes them (several may follow one another), checked as
    /// `kernel!` checks them and ranked ahead of the built-ins.
    #[arg(long)]
    pub specs: Option<std::path::PathBuf>,
    /// Spyre: plan programs within this many bytes of LX per core instead of the device's
    /// budget (2 MiB less 20% reserved), checker included. Only to force a plan the checker
    /// refuses through to the KTIR interpreter and show that its cap refuses it too (docs/ktir.md).
    #[arg(long, value_name = "BYTES")]
    pub lx_budget: Option<usize>,
}

impl SpecSource {
    /// The LX bytes per core Spyre programs are planned within.
    pub fn lx(&self) -> usize {
        self.lx_budget.unwrap_or(moek_kernels::ir::spyre::LX_BUDGET)
    }

    /// The registry the command reads.
    pub fn registry(&self) -> Result<moek_kernels::Registry, CommandError> {
        match &self.specs {
            None => Ok(moek_kernels::Registry::builtin()),
            Some(path) => with_specs_within(path, "--specs", self.lx()),
        }
    }
}

/// The built-in registry with the specs of `path` (spec text, as `moek tune --write` writes it)
/// ranked ahead; `flag` names the option that gave the path in errors.
pub fn with_specs(
    path: &std::path::Path,
    flag: &str,
) -> Result<moek_kernels::Registry, CommandError> {
    with_specs_within(path, flag, moek_kernels::ir::spyre::LX_BUDGET)
}

/// [`with_specs`], the specs' Spyre plans held to `lx` bytes of LX per core (`--lx-budget`).
pub fn with_specs_within(
    path: &std::path::Path,
    flag: &str,
    lx: usize,
) -> Result<moek_kernels::Registry, CommandError> {
    let refused = |why: String| CommandError::Usage(format!("`{flag} {}`: {why}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| refused(e.to_string()))?;
    let kernels = spec_text::compile_all_within(&text, lx).map_err(|e| refused(e.to_string()))?;
    if kernels.is_empty() {
        return Err(refused("the file holds no spec".into()));
    }
    moek_kernels::Registry::builtin()
        .with(
            kernels
                .into_iter()
                .map(moek_kernels::KernelEntry::scheduled),
        )
        .map_err(|e| refused(e.to_string()))
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
