//! `moek logits` and `moek generate`: a checkpoint directory (or the built-in tiny model) run on
//! the generated kernels of the chosen backend.

use super::figures::Format;
use super::{BackendArg, CommandError};
use moek_kernels::ir::BlockFormat;
use moek_model::checkpoint::Residence;
use moek_model::forward::{Cache, CausalLm, Head, Trace};
use moek_model::generate::{Sampling, generate};
use moek_model::open::Options;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face checkpoint directory (config.json + safetensors) of a family moek runs:
    /// Gemma-4 (`gemma4_text`, `gemma4`) or Qwen3-MoE (`qwen3_moe`), by its `model_type`.
    #[arg(long)]
    pub model: PathBuf,
    /// Comma-separated token ids. (A negative one is read as a value, so the error names
    /// `--tokens`.)
    #[arg(long, value_delimiter = ',', num_args = 0.., allow_negative_numbers = true)]
    pub tokens: Vec<u32>,
    /// Where the generated kernels (MoE, dense MLP, LM head) run.
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub backend: BackendArg,
    /// Log, per layer and step, which variant ran and why the others did not.
    #[arg(long)]
    pub explain: bool,
    /// Force this MoE variant (an ineligible one is an error before anything runs).
    #[arg(long)]
    pub variant: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Where the weight matrices live: `huge-pages` copies them at load (on machines that stream
    /// 4 KiB pages slowly, the CPU's decode gains up to twice), `mapped` reads the file in place
    /// (nothing is copied). Default: huge pages on the CPU backend; mapped on the others, whose
    /// kernels read what they uploaded.
    #[arg(long, value_enum)]
    pub weights: Option<Residence>,
    /// Quantize every large matrix to these blocks as it is loaded: the expert banks, the
    /// embedding and LM head the family quantizes, attention's projections and the dense MLPs
    /// (matrices a checkpoint already stores quantized are read as they are; the routers stay
    /// in the checkpoint's dtype, norms and scales in f32).
    #[arg(long, value_parser = super::block_formats())]
    pub quantize: Option<BlockFormat>,
    /// With `--quantize`: leave attention and the dense MLPs in the checkpoint's dtype
    /// (quantize the expert banks, embedding and LM head only).
    #[arg(long, requires = "quantize")]
    pub quantize_experts_only: bool,
    /// Specs as `moek tune --write` writes them (several may follow one another in the file):
    /// checked as `kernel!` checks them, run from their schedules (no rebuild), ranked ahead of
    /// the built-ins. `--explain` names the ones that ran.
    #[arg(long)]
    pub tuned: Option<PathBuf>,
}

impl ModelArgs {
    /// What `moek_model::open` is asked for: the built-in specs (the tuned ones ahead of them),
    /// the flags' backend, weights, quantization and forced variant.
    pub fn options(&self) -> Result<Options, CommandError> {
        let mut options = Options {
            backend: self.backend.backend(),
            quantize: super::quantize(self.quantize, self.quantize_experts_only),
            weights: self.weights,
            variant: self.variant.clone(),
            ..Options::default()
        };
        if let Some(path) = &self.tuned {
            options.registry = std::sync::Arc::new(super::with_specs(path, "--tuned")?);
        }
        Ok(options)
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub common: ModelArgs,
    /// Every row's logits, not only the last.
    #[arg(long)]
    pub all: bool,
}

#[derive(clap::Args, Debug, Clone)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub common: ModelArgs,
    /// Text to encode with the checkpoint's tokenizer.json (instead of --tokens).
    #[arg(long)]
    pub prompt: Option<String>,
    #[arg(long)]
    pub max_new_tokens: usize,
    #[arg(long)]
    pub greedy: bool,
    /// Prefill in chunks of this many tokens.
    #[arg(long)]
    pub prefill_chunk: Option<usize>,
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// What to do with a loaded model, of any family and storage dtype (`eos`: its stop tokens
/// from config.json).
trait Job {
    fn run(self, model: &impl CausalLm, eos: &[u32]) -> Result<ExitCode, CommandError>;
}

pub fn logits(args: &LogitsArgs) -> Result<ExitCode, CommandError> {
    with_model(&args.common, LogitsJob(args))
}

pub fn generate_cmd(args: &GenerateArgs) -> Result<ExitCode, CommandError> {
    let tokenizer = tokenizer(&args.common.model, args.prompt.is_some())?;
    let mut args = args.clone();
    match (&args.prompt, args.common.tokens.is_empty()) {
        (Some(_), false) => {
            return Err(CommandError::Usage(
                "give --tokens or --prompt, not both".into(),
            ));
        }
        (Some(text), true) => {
            let tok = tokenizer.as_ref().expect("required above");
            let enc = tok.encode(text.as_str(), true).map_err(|e| {
                CommandError::Usage(format!("tokenizer.json cannot encode the prompt: {e}"))
            })?;
            args.common.tokens = enc.get_ids().to_vec();
        }
        (None, _) => {}
    }
    with_model(&args.common, GenerateJob(&args, tokenizer.as_ref()))
}

/// `DIR/tokenizer.json` through the `tokenizers` crate, when present (an error when `required`).
fn tokenizer(dir: &Path, required: bool) -> Result<Option<tokenizers::Tokenizer>, CommandError> {
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        return if required {
            Err(CommandError::Usage(format!(
                "--prompt needs `{}`, which does not exist; pass --tokens",
                path.display()
            )))
        } else {
            Ok(None)
        };
    }
    tokenizers::Tokenizer::from_file(&path)
        .map(Some)
        .map_err(|e| CommandError::Usage(format!("cannot read `{}`: {e}", path.display())))
}

