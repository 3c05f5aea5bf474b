//! Which variant runs: every spec of the op is checked for eligibility on the backend, the most
//! specific eligible one is chosen, and the choice records why (and why each other was not).
//!
//! Specificity: more fixed dims; then more bounded free dims (`T = 2..`); then more schedule
//! decisions; then the lower [`Rank`] in the registry (the built-ins are ranked in declaration
//! order, a user's entries ahead of them). An explicitly requested variant that is not eligible
//! is an error returned before anything is computed or written.

use crate::backend::{self, Runtime};
use crate::inputs::{AnyInputs, InputError, Inputs};
use crate::registry::{KernelEntry, Rank, Registry};
use moek_ir::Element;
use moek_ir::element::quantized_dtype;
use moek_ir::reference::Shape;
use moek_ir::{Capability, DType, Function, Kernel, Op, Storage, Target};
use std::fmt;
use std::sync::Arc;
use thiserror::Error;

/// A backend as dispatch sees it: its runtime (`dyn Runtime`) with its target and the
/// capabilities it provides, and the weights it keeps on its device, if it keeps any.
#[derive(Clone, Debug)]
pub struct Backend {
    pub target: Target,
    pub capabilities: Vec<Capability>,
    pub resident: Option<backend::Resident>,
    pub runtime: Arc<dyn Runtime>,
}

impl PartialEq for Backend {
    fn eq(&self, o: &Backend) -> bool {
        let resident = match (&self.resident, &o.resident) {
            (Some(a), Some(b)) => a.same(b),
            (a, b) => a.is_none() && b.is_none(),
        };
        self.target == o.target && self.capabilities == o.capabilities && resident
    }
}

impl Eq for Backend {}

impl Backend {
    /// The CPU ([`backend::Cpu`]).
    pub fn cpu() -> Backend {
        Backend::of(Target::Cpu)
    }

    /// The Spyre simulator ([`backend::Spyre`]).
    pub fn spyre() -> Backend {
        Backend::of(Target::Spyre)
    }

    /// wgpu on the shared adapter ([`backend::Wgpu`]).
    pub fn wgpu() -> Backend {
        Backend::of(Target::Wgpu)
    }

    /// `target` with every capability its runtime provides.
    pub fn of(target: Target) -> Backend {
        Backend::new(backend::runtime(target))
    }

    /// The backend `runtime` runs, with every capability it provides.
    pub fn new(runtime: Arc<dyn Runtime>) -> Backend {
        Backend {
            target: runtime.target(),
            capabilities: runtime.capabilities(),
            resident: None,
            runtime,
        }
    }

    /// The same backend keeping every weight it runs on its device, uploaded once and shared by
    /// this backend's clones (on wgpu; other targets read host memory and ignore it). Weights
    /// are recognised by address and length, so every weight slice run through it must stay
    /// allocated and unchanged while it (or a clone) is in use: a loaded model's weights,
    /// owned beside it and read-only, are; a test's freshly drawn ones are not.
    pub fn with_resident_weights(mut self) -> Backend {
        if self.target == Target::Wgpu {
            self.resident = Some(backend::Resident::default());
        }
        self
    }

    /// The same backend without one capability (to exercise fallbacks).
    pub fn without(mut self, cap: Capability) -> Backend {
        self.capabilities.retain(|c| *c != cap);
        self
    }

    /// Whether this backend's variants are compiled into this build.
    pub fn compiled(&self) -> bool {
        self.runtime.compiled()
    }
}

/// Why a spec cannot serve a request.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Ineligible {
    #[error("computes `{spec}`, not `{wanted}`")]
    Function { spec: Function, wanted: Function },
    #[error("does not target {target}")]
    Target { target: Target },
    #[error("needs the `{target}` backend, which this build lacks (cargo feature `{target}`)")]
    NotCompiled { target: Target },
    #[error("has no {dtype} variant (dtypes: {supported})")]
    DType { dtype: DType, supported: String },
    #[error("reads {dtype} weights in blocks of {spec} values, not {wanted}")]
    QuantBlock {
        dtype: DType,
        spec: usize,
        wanted: usize,
    },
    #[error("serves {dim} in {range}, the problem has {dim}={got}")]
    Range {
        dim: moek_ir::DimName,
        range: String,
        got: usize,
    },
    #[error("is fixed at {dim}={fixed}, the problem has {dim}={got}")]
    Dim {
        dim: moek_ir::DimName,
        fixed: usize,
        got: usize,
    },
    #[error("requires capability `{capability}`, which the {target} backend lacks")]
    Capability {
        capability: Capability,
        target: Target,
    },
}

