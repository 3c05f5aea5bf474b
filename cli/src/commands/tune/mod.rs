//! `moek tune`: search the legal schedules of an expert FFN at one geometry, dtype and target;
//! rank them by measurement (cpu) or by the cost model (spyre); print the ranking; write the
//! winner as a spec and remember it in a cache. docs/tuning.md says what the space is, how each
//! target picks and what the cache key holds.

mod cache;
mod measure;
mod space;
#[cfg(feature = "spyre")]
mod spyre;

use super::figures::{Format, print_json};
use super::{BackendArg, CommandError};
use moek_kernels::Registry;
use moek_kernels::dispatch::choose;
use moek_kernels::ir::tensors::Optional;
use moek_kernels::ir::{Activation, DType, Function, Kernel, Op, Target};
use space::{Dims, Problem, Schedule};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use super::spec_text::compile;

#[derive(clap::Args, Debug)]
pub struct TuneArgs {
    /// The op to search (expert_ffn).
    #[arg(long, default_value = "expert_ffn")]
    pub op: String,
    /// Its sizes, e.g. `T=1,R=8,E=128,H=2816,F=704`.
    #[arg(long, conflicts_with = "spec")]
    pub dims: Option<String>,
    /// Search around a spec: its op, sizes, activation and first dtype.
    #[arg(long, conflicts_with = "model")]
    pub spec: Option<String>,
    /// Search the decode expert FFN (one token) a checkpoint's MoE layers dispatch, at its
    /// sizes, activation and storage dtype (`--write` then `--tuned` serves it to the model).
    #[arg(long, conflicts_with = "dims")]
    pub model: Option<PathBuf>,
    /// The element type of weights and activations.
    #[arg(long)]
    pub dtype: Option<String>,
    /// The experts' activation (gelu_tanh, silu, swiglu_clamped).
    #[arg(long)]
    pub activation: Option<String>,
    /// The experts' biases: `gate_up`, `down` or both (gpt-oss has both).
    #[arg(long, value_delimiter = ',')]
    pub bias: Vec<String>,
    #[arg(long, value_enum, default_value_t = BackendArg::Cpu)]
    pub target: BackendArg,
    /// CPU: seconds the measurements may take.
    #[arg(long, default_value_t = 60.0)]
    pub budget: f64,
    /// Spyre: how many of the best are also simulated on values.
    #[arg(long, default_value_t = 3)]
    pub simulate: usize,
    /// Rows of the ranking printed (text).
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Write the winner as `kernel!` text to this file.
    #[arg(long)]
    pub write: Option<PathBuf>,
    /// The cache of winners (default: $XDG_CACHE_HOME/moek/tune.json or ~/.cache/moek/tune.json).
    #[arg(long, conflicts_with = "no_cache")]
    pub cache: Option<PathBuf>,
    /// Neither read nor write the cache.
    #[arg(long)]
    pub no_cache: bool,
}

/// One ranked candidate.
#[derive(Clone, Debug)]
pub struct Ranked {
    pub schedule: Schedule,
    pub kernel: Kernel,
    pub figure: f64,
    pub unit: &'static str,
    /// The figure over the floor (none where the floor is not known: a GPU's).
    pub floor_ratio: Option<f64>,
    /// The built-in's time over this one's (above 1: faster than the built-in; none without one).
    pub vs_builtin: Option<f64>,
    /// Timed calls (cpu).
    pub calls: usize,
    pub simulated: Option<Simulated>,
}

/// A Spyre candidate simulated on values.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Simulated {
    pub passed: bool,
    pub deviation: String,
    /// The simulated run counted the bytes and ring traffic the counting walk did.
    pub counts_agree: bool,
}

/// What a search gathers besides the ranking.
#[derive(Debug, Default)]
pub struct Search {
    pub skipped: BTreeMap<String, usize>,
    pub incumbent_figure: Option<f64>,
    pub floor: Option<f64>,
    bar: Option<indicatif::ProgressBar>,
}

impl Search {
    fn progress(&self, what: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(what.to_string());
            bar.tick();
        }
    }
}