fn with_model(args: &ModelArgs, job: impl Job) -> Result<ExitCode, CommandError> {
    if args.tokens.is_empty() {
        return Err(CommandError::Usage(
            "no tokens: give --tokens (or --prompt)".into(),
        ));
    }
    let options = args.options()?;
    let residence = options.residence();
    let bar = indicatif::ProgressBar::new(0)
        .with_style(
            indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len} layers ({msg})")
                .expect("a valid template"),
        )
        .with_message(match residence {
            Residence::Mapped => "mapped in place",
            Residence::HugePages => "copying into huge pages",
        });
    let model = moek_model::open::open_with_progress(&args.model, &options, |n, of| {
        bar.set_length(of as u64);
        bar.set_position(n as u64);
    });
    bar.finish_and_clear();
    let model = model?;
    let eos = model.eos().to_vec();
    job.run(&model, &eos)
}

/// `--explain`: one line per dispatch, to stderr; on a device backend, each step's bytes sent to
/// the device after its lines.
pub fn explain(trace: &[Trace]) {
    let mut step_start = 0;
    for (i, t) in trace.iter().enumerate() {
        let layer = if t.layer == usize::MAX {
            "head".to_string()
        } else {
            format!("layer {}", t.layer)
        };
        eprintln!("{layer} {} ({} tokens): {}", t.what, t.tokens, t.choice);
        if let Some(why) = &t.fallback {
            eprintln!("  (fell back to the CPU: {why})");
        }
        // A step's records are consecutive and share its position.
        if trace.get(i + 1).is_none_or(|n| n.position != t.position) {
            if let Some(up) = moek_model::forward::uploaded(&trace[step_start..=i]) {
                eprintln!(
                    "step at position {}: uploaded {} weight bytes, {} bytes of activations, \
                     routes and outputs",
                    t.position, up.weights, up.other
                );
            }
            step_start = i + 1;
        }
    }
}

struct LogitsJob<'a>(&'a LogitsArgs);

impl Job for LogitsJob<'_> {
    fn run(self, model: &impl CausalLm, _: &[u32]) -> Result<ExitCode, CommandError> {
        let a = self.0;
        let tokens = &a.common.tokens;
        let mut trace = vec![];
        let head = if a.all { Head::All } else { Head::Last };
        let rows = model.forward(tokens, &mut Cache::default(), head, &mut trace)?;
        if a.common.explain {
            explain(&trace);
        }
        let first = if a.all { 0 } else { tokens.len() - 1 };
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .enumerate()
            .map(|(i, l)| serde_json::json!({"position": first + i, "logits": l}))
            .collect();
        println!("{}", serde_json::json!({ "rows": rows }));
        Ok(ExitCode::SUCCESS)
    }
}

struct GenerateJob<'a>(&'a GenerateArgs, Option<&'a tokenizers::Tokenizer>);

impl Job for GenerateJob<'_> {
    fn run(self, model: &impl CausalLm, eos: &[u32]) -> Result<ExitCode, CommandError> {
        let a = self.0;
        let sampling = Sampling {
            greedy: a.greedy,
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
        };
        let stop = stop_tokens(&a.common.model, eos);
        let mut trace = vec![];
        let out = generate(
            model,
            &a.common.tokens,
            a.max_new_tokens,
            a.prefill_chunk,
            &sampling,
            &stop,
            &mut trace,
        )?;
        if a.common.explain {
            explain(&trace);
        }
        let text = self.1.and_then(|t| t.decode(&out, true).ok());
        match a.common.format {
            Format::Json => match &text {
                Some(text) => println!("{}", serde_json::json!({ "tokens": out, "text": text })),
                None => println!("{}", serde_json::json!({ "tokens": out })),
            },
            Format::Text => {
                let ids: Vec<String> = out.iter().map(ToString::to_string).collect();
                println!("{}", ids.join(","));
                if let Some(text) = text {
                    println!("{text}");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Stop tokens: generation_config.json's `eos_token_id` when present, else config.json's.
pub fn stop_tokens(dir: &Path, eos: &[u32]) -> Vec<u32> {
    let from_file = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| moek_model::config::eos_tokens(v.get("eos_token_id")?));
    from_file.unwrap_or_else(|| eos.to_vec())
}
