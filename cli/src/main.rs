//! `moek`: list, emit, check and benchmark the kernel specs (and, as it lands, run Gemma-4).

use clap::{Parser, Subcommand};
use moek_kernels::Registry;
use std::process::ExitCode;

mod commands;

/// Weights built in memory start on a cache line: the AMX tiles read their rows in place.
#[global_allocator]
static ALLOCATOR: moek_cpu::memory::LineAligned = moek_cpu::memory::LineAligned;

#[derive(Parser, Debug)]
#[command(
    name = "moek",
    version,
    about = "Declared MoE kernels: list, emit, check, tune, bench"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print every spec, one per line: name, op, dims, dtypes, targets, schedule.
    List,
    /// Print the source a backend's emitter generates for one spec.
    Emit {
        /// The spec's name (see `moek list`).
        name: String,
        #[arg(long, value_enum, default_value_t = commands::BackendArg::Cpu)]
        backend: commands::BackendArg,
        /// WGSL: the dtype to emit for (default: the spec's first).
        #[arg(long)]
        dtype: Option<String>,
        /// WGSL: read f16 natively (`enable f16;`) as on an adapter with SHADER_F16.
        #[arg(long)]
        f16: bool,
        /// Spyre: the program as JSON (our format) or as KTIR text (torch-spyre's IR, f16).
        #[arg(long, value_enum, default_value_t = commands::emit::ProgramFormat::Json)]
        format: commands::emit::ProgramFormat,
        #[command(flatten)]
        source: commands::SpecSource,
    },
    /// Run every spec's variants at their real size against the f64 reference.
    Check {
        /// Fail unless these backends run (e.g. `--require cpu`; `wgpu` also needs an adapter).
        #[arg(long, value_enum, value_delimiter = ',')]
        require: Vec<commands::BackendArg>,
        /// Only specs whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// Only these backends (default: every one this build has).
        #[arg(long, value_enum, value_delimiter = ',')]
        backend: Vec<commands::BackendArg>,
        /// Every row at full size, wgpu on a CPU driver included (minutes).
        #[arg(long)]
        full: bool,
    },
    /// Logits of a Gemma-4 checkpoint for the given tokens (JSON).
    Logits(commands::run::LogitsArgs),
    /// Generate tokens from a Gemma-4 checkpoint.
    Generate(commands::run::GenerateArgs),
    /// Write a checkpoint with its expert banks in Q8_0, Q4_0 or MXFP4 blocks.
    Quantize(commands::quantize::QuantizeArgs),
    /// Measure decode bandwidth and prefill throughput against this machine's floors.
    Bench(commands::bench::BenchArgs),
    /// Search the legal schedules of an op; rank them by measurement or the Spyre cost model.
    Tune(commands::tune::TuneArgs),
    /// The Spyre cost model beside the public device figures.
    #[cfg(feature = "spyre")]
    SpyreCalibrate,
    /// The KTIR crosscheck's inputs and comparison (scripts/ktir-crosscheck, docs/ktir.md).
    #[cfg(feature = "spyre")]
    KtirIo(commands::ktir_io::KtirIoArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List => commands::list::run(&Registry::builtin()),
        Command::Emit {
            name,
            backend,
            dtype,
            f16,
            format,
            source,
        } => commands::emit::run(&source, &name, backend, dtype.as_deref(), f16, format),
        Command::Check {
            require,
            filter,
            backend,
            full,
        } => commands::check::run(
            &Registry::builtin(),
            &require,
            &backend,
            filter.as_deref(),
            full,
        ),
        Command::Bench(args) => commands::bench::run(&args),
        Command::Tune(args) => commands::tune::run(&Registry::builtin(), &args),
        Command::Quantize(args) => commands::quantize::run(&args),
        Command::Logits(args) => commands::run::logits(&args),
        Command::Generate(args) => commands::run::generate_cmd(&args),
        #[cfg(feature = "spyre")]
        Command::SpyreCalibrate => commands::spyre::run(),
        #[cfg(feature = "spyre")]
        Command::KtirIo(args) => commands::ktir_io::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