/// What `--format json` prints (and the cache keeps).
#[derive(Debug, serde::Serialize, serde::Deserialize, Clone)]
pub struct Outcome {
    pub op: String,
    pub dims: Dims,
    pub dtype: String,
    pub activation: String,
    /// The experts' biases (`none`, or as a spec names them).
    pub bias: String,
    pub target: String,
    /// The built-in spec dispatch picks at these sizes (none on Spyre at a new geometry).
    pub builtin: Option<String>,
    pub builtin_figure: Option<f64>,
    pub floor: Option<f64>,
    pub candidates: usize,
    pub legal: usize,
    pub pruned: BTreeMap<String, usize>,
    pub skipped: BTreeMap<String, usize>,
    pub ranked: Vec<RankedRow>,
    pub seconds: f64,
    /// The winner as `kernel!` text.
    pub spec: String,
    pub cached: bool,
}

#[derive(Debug, serde::Serialize, serde::Deserialize, Clone)]
pub struct RankedRow {
    pub schedule: String,
    pub figure: f64,
    pub unit: String,
    pub floor_ratio: Option<f64>,
    pub vs_builtin: Option<f64>,
    /// Timed calls behind the figure (cpu; 0 for the cost model).
    pub calls: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<Simulated>,
}

pub fn run(registry: &Registry, args: &TuneArgs) -> Result<ExitCode, CommandError> {
    let start = Instant::now();
    let usage = CommandError::Usage;
    let p = problem(registry, args)?;
    // Where the winner goes must exist before minutes of search are spent on it.
    if let Some(dir) = args.write.as_ref().and_then(|w| w.parent())
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return Err(usage(format!(
            "`--write`: the directory `{}` does not exist",
            dir.display()
        )));
    }
    let target = p.target;
    // A device keeps each candidate's weights across its calls, as the model does (the CPU
    // reads them in place).
    let backend = args.target.backend().with_resident_weights();
    if !backend.compiled() {
        return Err(usage(format!(
            "the {target} backend is not part of this build"
        )));
    }
    let function = Function {
        optional: p.optional,
        ..Function::new(Op::ExpertFfn, p.activation)
    };
    let shape = p.dims.shape();
    // The built-in dispatch picks at these sizes. The measured targets pair every call with it;
    // Spyre, whose built-ins are fixed at their geometries, may have none at a new one.
    let incumbent = match choose(registry, &backend, function, p.dtype, &shape, None) {
        Ok(choice) => Some(super::spec(registry, &choice.kernel)?),
        Err(_) if target == Target::Spyre => None,
        Err(e) => return Err(e.into()),
    };
    let mut all = space::candidates(&p);
    // The built-in's own schedule is a candidate: a search never ends slower than it.
    if let Some(own) = incumbent.as_ref().and_then(|e| Schedule::of(e.ir()))
        && !all.contains(&own)
    {
        all.push(own);
    }
    let key = cache::Key::of(&p, &all);
    let cache_path =
        (!args.no_cache).then(|| args.cache.clone().unwrap_or_else(cache::default_path));
    if let Some(path) = &cache_path
        && let Some(mut hit) = cache::read(path, &key).map_err(usage)?
    {
        hit.cached = true;
        return finish(args, &p, hit);
    }
    let candidates = all.len();
    let checked = space::check(&p, all);
    let legal = checked.legal.len();
    if legal == 0 {
        return Err(usage(format!(
            "no legal schedule for expert_ffn at {} on {target}: {}",
            p.dims.text(),
            reasons(&checked.pruned)
        )));
    }
    let mut search = Search {
        bar: std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {elapsed} tune: {msg}")
                    .expect("a valid template"),
            );
            bar
        }),
        ..Search::default()
    };
    let ranked = match target {
        Target::Cpu | Target::Wgpu => measure::search(
            &p,
            &backend,
            incumbent
                .as_ref()
                .expect("cpu and wgpu have a general built-in"),
            checked.legal,
            args.budget,
            &mut search,
        )
        .map_err(usage)?,
        #[cfg(feature = "spyre")]
        Target::Spyre => spyre::search(
            &p,
            incumbent.as_ref(),
            checked.legal,
            args.simulate,
            &mut search,
        )
        .map_err(usage)?,
        #[cfg(not(feature = "spyre"))]
        Target::Spyre => return Err(usage("the spyre backend is not part of this build".into())),
    };
    if let Some(bar) = search.bar.take() {
        bar.finish_and_clear();
    }
    let winner = ranked.first().ok_or_else(|| {
        usage(format!(
            "every legal schedule was skipped: {}",
            reasons(&search.skipped)
        ))
    })?;
    let name = format!(
        "tuned_expert_ffn_{}_{}",
        target,
        p.dims.text().to_lowercase().replace(['=', ','], "")
    );
    let against = match (&incumbent, search.incumbent_figure) {
        (Some(e), Some(f)) => format!("against the built-in `{}`'s {f:.3}", e.name()),
        _ => "(no built-in spec serves these sizes)".into(),
    };
    let doc = format!(
        "Tuned by `moek tune` for {target} at {} ({}):\n{:.3} {} {against}.",
        p.dims.text(),
        p.dtype,
        winner.figure,
        winner.unit,
    );
    let spec = winner.schedule.spec(&name, &p, &doc);
    // What is written compiles to what was ranked.
    let back =
        compile(&spec).map_err(|e| usage(format!("the winner's spec does not check: {e}")))?;
    if back.schedule != winner.kernel.schedule {
        return Err(usage(format!(
            "the winner's spec states another schedule than the one ranked:\n{spec}"
        )));
    }
    let outcome = Outcome {
        op: "expert_ffn".into(),
        dims: p.dims,
        dtype: p.dtype.to_string(),
        activation: space::activation_text(p.activation),
        bias: space::bias_text(p.optional).unwrap_or_else(|| "none".into()),
        target: target.to_string(),
        builtin: incumbent.as_ref().map(|e| e.name().to_string()),
        builtin_figure: search.incumbent_figure,
        floor: search.floor,
        candidates,
        legal,
        pruned: checked.pruned,
        skipped: search.skipped,
        ranked: ranked
            .iter()
            .map(|r| RankedRow {
                schedule: r.schedule.summary(),
                figure: r.figure,
                unit: r.unit.into(),
                floor_ratio: r.floor_ratio,
                vs_builtin: r.vs_builtin,
                calls: r.calls,
                simulated: r.simulated.clone(),
            })
            .collect(),
        seconds: start.elapsed().as_secs_f64(),
        spec,
        cached: false,
    };
    // A pick whose simulation failed is reported, never remembered.
    if let Some(path) = &cache_path
        && !failed(&outcome)
    {
        cache::write(path, &key, &outcome).map_err(usage)?;
    }
    finish(args, &p, outcome)
}