/// The variant dispatch picked, and the record of why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub kernel: String,
    pub target: Target,
    pub dtype: DType,
    /// Why this one: explicit request, or most specific.
    pub why: String,
    /// Every other spec of the op, with why it was not chosen.
    pub passed_over: Vec<(String, String)>,
}

impl fmt::Display for Choice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} ({}): {}",
            self.kernel, self.target, self.dtype, self.why
        )?;
        for (name, why) in &self.passed_over {
            write!(f, "; not {name}: {why}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum DispatchError {
    #[error("no variant of `{op}` is eligible on {target} for {dtype} {shape}: {reasons}")]
    NoneEligible {
        op: Op,
        target: Target,
        dtype: DType,
        shape: String,
        reasons: String,
    },
    #[error("variant `{name}` was requested but is not eligible: it {reason}")]
    Requested { name: String, reason: Ineligible },
    #[error("no variant is named `{name}`; variants of `{op}`: {valid}")]
    Unknown { name: String, op: Op, valid: String },
    #[error(transparent)]
    Input(#[from] InputError),
    #[error("the backend failed: {0}")]
    Backend(String),
}

/// Whether `entry` can serve `function` on `backend`, stored as `storage`, at `shape`, or why
/// not.
pub fn eligible(
    entry: &KernelEntry,
    backend: &Backend,
    function: impl Into<Function>,
    storage: impl Into<Storage>,
    shape: &Shape,
) -> Result<(), Ineligible> {
    let k = entry.ir();
    let (wanted, storage) = (function.into(), storage.into());
    if k.function() != wanted {
        return Err(Ineligible::Function {
            spec: k.function(),
            wanted,
        });
    }
    if !k.targets.contains(&backend.target) {
        return Err(Ineligible::Target {
            target: backend.target,
        });
    }
    if !backend.compiled() {
        return Err(Ineligible::NotCompiled {
            target: backend.target,
        });
    }
    let dtype = storage.dtype;
    if !k.dtypes.contains(&dtype) {
        let supported = k
            .dtypes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Ineligible::DType { dtype, supported });
    }
    if dtype.is_quantized() && k.quant_block != storage.values {
        return Err(Ineligible::QuantBlock {
            dtype,
            spec: k.quant_block,
            wanted: storage.values,
        });
    }
    for d in &k.dims {
        let got = shape.dim(d.name);
        if !d.admits(got) {
            return Err(match d.size {
                Some(fixed) => Ineligible::Dim {
                    dim: d.name,
                    fixed,
                    got,
                },
                None => {
                    let range = d
                        .to_string()
                        .split_once('=')
                        .map_or(String::new(), |(_, r)| r.to_string());
                    Ineligible::Range {
                        dim: d.name,
                        range,
                        got,
                    }
                }
            });
        }
    }
    for &capability in &k.requires {
        if !backend.capabilities.contains(&capability) {
            return Err(Ineligible::Capability {
                capability,
                target: backend.target,
            });
        }
    }
    Ok(())
}

/// Picks the variant for `function` (or checks the `requested` one) and records why.
pub fn choose(
    registry: &Registry,
    backend: &Backend,
    function: impl Into<Function>,
    storage: impl Into<Storage>,
    shape: &Shape,
    requested: Option<&str>,
) -> Result<Choice, DispatchError> {
    let (function, storage) = (function.into(), storage.into());
    let (op, dtype) = (function.op, storage.dtype);
    let of_op: Vec<(Rank, &KernelEntry)> =
        registry.ranked().filter(|(_, e)| e.ir().op == op).collect();
    let mut choice = Choice {
        kernel: String::new(),
        target: backend.target,
        dtype,
        why: String::new(),
        passed_over: vec![],
    };
    if let Some(name) = requested {
        let Some((_, entry)) = of_op.iter().find(|(_, e)| e.name() == name) else {
            let valid = of_op
                .iter()
                .map(|(_, e)| e.name())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(DispatchError::Unknown {
                name: name.to_string(),
                op,
                valid,
            });
        };
        eligible(entry, backend, function, storage, shape).map_err(|reason| {
            DispatchError::Requested {
                name: name.to_string(),
                reason,
            }
        })?;
        choice.kernel = name.to_string();
        choice.why = "requested explicitly".to_string();
        return Ok(choice);
    }
    // In rank order: an equally specific entry later in the list never displaces the first.
    let mut best: Option<(&KernelEntry, Rank, (usize, usize, usize))> = None;
    for &(rank, entry) in &of_op {
        match eligible(entry, backend, function, storage, shape) {
            Err(reason) => choice
                .passed_over
                .push((entry.name().to_string(), format!("it {reason}"))),
            Ok(()) => {
                let spec = specificity(entry.ir());
                if best.is_none_or(|(_, _, b)| spec > b) {
                    if let Some((prev, _, _)) = best {
                        choice.passed_over.push((
                            prev.name().to_string(),
                            format!("less specific than {}", entry.name()),
                        ));
                    }
                    best = Some((entry, rank, spec));
                } else {
                    let (winner, winner_rank, b) = best.expect("checked above");
                    let why = if spec == b {
                        format!(
                            "as specific as {}, ranked after it ({rank} vs {winner_rank})",
                            winner.name()
                        )
                    } else {
                        format!("less specific than {}", winner.name())
                    };
                    choice.passed_over.push((entry.name().to_string(), why));
                }
            }
        }
    }
    let Some((entry, rank, (fixed, bounded, decisions))) = best else {
        let reasons = choice
            .passed_over
            .iter()
            .map(|(n, w)| format!("{n}: {w}"))
            .collect::<Vec<_>>()
            .join("; ");
        let shape = crate::inputs::describe(op, shape);
        return Err(DispatchError::NoneEligible {
            op,
            target: backend.target,
            dtype,
            shape,
            reasons,
        });
    };
    choice.kernel = entry.name().to_string();
    choice.why = format!(
        "most specific eligible ({fixed} fixed dims, {bounded} bounded, {decisions} schedule decisions; {rank})"
    );
    choice
        .passed_over
        .sort_by_key(|(_, why)| why.starts_with("less specific") || why.starts_with("as specific"));
    Ok(choice)
}

/// (fixed dims, bounded free dims, schedule decisions): larger is more specific.
fn specificity(k: &Kernel) -> (usize, usize, usize) {
    let s = &k.schedule;
    let decisions = s.reduce.len()
        + s.columns.len()
        + s.cores.len()
        + usize::from(s.groups.is_some())
        + usize::from(s.persistent.is_some())
        + s.stream.len();
    (
        k.dims.iter().filter(|d| d.size.is_some()).count(),
        k.dims.iter().filter(|d| d.is_bounded()).count(),
        decisions,
    )
}

/// Runs the chosen (or requested) variant of the inputs' op, with the default activation and
/// the optional tensors the inputs carry: inputs are validated and the choice is made before
/// any output is written.
pub fn run<W: Element>(
    registry: &Registry,
    backend: &Backend,
    shape: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(Choice, backend::Ran), DispatchError> {
    let function = inputs.function(Default::default());
    run_function(registry, backend, function, shape, inputs, out, requested)
}

/// [`run`] for `function`: the inputs' op and optional tensors, with its activation.
pub fn run_function<W: Element>(
    registry: &Registry,
    backend: &Backend,
    function: Function,
    shape: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(Choice, backend::Ran), DispatchError> {
    let inputs = AnyInputs::new(inputs, W::DTYPE);
    run_any(registry, backend, function, shape, &inputs, out, requested)
}

/// [`run_function`] for weights in blocks of `Q` beside activations in `A` (the quantized
/// dtypes).
pub fn run_quantized<Q: Element, A: Element>(
    registry: &Registry,
    backend: &Backend,
    function: Function,
    shape: &Shape,
    inputs: &Inputs<'_, Q, A>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(Choice, backend::Ran), DispatchError> {
    let inputs = AnyInputs::new(inputs, quantized_dtype::<Q, A>());
    run_any(registry, backend, function, shape, &inputs, out, requested)
}

/// The one run path, for inputs of any storage: the choice for `function` is made and the inputs
/// validated before anything runs, so a refusal leaves `out` untouched.
pub fn run_any(
    registry: &Registry,
    backend: &Backend,
    function: Function,
    shape: &Shape,
    inputs: &AnyInputs<'_, '_>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(Choice, backend::Ran), DispatchError> {
    assert_eq!(
        (function.op, function.optional),
        (inputs.op, inputs.optional),
        "a function runs on inputs of its own op, with its own optional tensors"
    );
    let choice = choose(
        registry,
        backend,
        function,
        inputs.storage,
        shape,
        requested,
    )?;
    inputs.validate(shape, out.len())?;
    let entry = registry
        .get(&choice.kernel)
        .expect("chosen from the registry");
    let ran = backend::run(backend, entry, shape, inputs, out).map_err(DispatchError::Backend)?;
    Ok((choice, ran))
}
