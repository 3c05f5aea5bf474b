//! The op table: for each op, the tensors it takes (name, role, shape in dims, element class)
//! and the shape of its output. Input checks, the wgpu binder and the WGSL tensor lists are
//! derived from it; a new op is one entry here (with its reference, [`crate::reference`]).

use crate::reference::Shape;
use crate::{DimName, Op};

/// What a tensor's elements are, and so which element type carries them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemClass {
    /// Activations, in the variant's dtype.
    Activation,
    /// Weights, in the variant's dtype (where block-quantized weights will carry their scales).
    Weight,
    /// Always f32 (route weights, an f32 intermediate).
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

const X: TensorDef = TensorDef::new("x", Input, A, &[D(T), D(H)]);
const IDX: TensorDef = TensorDef::new("idx", Route, Index, &[D(T), D(R)]);
const ROUTE_WEIGHTS: TensorDef = TensorDef::new("weights", Route, F32, &[D(T), D(R)]);
const GATE_UP: TensorDef = TensorDef::new("gate_up", Weight, W, &[D(E), Twice(F), D(H)]);
const DOWN: TensorDef = TensorDef::new("down", Weight, W, &[D(E), D(H), D(F)]);
const ACT: TensorDef = TensorDef::new("act", Input, F32, &[D(T), D(R), D(F)]);
const DENSE_GATE: TensorDef = TensorDef::new("gate", Weight, W, &[D(F), D(H)]);
const DENSE_UP: TensorDef = TensorDef::new("up", Weight, W, &[D(F), D(H)]);
const DENSE_DOWN: TensorDef = TensorDef::new("down", Weight, W, &[D(H), D(F)]);
/// The optional per-expert biases (`Kernel::bias`).
pub const GATE_UP_BIAS: TensorDef = TensorDef::new("gate_up_bias", Weight, W, &[D(E), Twice(F)]);
pub const DOWN_BIAS: TensorDef = TensorDef::new("down_bias", Weight, W, &[D(E), D(H)]);
/// The optional sigmoid gate on a dense MLP's output (`Kernel::output_gate`).
pub const OUTPUT_GATE: TensorDef = TensorDef::new("output_gate", Weight, W, &[D(H)]);
const HIDDEN: TensorDef = TensorDef::new("hidden", Input, A, &[D(T), D(H)]);
const EMB: TensorDef = TensorDef::new("emb", Weight, W, &[D(V), D(H)]);

impl Op {
    /// The op's tensors, in the order every backend binds them.
    pub fn tensors(self) -> &'static [TensorDef] {
        match self {
            Op::GateUp => &[X, IDX, GATE_UP],
            Op::Down => &[ACT, IDX, ROUTE_WEIGHTS, DOWN],
            Op::ExpertFfn => &[X, IDX, ROUTE_WEIGHTS, GATE_UP, DOWN],
            Op::DenseMlp => &[X, DENSE_GATE, DENSE_UP, DENSE_DOWN],
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

    /// The op's tensors with the optional ones a spec adds after them (its biases, its output
    /// gate), in the order every backend binds them.
    pub fn tensors_with(self, bias: crate::Bias, output_gate: bool) -> Vec<&'static TensorDef> {
        let mut all: Vec<&'static TensorDef> = self.tensors().iter().collect();
        if bias.gate_up {
            all.push(&GATE_UP_BIAS);
        }
        if bias.down {
            all.push(&DOWN_BIAS);
        }
        if output_gate {
            all.push(&OUTPUT_GATE);
        }
        all
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

    /// Every op's tensors use only the op's own dims, and names are unique within an op.
    #[test]
    fn tensors_use_their_ops_dims() {
        for &op in Op::ALL {
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