/// Whether a simulated candidate left the tolerance or counted other bytes than its costing.
fn failed(o: &Outcome) -> bool {
    o.ranked
        .iter()
        .filter_map(|r| r.simulated.as_ref())
        .any(|s| !s.passed || !s.counts_agree)
}

/// Prints the outcome and writes the winner's spec where asked.
fn finish(args: &TuneArgs, p: &Problem, o: Outcome) -> Result<ExitCode, CommandError> {
    if let Some(path) = &args.write {
        std::fs::write(path, &o.spec)
            .map_err(|e| CommandError::Usage(format!("cannot write `{}`: {e}", path.display())))?;
    }
    match args.format {
        Format::Json => print_json(&o),
        Format::Text => {
            println!(
                "expert_ffn {} {} {} on {}: {} candidates, {} legal, {:.1} s{}",
                p.dims.text(),
                o.dtype,
                o.activation,
                o.target,
                o.candidates,
                o.legal,
                o.seconds,
                if o.cached { " (cached)" } else { "" }
            );
            for (why, n) in &o.pruned {
                println!("  pruned {n:>5}: {why}");
            }
            for (why, n) in &o.skipped {
                println!("  skipped {n:>4}: {why}");
            }
            let unit = o.ranked.first().map_or("", |r| r.unit.as_str());
            let figure = |f: Option<f64>| f.map_or("-".into(), |f| format!("{f:.3} {unit}"));
            println!(
                "built-in {}: {}; floor {}",
                o.builtin
                    .as_ref()
                    .map_or("(none at these sizes)".into(), |b| format!("`{b}`")),
                figure(o.builtin_figure),
                figure(o.floor),
            );
            println!(
                "{:>4} {:>10} {:>7} {:>8}  schedule",
                "rank", unit, "floor", "builtin"
            );
            for (i, r) in o.ranked.iter().take(args.top).enumerate() {
                let sim = r.simulated.as_ref().map_or(String::new(), |s| {
                    format!(
                        "  [simulated: {}, {}; counts {}]",
                        if s.passed {
                            "within tolerance"
                        } else {
                            "OUT OF TOLERANCE"
                        },
                        s.deviation,
                        if s.counts_agree { "agree" } else { "DIFFER" }
                    )
                });
                println!(
                    "{:>4} {:>10.3} {:>7} {:>8}  {}{sim}",
                    i + 1,
                    r.figure,
                    r.floor_ratio
                        .map_or("-".into(), |f| format!("{:.0}%", f * 100.0)),
                    r.vs_builtin.map_or("-".into(), |v| format!("{v:.2}x")),
                    r.schedule
                );
            }
            if let Some(path) = &args.write {
                println!("winner written to {}", path.display());
            }
        }
    }
    Ok(if failed(&o) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn reasons(m: &BTreeMap<String, usize>) -> String {
    m.iter()
        .map(|(why, n)| format!("{n} x {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The problem the arguments name.
fn problem(registry: &Registry, args: &TuneArgs) -> Result<Problem, CommandError> {
    let usage = CommandError::Usage;
    if args.op != "expert_ffn" {
        return Err(usage(format!(
            "`--op {}` is not searched yet; `moek tune` searches expert_ffn",
            args.op
        )));
    }
    let target = args.target.target();
    let (dims, spec_dtype, spec_activation, spec_bias) = match (&args.dims, &args.spec, &args.model)
    {
        (Some(d), None, None) => (Dims::parse(d).map_err(usage)?, None, None, None),
        (None, None, Some(dir)) => {
            let (s, activation, dtype) = moek_model::open::expert_ffn(dir)?
                .ok_or_else(|| usage(format!("`{}` has no MoE layer to tune", dir.display())))?;
            let dims = Dims {
                t: 1,
                r: s.r,
                e: s.e,
                h: s.h,
                f: s.f,
            };
            (dims, Some(dtype), Some(activation), None)
        }
        (None, Some(name), None) => {
            let entry = super::spec(registry, name)?;
            let k = entry.ir();
            if k.op != Op::ExpertFfn {
                return Err(usage(format!(
                    "`{name}` is a {} spec; `moek tune` searches expert_ffn",
                    k.op
                )));
            }
            let s = moek_kernels::geometry::real_shape(k);
            (
                Dims {
                    t: s.t,
                    r: s.r,
                    e: s.e,
                    h: s.h,
                    f: s.f,
                },
                k.dtypes.first().copied(),
                Some(k.activation),
                Some(k.optional),
            )
        }
        _ => {
            return Err(usage(
                "say what to tune: `--dims T=..,R=..,E=..,H=..,F=..`, `--spec NAME` or `--model DIR`".into(),
            ));
        }
    };
    let dtype = match &args.dtype {
        Some(d) => DType::from_name(d).ok_or_else(|| {
            usage(format!(
                "unknown dtype `{d}`; valid: {}",
                DType::valid_names()
            ))
        })?,
        None => spec_dtype.unwrap_or(DType::Bf16),
    };
    let activation = match &args.activation {
        Some(a) => activation(a).map_err(usage)?,
        None => spec_activation.unwrap_or_default(),
    };
    let mut optional = spec_bias.unwrap_or_default();
    for b in &args.bias {
        let bias = Optional::bias(b)
            .ok_or_else(|| usage(format!("unknown bias `{b}`; valid: gate_up, down")))?;
        optional = optional.with(bias);
    }
    Ok(Problem {
        dims,
        dtype,
        activation,
        optional,
        target,
    })
}

/// An activation by its spec name; gpt-oss's clamped SwiGLU with its published parameters.
fn activation(name: &str) -> Result<Activation, String> {
    match name {
        "gelu_tanh" => Ok(Activation::GeluTanh),
        "silu" => Ok(Activation::Silu),
        "swiglu_clamped" => Ok(Activation::SwigluClamped {
            limit: 7.0,
            alpha: 1.702,
        }),
        a => Err(format!(
            "unknown activation `{a}`; valid: gelu_tanh, silu, swiglu_clamped"
        )),
    }
}
