//! `moek quantize --model DIR --dtype q8|q4 --out DIR2`: the checkpoint with its expert banks in
//! quantized blocks (`u8` tensors of blocks, the format named in the file's metadata; every
//! other tensor as it was), which every command loads as it is. The config and tokenizer files
//! are copied beside it.

use super::CommandError;
use crate::checkpoint::{Checkpoint, LoadError, Residence};
use crate::config::Family;
use crate::gemma4::config::Config;
use crate::gemma4::weights::{self, FromCheckpoint};
use crate::quantized::Quant;
use half::{bf16, f16};
use moek_kernels::Elem;
use safetensors::Dtype;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct QuantizeArgs {
    /// The checkpoint directory to read (config.json + safetensors), left as it is.
    #[arg(long)]
    pub model: PathBuf,
    /// The block format of the expert banks.
    #[arg(long, value_enum)]
    pub dtype: Quant,
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
    let json = crate::config::read(&args.model).map_err(LoadError::from)?;
    if Family::of(&json).map_err(LoadError::from)? != Family::Gemma4 {
        return Err(CommandError::Usage(
            "`moek quantize` writes Gemma-4 checkpoints; Qwen3-MoE runs in its stored dtype".into(),
        ));
    }
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
    let cfg = Config::from_json(&json).map_err(LoadError::from)?;
    let ck = Checkpoint::open(&args.model)?;
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
    let names = weights::names("embed_tokens.weight");
    let written = match ck.dtype(&names)? {
        Dtype::BF16 => write::<bf16>(&ck, &cfg, args.dtype, &partial),
        Dtype::F16 => write::<f16>(&ck, &cfg, args.dtype, &partial),
        Dtype::F32 => write::<f32>(&ck, &cfg, args.dtype, &partial),
        other => Err(LoadError::DType {
            tensor: names[0].clone(),
            expected: "BF16, F16 or F32".into(),
            found: format!("{other:?}"),
        }),
    };
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e.into());
    }
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
    println!(
        "wrote `{}`: expert banks and the embedding in {} blocks, every other tensor as stored; {before} -> {after} bytes ({:.2}x)",
        target.display(),
        args.dtype.dtype(),
        after as f64 / before as f64
    );
    Ok(ExitCode::SUCCESS)
}

/// The weights of `ck`, expert banks quantized as they are read, written to `path`.
fn write<W: Elem>(ck: &Checkpoint, cfg: &Config, q: Quant, path: &Path) -> Result<(), LoadError> {
    let src = FromCheckpoint {
        checkpoint: ck,
        residence: Residence::Mapped,
        quantize: Some(q),
    };
    weights::save::<W>(src, cfg, path)
}

/// Whether `a` and `b` name one directory (`b` may not exist yet).
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
