//! The op table: for each op, the tensors it takes (name, role, shape in dims, element class),
//! the optional ones with the condition that binds them, and the shape of its output. Input
//! checks, the typed inputs, the wgpu binder and the WGSL tensor lists are derived from it; a new
//! op is one entry here (with its reference, [`crate::reference`]), a new optional tensor one
//! row and one [`Optional`].

use crate::reference::Shape;
use crate::{DimName, Op};
use serde::{Deserialize, Serialize};
use std::fmt;

/// An optional tensor a spec may declare: bound only when the spec's function names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optional {
    /// The experts' gate/up bias `[E, 2F]` (gpt-oss's), added before the activation.
    GateUpBias,
    /// The experts' down bias `[E, H]`, added to each route's product before its weight.
    DownBias,
    /// A dense MLP's output gate `[H]`: each row scaled by `sigmoid(x . output_gate)`
    /// (Qwen2-MoE's shared experts).
    OutputGate,
}

impl Optional {
    pub const ALL: [Optional; 3] = [
        Optional::GateUpBias,
        Optional::DownBias,
        Optional::OutputGate,
    ];

    /// The tensor's name in the op table (and in `Inputs`, WGSL and Spyre programs).
    pub const fn name(self) -> &'static str {
        match self {
            Optional::GateUpBias => "gate_up_bias",
            Optional::DownBias => "down_bias",
            Optional::OutputGate => "output_gate",
        }
    }

    /// The name a spec's `bias:` key gives this tensor (`gate_up`, `down`), if it is a bias.
    pub fn bias_name(self) -> Option<&'static str> {
        match self {
            Optional::GateUpBias => Some("gate_up"),
            Optional::DownBias => Some("down"),
            Optional::OutputGate => None,
        }
    }

    /// The bias a spec's `bias:` key names `name`.
    pub fn bias(name: &str) -> Option<Optional> {
        Optional::ALL
            .into_iter()
            .find(|o| o.bias_name() == Some(name))
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Optional {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of optional tensors: what a spec declares, what inputs carry, what a caller asks for.
/// Serialised as the list of their names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "Vec<Optional>", into = "Vec<Optional>")]
pub struct Optionals(u8);

impl Optionals {
    pub const NONE: Optionals = Optionals(0);

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn has(self, o: Optional) -> bool {
        self.0 & o.bit() != 0
    }

    /// This set and `o`.
    #[must_use]
    pub const fn with(self, o: Optional) -> Optionals {
        Optionals(self.0 | o.bit())
    }

    /// The members, in [`Optional::ALL`]'s order.
    pub fn iter(self) -> impl Iterator<Item = Optional> {
        Optional::ALL.into_iter().filter(move |&o| self.has(o))
    }
}

impl FromIterator<Optional> for Optionals {
    fn from_iter<I: IntoIterator<Item = Optional>>(it: I) -> Self {
        it.into_iter().fold(Optionals::NONE, Optionals::with)
    }
}

impl From<Vec<Optional>> for Optionals {
    fn from(v: Vec<Optional>) -> Self {
        v.into_iter().collect()
    }
}

impl From<Optionals> for Vec<Optional> {
    fn from(o: Optionals) -> Self {
        o.iter().collect()
    }
}

impl fmt::Display for Optionals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.is_empty() {
            true => f.write_str("no optional tensors"),
            false => {
                let names: Vec<&str> = self.iter().map(Optional::name).collect();
                f.write_str(&names.join(", "))
            }
        }
    }
}

/// What a tensor's elements are, and so which element type carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemClass {
    /// Activations, in the variant's dtype.
    Activation,
    /// Weights, in the variant's dtype (where block-quantized weights will carry their scales).
    Weight,
    /// Always f32 (route weights, an f32 intermediate, the experts' biases: values added as
    /// numbers, a few thousand of them, exact from any storage dtype, so every variant plain or
    /// quantized reads them alike).
    F32,
    /// Route indices, u32.
    Index,
}

/// How a tensor is used, which decides how a backend keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// Per call: activations.
    Input,
    /// Per call: which experts each token routes to, and with what weight.
    Route,
    /// Per model: read-only parameters a device can keep resident.
    Weight,
}

/// One extent of a tensor's shape: a dim, or twice one (a gate/up pair stacked).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Extent {
    Dim(DimName),
    Twice(DimName),
}

/// Per-block scales beside a tensor's elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scales {
    /// None: plain 16- or 32-bit elements (every tensor today; block-quantized weights will
    /// name their block size here).
    None,
}

/// One tensor of an op, row-major in the checkpoint's own layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorDef {
    pub name: &'static str,
    pub role: TensorRole,
    pub class: ElemClass,
    pub shape: &'static [Extent],
    pub scales: Scales,
    /// `None` for a tensor every spec of the op reads; else the optional tensor this row is,
    /// bound only when a spec declares it.
    pub when: Option<Optional>,
}

impl TensorDef {
    const fn new(
        name: &'static str,
        role: TensorRole,
        class: ElemClass,
        shape: &'static [Extent],
    ) -> Self {
        TensorDef {
            name,
            role,
            class,
            shape,
            scales: Scales::None,
            when: None,
        }
    }

    /// This row as the optional tensor `o` (named after it).
    const fn optional(o: Optional, class: ElemClass, shape: &'static [Extent]) -> Self {
        TensorDef {
            when: Some(o),
            ..TensorDef::new(o.name(), TensorRole::Weight, class, shape)
        }
    }

    /// Elements at `s`.
    pub fn len(&self, s: &Shape) -> usize {
        s.elements(self.shape)
    }

    /// Elements of one row (the innermost extent): the reduction a weight row is read along.
    pub fn row_len(&self, s: &Shape) -> usize {
        s.elements(&self.shape[self.shape.len() - 1..])
    }
}

