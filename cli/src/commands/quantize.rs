//! `moek quantize --model DIR --dtype q8_0|q4_0|mxfp4 --out DIR2 [--quantize-experts-only]`: the
//! checkpoint, of any family, with the tensors its family row names (`open::FamilyRow::quantized`:
//! every large matrix but the routers, or the expert banks, embedding and LM head only) in
//! quantized blocks (`u8` tensors of blocks, the format named in the file's
//! metadata; every other tensor as it was), which every command loads as it is. The config and
//! tokenizer files are copied beside it.

use super::CommandError;
use moek_kernels::ir::BlockFormat;
use moek_model::checkpoint::{Checkpoint, LoadError};
use moek_model::config::Family;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct QuantizeArgs {
    /// The checkpoint directory to read (config.json + safetensors), left as it is.
    #[arg(long)]
    pub model: PathBuf,
    /// The block format of every large matrix the family quantizes (the expert banks, the
    /// embedding or LM head, attention's projections and the dense MLPs; never the routers).
    #[arg(long, value_parser = super::block_formats())]
    pub dtype: BlockFormat,
    /// Leave attention and the dense MLPs as they are (the expert banks, embedding and LM head
    /// only).
    #[arg(long)]
    pub quantize_experts_only: bool,
    /// The directory to write (created if missing; it must not hold a checkpoint already).
    #[arg(long)]
    pub out: PathBuf,
}

/// Files copied beside the quantized weights when the source has them.
const BESIDE: [&str; 5] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
];

pub fn run(args: &QuantizeArgs) -> Result<ExitCode, CommandError> {
    let json = moek_model::config::read(&args.model).map_err(LoadError::from)?;
    let row = moek_model::open::family(Family::of(&json).map_err(LoadError::from)?);
    let target = args.out.join("model.safetensors");
    if same_dir(&args.model, &args.out) {
        return Err(CommandError::Usage(format!(
            "--out `{}` is the checkpoint being read; write the quantized one elsewhere",
            args.out.display()
        )));
    }
    if target.exists() || args.out.join("model.safetensors.index.json").exists() {
        return Err(CommandError::Usage(format!(
            "`{}` already holds a checkpoint; remove it or choose another --out",
            args.out.display()
        )));
    }
    // The source opens as its family's model (mapped) before anything is written, so a config
    // or tensor it would refuse fails here, not at the next load; its checkpoint is the one read.
    let options = moek_model::open::Options {
        weights: Some(moek_model::checkpoint::Residence::Mapped),
        ..Default::default()
    };
    let source = moek_model::open::open(&args.model, &options)?;
    let ck = source.checkpoint();
    if let Some(q) = ck.quantization() {
        return Err(CommandError::Usage(format!(
            "`{}` is already quantized ({q}); quantize from the checkpoint it was made from",
            args.model.display()
        )));
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    std::fs::create_dir_all(&args.out).map_err(io(&args.out))?;
    // Written under a temporary name and renamed: a failed run leaves no half a checkpoint.
    let partial = args.out.join("model.safetensors.partial");
    let quant = super::quantize(Some(args.dtype), args.quantize_experts_only).expect("a format");
    let in_blocks = match moek_model::quantized::write_quantized(ck, row.quantized, quant, &partial)
    {
        Ok(names) => names,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e.into());
        }
    };
    std::fs::rename(&partial, &target).map_err(io(&target))?;
    for name in BESIDE {
        let from = args.model.join(name);
        if from.exists() {
            let to = args.out.join(name);
            std::fs::copy(&from, &to).map_err(io(&to))?;
        }
    }
    let before = ck.bytes();
    let after = Checkpoint::open(&args.out)?.bytes();
    // Named as the family's row chose them: all of them when few (gpt-oss: the LM head alone).
    let named = match in_blocks.as_slice() {
        [] => "no tensor".to_string(),
        few @ ([_] | [_, _] | [_, _, _]) => few
            .iter()
            .map(|n| format!("`{n}`"))
            .collect::<Vec<_>>()
            .join(", "),
        many => format!("{} tensors (`{}`, ...)", many.len(), many[0]),
    };
    println!(
        "wrote `{}`: {named} in {} blocks, every other tensor as stored; {before} -> {after} bytes ({:.2}x)",
        target.display(),
        args.dtype,
        after as f64 / before as f64
    );
    Ok(ExitCode::SUCCESS)
}

/// Whether `a` and `b` name one directory (`b` may not exist yet).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
