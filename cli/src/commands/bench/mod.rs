//! `moek bench`: the kernels against this machine's floors ([`kernels`]), the whole model at a
//! real geometry ([`model`]), or the kernels on a wgpu adapter ([`wgpu`]).

pub mod kernels;
pub mod model;
mod plot;
#[cfg(feature = "wgpu")]
pub mod wgpu;

use super::figures::Format;
use super::{BackendArg, CommandError};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Timed repetitions per figure (the median is reported).
    #[arg(long, default_value_t = 15)]
    pub iters: usize,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Where the kernels run: the CPU (against this machine's floors) or the wgpu adapter present.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Bench the whole model at this geometry (random weights in memory) instead of the kernels.
    #[arg(long, value_enum)]
    pub geometry: Option<Geometry>,
    /// Layers of the model bench (alternating sliding and full).
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Model bench: write the random weights to a safetensors file (in the temp dir, removed once
    /// mapped) and load them back from it, living where this says. Default: built in memory, in
    /// huge pages.
    #[arg(long, value_enum)]
    pub from_file: Option<moek_model::checkpoint::Residence>,
    /// Model bench: every large matrix (expert banks, embedding, attention's projections, the
    /// dense MLP; not the router) drawn straight into these quantized blocks; bytes per decode
    /// step are counted as stored.
    #[arg(long, value_parser = super::block_formats())]
    pub dtype: Option<moek_kernels::ir::BlockFormat>,
    /// Model bench with `--from-file`: the bf16 file written, quantized to these blocks as it
    /// is loaded (as `--quantize` on `logits`/`generate`).
    #[arg(long, value_parser = super::block_formats(), requires = "from_file", conflicts_with = "dtype")]
    pub quantize: Option<moek_kernels::ir::BlockFormat>,
    /// With `--dtype` or `--quantize`: the expert banks and embedding only, attention and the
    /// dense MLP in bf16.
    #[arg(long)]
    pub quantize_experts_only: bool,
    /// Model bench: force this MoE variant in prefill and decode (as `--variant` on `logits`
    /// and `generate`); one that cannot serve either is an error before anything is timed.
    #[arg(long, requires = "geometry")]
    pub variant: Option<String>,
    /// Model bench: draw each figure against its roof (decode against the probed bandwidth's
    /// ceiling, prefill against the level's peak) into this SVG; without `--dtype` or
    /// `--quantize`, bf16 and every block format are measured, one after another.
    #[arg(long, value_name = "FILE.svg", requires = "geometry")]
    pub plot: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Geometry {
    /// Gemma-4 26B-A4B.
    #[value(name = "26b-a4b")]
    Gemma4_26bA4b,
    /// Qwen3-30B-A3B (H 2048, 128 experts of width 768, top-8; untied 151936-row head).
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// gpt-oss-20b (H 2880, 32 experts of width 2880, top-4, MXFP4 experts unless `--dtype`
    /// names another block format; bf16 attention, untied 201088-row head).
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
}

pub fn run(args: &BenchArgs) -> Result<ExitCode, CommandError> {
    if args.backend == BackendArg::Spyre {
        return Err(CommandError::Usage(
            "`moek bench` measures the cpu and wgpu backends on this machine; the Spyre cost model \
             is `moek spyre-calibrate`"
                .into(),
        ));
    }
    if args.geometry.is_some() {
        // The model's kernels run on the chosen backend; attention and norms on the CPU.
        return model::run(args, args.layers.max(1));
    }
    if args.backend == BackendArg::Wgpu {
        #[cfg(feature = "wgpu")]
        return wgpu::run(args);
        #[cfg(not(feature = "wgpu"))]
        return Err(CommandError::Required {
            backend: "wgpu".into(),
            why: "this build has no `wgpu` feature".into(),
        });
    }
    kernels::run(args)
}