use DimName::{E, F, H, R, T, V};
use ElemClass::{Activation as A, F32, Index, Weight as W};
use Extent::{Dim as D, Twice};
use TensorRole::{Input, Route, Weight};

/// The rows, by the tensor they describe: `Inputs` reads a tensor by its row.
pub const X: TensorDef = TensorDef::new("x", Input, A, &[D(T), D(H)]);
pub const IDX: TensorDef = TensorDef::new("idx", Route, Index, &[D(T), D(R)]);
pub const ROUTE_WEIGHTS: TensorDef = TensorDef::new("weights", Route, F32, &[D(T), D(R)]);
pub const GATE_UP: TensorDef = TensorDef::new("gate_up", Weight, W, &[D(E), Twice(F), D(H)]);
pub const DOWN: TensorDef = TensorDef::new("down", Weight, W, &[D(E), D(H), D(F)]);
pub const ACT: TensorDef = TensorDef::new("act", Input, F32, &[D(T), D(R), D(F)]);
pub const DENSE_GATE: TensorDef = TensorDef::new("gate", Weight, W, &[D(F), D(H)]);
pub const DENSE_UP: TensorDef = TensorDef::new("up", Weight, W, &[D(F), D(H)]);
pub const DENSE_DOWN: TensorDef = TensorDef::new("down", Weight, W, &[D(H), D(F)]);
pub const GATE_UP_BIAS: TensorDef =
    TensorDef::optional(Optional::GateUpBias, F32, &[D(E), Twice(F)]);
pub const DOWN_BIAS: TensorDef = TensorDef::optional(Optional::DownBias, F32, &[D(E), D(H)]);
pub const OUTPUT_GATE: TensorDef = TensorDef::optional(Optional::OutputGate, W, &[D(H)]);
pub const HIDDEN: TensorDef = TensorDef::new("hidden", Input, A, &[D(T), D(H)]);
pub const EMB: TensorDef = TensorDef::new("emb", Weight, W, &[D(V), D(H)]);

/// The most tensors any op binds, its optional ones included.
pub const MAX_TENSORS: usize = 8;

impl Op {
    /// The op's tensors, the optional ones included (after the others), in the order every
    /// backend binds them: a tensor's slot is its index here.
    pub fn tensors(self) -> &'static [TensorDef] {
        match self {
            Op::GateUp => &[X, IDX, GATE_UP],
            Op::Down => &[ACT, IDX, ROUTE_WEIGHTS, DOWN],
            Op::ExpertFfn => &[
                X,
                IDX,
                ROUTE_WEIGHTS,
                GATE_UP,
                DOWN,
                GATE_UP_BIAS,
                DOWN_BIAS,
            ],
            Op::DenseMlp => &[X, DENSE_GATE, DENSE_UP, DENSE_DOWN, OUTPUT_GATE],
            Op::LmHeadRow => &[HIDDEN, EMB],
        }
    }

    /// The shape of the op's f32 output: `[T, R, F]` for gate_up, one `[V]` row for the LM head,
    /// else `[T, H]`.
    pub fn output(self) -> &'static [Extent] {
        match self {
            Op::GateUp => &[D(T), D(R), D(F)],
            Op::LmHeadRow => &[D(V)],
            Op::Down | Op::ExpertFfn | Op::DenseMlp => &[D(T), D(H)],
        }
    }

    /// The tensors bound when `optional` are declared, with their slots, in binding order.
    pub fn bound(self, optional: Optionals) -> impl Iterator<Item = (usize, &'static TensorDef)> {
        self.tensors()
            .iter()
            .enumerate()
            .filter(move |(_, t)| t.when.is_none_or(|o| optional.has(o)))
    }

    /// The optional tensors the op admits.
    pub fn optionals(self) -> Optionals {
        self.tensors().iter().filter_map(|t| t.when).collect()
    }

    /// The slot of `row` in the op's table.
    pub fn slot(self, row: &TensorDef) -> Option<usize> {
        self.tensors().iter().position(|t| t == row)
    }

    /// The op's tensor named `name`.
    pub fn tensor(self, name: &str) -> Option<&'static TensorDef> {
        self.tensors().iter().find(|t| t.name == name)
    }
}

impl Shape {
    /// Elements of a tensor of these extents.
    pub fn elements(&self, extents: &[Extent]) -> usize {
        extents
            .iter()
            .map(|e| match *e {
                Extent::Dim(d) => self.dim(d),
                Extent::Twice(d) => 2 * self.dim(d),
            })
            .product()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every op's tensors use only the op's own dims, names are unique within an op, optional
    /// rows come after the others and are named after their `Optional`, and every table fits
    /// `Inputs`' slots.
    #[test]
    fn tensors_use_their_ops_dims() {
        for &op in Op::ALL {
            let t = op.tensors();
            assert!(t.len() <= MAX_TENSORS, "{op}: more tensors than slots");
            let first_optional = t.iter().position(|t| t.when.is_some()).unwrap_or(t.len());
            assert!(t[first_optional..].iter().all(|t| t.when.is_some()), "{op}");
            for row in t {
                if let Some(o) = row.when {
                    assert_eq!(row.name, o.name());
                }
            }
            let names: Vec<_> = op.tensors().iter().map(|t| t.name).collect();
            let mut unique = names.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(names.len(), unique.len(), "{op}: repeated tensor name");
            for t in op.tensors() {
                for e in t.shape {
                    let (Extent::Dim(d) | Extent::Twice(d)) = *e;
                    assert!(
                        op.dims().contains(&d),
                        "{op}.{}: {d} is not a dim of {op}",
                        t.name
                    );
                }
            }
        }
    }
}
