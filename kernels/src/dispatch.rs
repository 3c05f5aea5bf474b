//! Which variant runs: every spec of the op is checked for eligibility on the backend, the most
//! specific eligible one is chosen, and the choice records why (and why each other was not).
//!
//! Specificity: more fixed dims; then more bounded free dims (`T = 2..`); then more schedule
//! decisions; then declaration order. An explicitly requested variant that is not eligible is an
//! error returned before anything is computed or written.

use crate::elem::Elem;
use crate::inputs::{InputError, Inputs};
use crate::registry::KernelEntry;
use moek_ir::reference::Shape;
use moek_ir::{Activation, Capability, DType, Kernel, Op, Target};
use std::fmt;
use thiserror::Error;

/// A backend as dispatch sees it: its target and the capabilities it provides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    pub target: Target,
    pub capabilities: Vec<Capability>,
}

impl Backend {
    /// The CPU reads expert banks in place by route (the checkpoint layout is its indexed-selection
    /// layout, and no read copies the selected weights). It has no LX scratchpad, so it lacks
    /// `lx_completed_sum`: the persistent Spyre-shaped prefill is tested on the CPU but not
    /// dispatched there (the grouped prefill is the CPU's algorithm).
    pub fn cpu() -> Backend {
        Backend {
            target: Target::Cpu,
            capabilities: vec![
                Capability::IndexedSelectionLayout,
                Capability::ReadCopyElision,
            ],
        }
    }

    /// The Spyre simulator: programs read expert banks by route in their stick layouts, complete
    /// split sums over the ring in LX, and read selected weights without copying them first.
    pub fn spyre() -> Backend {
        Backend {
            target: Target::Spyre,
            capabilities: vec![
                Capability::IndexedSelectionLayout,
                Capability::LxCompletedSum,
                Capability::ReadCopyElision,
            ],
        }
    }

    /// wgpu: banks are bound in the checkpoint layout and read by route in place, without a copy.
    /// A GPU has no LX scratchpad (no `lx_completed_sum`). `shader_f16` only where the shared
    /// device reads f16 natively (see `moek_wgpu::F16Mode`).
    pub fn wgpu() -> Backend {
        #[cfg(feature = "wgpu")]
        let f16 = crate::wgpu::Gpu::shared().is_ok_and(|g| g.f16 == moek_wgpu::F16Mode::Native);
        #[cfg(not(feature = "wgpu"))]
        let f16 = false;
        let mut capabilities = vec![
            Capability::IndexedSelectionLayout,
            Capability::ReadCopyElision,
        ];
        if f16 {
            capabilities.push(Capability::ShaderF16);
        }
        Backend {
            target: Target::Wgpu,
            capabilities,
        }
    }

    /// The same backend without one capability (to exercise fallbacks).
    pub fn without(mut self, cap: Capability) -> Backend {
        self.capabilities.retain(|c| *c != cap);
        self
    }

    /// Whether this backend's variants are compiled into this build.
    pub fn compiled(&self) -> bool {
        match self.target {
            Target::Cpu => cfg!(feature = "cpu"),
            Target::Spyre => cfg!(feature = "spyre"),
            Target::Wgpu => cfg!(feature = "wgpu"),
        }
    }
}

/// Why a spec cannot serve a request.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Ineligible {
    #[error("computes `{spec}`, not `{wanted}`")]
    Op { spec: Op, wanted: Op },
    #[error("computes `{wanted}` with {spec}, not {wanted_act}")]
    Activation {
        spec: Activation,
        wanted: Op,
        wanted_act: Activation,
    },
    #[error("does not target {target}")]
    Target { target: Target },
    #[error("needs the `{target}` backend, which this build lacks (cargo feature `{target}`)")]
    NotCompiled { target: Target },
    #[error("has no {dtype} variant (dtypes: {supported})")]
    DType { dtype: DType, supported: String },
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

/// What a caller wants computed: an op and, for gated ops, its activation. An `Op` alone asks
/// for the default activation (gelu_tanh), as a spec that names none has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    pub op: Op,
    pub activation: Activation,
}

impl From<Op> for Task {
    fn from(op: Op) -> Self {
        Task {
            op,
            activation: Activation::default(),
        }
    }
}

/// Whether `entry` can serve `task` on `backend` for `dtype` and `shape`, or why not.
pub fn eligible(
    entry: &KernelEntry,
    backend: &Backend,
    task: impl Into<Task>,
    dtype: DType,
    shape: &Shape,
) -> Result<(), Ineligible> {
    let k = entry.ir();
    let Task { op, activation } = task.into();
    if k.op != op {
        return Err(Ineligible::Op {
            spec: k.op,
            wanted: op,
        });
    }
    if op.has_activation() && k.activation != activation {
        return Err(Ineligible::Activation {
            spec: k.activation,
            wanted: op,
            wanted_act: activation,
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
    if !k.dtypes.contains(&dtype) {
        let supported = k
            .dtypes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        return Err(Ineligible::DType { dtype, supported });
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

/// Picks the variant for `task` (or checks the `requested` one) and records why.
pub fn choose(
    entries: &[KernelEntry],
    backend: &Backend,
    task: impl Into<Task>,
    dtype: DType,
    shape: &Shape,
    requested: Option<&str>,
) -> Result<Choice, DispatchError> {
    let task = task.into();
    let op = task.op;
    let of_op: Vec<&KernelEntry> = entries.iter().filter(|e| e.ir().op == op).collect();
    let mut choice = Choice {
        kernel: String::new(),
        target: backend.target,
        dtype,
        why: String::new(),
        passed_over: vec![],
    };
    if let Some(name) = requested {
        let Some(entry) = of_op.iter().find(|e| e.name() == name) else {
            let valid = of_op
                .iter()
                .map(|e| e.name())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(DispatchError::Unknown {
                name: name.to_string(),
                op,
                valid,
            });
        };
        eligible(entry, backend, task, dtype, shape).map_err(|reason| {
            DispatchError::Requested {
                name: name.to_string(),
                reason,
            }
        })?;
        choice.kernel = name.to_string();
        choice.why = "requested explicitly".to_string();
        return Ok(choice);
    }
    let mut best: Option<(&KernelEntry, (usize, usize, usize))> = None;
    for entry in &of_op {
        match eligible(entry, backend, task, dtype, shape) {
            Err(reason) => choice
                .passed_over
                .push((entry.name().to_string(), format!("it {reason}"))),
            Ok(()) => {
                let rank = specificity(entry.ir());
                if best.is_none_or(|(_, b)| rank > b) {
                    if let Some((prev, _)) = best {
                        choice.passed_over.push((
                            prev.name().to_string(),
                            format!("less specific than {}", entry.name()),
                        ));
                    }
                    best = Some((entry, rank));
                } else {
                    let winner = best.expect("checked above").0.name();
                    choice.passed_over.push((
                        entry.name().to_string(),
                        format!("less specific than {winner}"),
                    ));
                }
            }
        }
    }
    let Some((entry, (fixed, bounded, decisions))) = best else {
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
        "most specific eligible ({fixed} fixed dims, {bounded} bounded, {decisions} schedule decisions)"
    );
    choice
        .passed_over
        .sort_by_key(|(_, why)| why.starts_with("less specific"));
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

/// Runs the chosen (or requested) variant: inputs are validated and the choice is made before any
/// output is written.
pub fn run<W: Elem>(
    entries: &[KernelEntry],
    backend: &Backend,
    shape: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(Choice, Option<u32>), DispatchError> {
    let choice = choose(entries, backend, inputs.op(), W::DTYPE, shape, requested)?;
    inputs.validate(shape, out.len())?;
    let entry = entries
        .iter()
        .find(|e| e.name() == choice.kernel)
        .expect("chosen from entries");
    let result = match backend.target {
        Target::Cpu => {
            let f =
                W::cpu_fn(&entry.cpu).expect("eligible CPU variants are compiled for their dtypes");
            f(shape, inputs, out)
        }
        #[cfg(feature = "spyre")]
        Target::Spyre => {
            let k = entry.ir();
            crate::spyre::run(k, shape, inputs, out, moek_spyre::Mode::Dl16)
                .map_err(|e| DispatchError::Backend(e.to_string()))?;
            None
        }
        #[cfg(feature = "wgpu")]
        Target::Wgpu => crate::wgpu::run(entry.ir(), shape, inputs, out)
            .map_err(|e| DispatchError::Backend(e.to_string()))?,
        #[allow(unreachable_patterns)]
        _ => unreachable!("eligible() refuses backends not compiled in"),
    };
    Ok((choice, result))
}
