//! The tensors each op takes, and the checks that run before any variant touches them. What
//! each tensor is (name, shape, element class) is the op table, [`moek_ir::tensors`]; this
//! module binds host slices to it.

use moek_ir::Element;
use moek_ir::reference::Biases;
use moek_ir::reference::Shape;
use moek_ir::tensors::{ElemClass, MAX_TENSORS, Optional, Optionals, TensorDef};
use moek_ir::{Activation, DType, Function, Op, Storage};
use std::any::TypeId;
use std::marker::PhantomData;
use thiserror::Error;

/// An op's inputs, row-major, in the checkpoint's own layouts: weights in `W`, activations in
/// `A` (the op table's two element classes). Plain dtypes take `A = W`, the default;
/// block-quantized weights (`W` a block of [`moek_ir::quant`]) come beside f32 or bf16
/// activations, and a weight slice then holds blocks, a row's values `BLOCK` to a block.
///
/// Each tensor sits in its slot of the op table ([`Op::tensors`]): a constructor per op takes the
/// tensors every spec of it reads, [`Inputs::with`] adds an optional one, and a tensor is read
/// back by its row ([`Inputs::weight`], ...).
#[derive(Debug)]
pub struct Inputs<'a, W, A = W> {
    op: Op,
    optional: Optionals,
    slots: [Option<Bound<'a, W, A>>; MAX_TENSORS],
    /// The LM head's final softcap (`cap * tanh(x / cap)`), if the model has one (Gemma does).
    softcap: Option<f32>,
}

impl<W, A> Clone for Inputs<'_, W, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W, A> Copy for Inputs<'_, W, A> {}

impl<'a, W, A> Inputs<'a, W, A> {
    fn of(op: Op, bound: &[Bound<'a, W, A>]) -> Self {
        let mut slots = [None; MAX_TENSORS];
        for (slot, b) in slots.iter_mut().zip(bound) {
            *slot = Some(*b);
        }
        Inputs {
            op,
            optional: Optionals::NONE,
            slots,
            softcap: None,
        }
    }

    /// `op`'s inputs carrying `optional`, each tensor the table binds taken from `tensor` (by
    /// its row): for code that draws or loads tensors by the table, as the test harness does.
    pub fn from_table(
        op: Op,
        optional: Optionals,
        softcap: Option<f32>,
        mut tensor: impl FnMut(&'static TensorDef) -> Bound<'a, W, A>,
    ) -> Self {
        let mut slots = [None; MAX_TENSORS];
        for (slot, row) in op.bound(optional) {
            slots[slot] = Some(tensor(row));
        }
        Inputs {
            op,
            optional,
            slots,
            softcap,
        }
    }

    /// `x [T, H]`, `idx [T, R]`, `gate_up [E, 2F, H]` (gate rows first).
    pub fn gate_up(x: &'a [A], idx: &'a [u32], gate_up: &'a [W]) -> Self {
        use Bound::*;
        Inputs::of(Op::GateUp, &[Act(x), Index(idx), Weight(gate_up)])
    }

    /// `act [T, R, F]` (f32), `idx [T, R]`, `weights [T, R]`, `down [E, H, F]`.
    pub fn down(act: &'a [f32], idx: &'a [u32], weights: &'a [f32], down: &'a [W]) -> Self {
        use Bound::*;
        Inputs::of(
            Op::Down,
            &[F32(act), Index(idx), F32(weights), Weight(down)],
        )
    }

    /// `x [T, H]`, `idx [T, R]`, `weights [T, R]`, `gate_up [E, 2F, H]`, `down [E, H, F]`; the
    /// experts' biases, if they have them, through [`Inputs::with_biases`].
    pub fn expert_ffn(
        x: &'a [A],
        idx: &'a [u32],
        weights: &'a [f32],
        gate_up: &'a [W],
        down: &'a [W],
    ) -> Self {
        use Bound::*;
        Inputs::of(
            Op::ExpertFfn,
            &[
                Act(x),
                Index(idx),
                F32(weights),
                Weight(gate_up),
                Weight(down),
            ],
        )
    }

    /// `x [T, H]`, `gate [F, H]`, `up [F, H]`, `down [H, F]`; the output gate `[H]`, if the MLP
    /// has one, through [`Inputs::with`].
    pub fn dense_mlp(x: &'a [A], gate: &'a [W], up: &'a [W], down: &'a [W]) -> Self {
        use Bound::*;
        Inputs::of(
            Op::DenseMlp,
            &[Act(x), Weight(gate), Weight(up), Weight(down)],
        )
    }

    /// `hidden [T, H]` (only row T-1 is read), `emb [V, H]`, and the final softcap
    /// (`cap * tanh(x / cap)`), if the model has one (Gemma does; Qwen3, Mixtral, DeepSeek and
    /// gpt-oss do not).
    pub fn lm_head_row(hidden: &'a [A], emb: &'a [W], softcap: Option<f32>) -> Self {
        Inputs {
            softcap,
            ..Inputs::of(Op::LmHeadRow, &[Bound::Act(hidden), Bound::Weight(emb)])
        }
    }

    /// The same inputs with the optional tensor `o` (a weight of the op's table).
    ///
    /// # Panics
    /// If the op has no such optional tensor.
    #[must_use]
    pub fn with(self, o: Optional, w: &'a [W]) -> Self {
        self.bind(o, Bound::Weight(w))
    }

    /// The same inputs with the experts' biases that `bias` holds.
    #[must_use]
    pub fn with_biases(self, bias: Biases<'a>) -> Self {
        let pairs = [
            (Optional::GateUpBias, bias.gate_up),
            (Optional::DownBias, bias.down),
        ];
        pairs.into_iter().fold(self, |i, (o, b)| match b {
            Some(b) => i.bind(o, Bound::F32(b)),
            None => i,
        })
    }

    /// The same inputs with the optional tensor `o` bound to `t`.
    fn bind(mut self, o: Optional, t: Bound<'a, W, A>) -> Self {
        let slot = self.op.tensors().iter().position(|t| t.when == Some(o));
        let slot = slot.unwrap_or_else(|| panic!("`{}` has no optional `{o}`", self.op));
        self.slots[slot] = Some(t);
        self.optional = self.optional.with(o);
        self
    }

    pub fn op(&self) -> Op {
        self.op
    }

    /// The optional tensors these inputs carry.
    pub fn optional(&self) -> Optionals {
        self.optional
    }

    /// What these inputs ask dispatch for with `activation`: their op and optional tensors.
    pub fn function(&self, activation: Activation) -> Function {
        Function {
            optional: self.optional,
            ..Function::new(self.op, activation)
        }
    }

    /// The final logit softcap, for the LM head with one (`None` for every other op).
    pub fn softcap(&self) -> Option<f32> {
        self.softcap
    }

    /// The tensor in `row`'s slot, if bound.
    pub fn get(&self, row: &TensorDef) -> Option<Bound<'a, W, A>> {
        self.slots[self.op.slot(row)?]
    }

    fn expect(&self, row: &TensorDef) -> Bound<'a, W, A> {
        self.get(row)
            .unwrap_or_else(|| panic!("`{}` inputs bind no `{}`", self.op, row.name))
    }

    /// The activations in `row`'s slot.
    ///
    /// # Panics
    /// If the slot is empty or holds another element class (as for every accessor below).
    pub fn act(&self, row: &TensorDef) -> &'a [A] {
        match self.expect(row) {
            Bound::Act(v) => v,
            _ => panic!("`{}` is not an activation", row.name),
        }
    }

    /// The weights in `row`'s slot.
    pub fn weight(&self, row: &TensorDef) -> &'a [W] {
        match self.expect(row) {
            Bound::Weight(v) => v,
            _ => panic!("`{}` is not a weight", row.name),
        }
    }

    /// The f32 tensor in `row`'s slot.
    pub fn f32s(&self, row: &TensorDef) -> &'a [f32] {
        match self.expect(row) {
            Bound::F32(v) => v,
            _ => panic!("`{}` is not an f32 tensor", row.name),
        }
    }

    /// The route indices in `row`'s slot.
    pub fn indices(&self, row: &TensorDef) -> &'a [u32] {
        match self.expect(row) {
            Bound::Index(v) => v,
            _ => panic!("`{}` is not an index tensor", row.name),
        }
    }

    /// The optional weight `o`, if these inputs carry it.
    pub fn optional_weight(&self, o: Optional) -> Option<&'a [W]> {
        let row = self.op.tensors().iter().find(|t| t.when == Some(o))?;
        self.optional.has(o).then(|| self.weight(row))
    }

    /// The experts' biases these inputs carry.
    pub fn biases(&self) -> Biases<'a> {
        let f32_of = |o| {
            let row = self.op.tensors().iter().find(|t| t.when == Some(o))?;
            self.optional.has(o).then(|| self.f32s(row))
        };
        Biases {
            gate_up: f32_of(Optional::GateUpBias),
            down: f32_of(Optional::DownBias),
        }
    }

    /// The tensors bound, as the op table defines them, in binding order.
    pub fn defs(&self) -> Vec<&'static TensorDef> {
        self.op.bound(self.optional).map(|(_, t)| t).collect()
    }

    /// The tensors in the order of [`Inputs::defs`].
    pub fn bound(&self) -> Vec<Bound<'a, W, A>> {
        self.op
            .bound(self.optional)
            .map(|(slot, t)| {
                self.slots[slot].unwrap_or_else(|| panic!("`{}` is not bound", t.name))
            })
            .collect()
    }

    /// The tensor the op's table names `name`, if bound.
    pub fn named(&self, name: &str) -> Option<Bound<'a, W, A>> {
        self.get(self.op.tensor(name)?)
    }
}

/// One bound tensor, as its element class carries it.
#[derive(Debug)]
pub enum Bound<'a, W, A = W> {
    /// Activations, in `A`.
    Act(&'a [A]),
    /// Weights, in `W`.
    Weight(&'a [W]),
    F32(&'a [f32]),
    Index(&'a [u32]),
}

// By hand: a derive would ask `W: Copy` of slices that are always `Copy`.
impl<W, A> Clone for Bound<'_, W, A> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W, A> Copy for Bound<'_, W, A> {}

impl<'a, W: bytemuck::Pod, A: bytemuck::Pod> Bound<'a, W, A> {
    pub fn len(&self) -> usize {
        match self {
            Bound::Act(v) => v.len(),
            Bound::Weight(v) => v.len(),
            Bound::F32(v) => v.len(),
            Bound::Index(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as bytes (what a device buffer holds).
    pub fn bytes(&self) -> &'a [u8] {
        match *self {
            Bound::Act(v) => bytemuck::cast_slice(v),
            Bound::Weight(v) => bytemuck::cast_slice(v),
            Bound::F32(v) => bytemuck::cast_slice(v),
            Bound::Index(v) => bytemuck::cast_slice(v),
        }
    }
}

impl<W: Element, A: Element> Bound<'_, W, A> {
    /// The values widened to f32 (route indices as numbers).
    pub fn to_f32(&self) -> Vec<f32> {
        match *self {
            Bound::Act(v) => v.iter().map(|x| x.to_f32()).collect(),
            Bound::Weight(v) => moek_ir::quant::dequantize(v),
            Bound::F32(v) => v.to_vec(),
            Bound::Index(v) => v.iter().map(|&i| i as f32).collect(),
        }
    }
}

/// A tensor that does not fit the shape it was given with.
#[derive(Debug, Error, PartialEq)]
pub enum InputError {
    #[error("tensor `{tensor}` has {got} elements; expected {expected} for {shape}")]
    Length {
        tensor: &'static str,
        expected: usize,
        got: usize,
        shape: String,
    },
    #[error("route index {index} at slot {slot} of `idx` is out of range for E = {experts}")]
    Route {
        slot: usize,
        index: u32,
        experts: usize,
    },
    #[error("the output has {got} elements; expected {expected}")]
    Output { expected: usize, got: usize },
    #[error("`{op}` needs T >= 1")]
    Empty { op: Op },
    #[error(
        "tensor `{tensor}` is stored in blocks of {block} values, but its rows are {row} values long ({shape})"
    )]
    Blocks {
        tensor: &'static str,
        row: usize,
        block: usize,
        shape: String,
    },
}

impl<'a, W: Element, A: bytemuck::Pod> Inputs<'a, W, A> {
    /// Checks every tensor's length, every route index and the output's length against `s`.
    pub fn validate(&self, s: &Shape, out_len: usize) -> Result<(), InputError> {
        check(self.op(), &tensors(self), s, out_len)
    }
}

/// One of an op's tensors as bytes, with its element count and the values each element holds
/// (weights stored in blocks hold a block's values; everything else one).
#[derive(Clone, Copy, Debug)]
pub struct AnyTensor<'a> {
    pub def: &'static TensorDef,
    pub bytes: &'a [u8],
    pub len: usize,
    pub values: usize,
}

/// `inputs`' tensors in the op table's order.
fn tensors<'a, W: Element, A: bytemuck::Pod>(inputs: &Inputs<'a, W, A>) -> Vec<AnyTensor<'a>> {
    let (defs, bound) = (inputs.defs(), inputs.bound());
    debug_assert_eq!(
        defs.len(),
        bound.len(),
        "Inputs::bound follows the op table"
    );
    defs.into_iter()
        .zip(bound)
        .map(|(def, t)| AnyTensor {
            def,
            bytes: t.bytes(),
            len: t.len(),
            values: match t {
                Bound::Weight(_) => W::VALUES,
                _ => 1,
            },
        })
        .collect()
}

/// Every tensor's length (weight rows in whole blocks), every route index and the output's
/// length, against `s`.
fn check(op: Op, tensors: &[AnyTensor<'_>], s: &Shape, out_len: usize) -> Result<(), InputError> {
    if s.t == 0 {
        return Err(InputError::Empty { op });
    }
    for t in tensors {
        let (def, per) = (t.def, t.values);
        if def.row_len(s) % per != 0 {
            return Err(InputError::Blocks {
                tensor: def.name,
                row: def.row_len(s),
                block: per,
                shape: describe(op, s),
            });
        }
        let expected = def.len(s) / per;
        if t.len != expected {
            return Err(InputError::Length {
                tensor: def.name,
                expected,
                got: t.len,
                shape: describe(op, s),
            });
        }
    }
    for t in tensors.iter().filter(|t| t.def.class == ElemClass::Index) {
        // Index tensors are erased from `&[u32]`, so their bytes are aligned u32s.
        let idx: &[u32] = bytemuck::cast_slice(t.bytes);
        let bad = idx.iter().enumerate().find(|&(_, &i)| i as usize >= s.e);
        if let Some((slot, &index)) = bad {
            return Err(InputError::Route {
                slot,
                index,
                experts: s.e,
            });
        }
    }
    let expected = output_len(op, s);
    if out_len != expected {
        return Err(InputError::Output {
            expected,
            got: out_len,
        });
    }
    Ok(())
}

/// Elements of an op's output ([`Op::output`]).
pub fn output_len(op: Op, s: &Shape) -> usize {
    s.elements(op.output())
}

/// `T=1 R=8 E=128 H=2816 F=704`: the op's dims and their sizes.
pub fn describe(op: Op, s: &Shape) -> String {
    op.dims()
        .iter()
        .map(|d| format!("{}={}", d, s.dim(*d)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An op's inputs with their element types erased: what a runtime behind `dyn Runtime` is handed,
/// plain or quantized alike. Its tensors come as bytes in the op table's order ([`Self::tensors`],
/// what a device binds); a runtime that calls typed code (the CPU's generated functions, the
/// Spyre binder) recovers the [`Inputs`] it was made from with [`Self::typed`].
#[derive(Debug)]
pub struct AnyInputs<'i, 'a> {
    /// How the weights are stored and the activations beside them: a dtype (plain, or a block
    /// format paired with its activation dtype) and the values one stored weight element holds.
    pub storage: Storage,
    pub op: Op,
    /// The optional tensors the inputs carry.
    pub optional: Optionals,
    pub softcap: Option<f32>,
    tensors: Vec<AnyTensor<'a>>,
    /// `(W, A)` of the `Inputs<'a, W, A>` behind `ptr`.
    types: TypeId,
    ptr: *const (),
    _inputs: PhantomData<&'i Inputs<'a, (), ()>>,
}

impl<'i, 'a> AnyInputs<'i, 'a> {
    /// `inputs`, whose weights are stored as `dtype` says.
    pub fn new<W: Element + 'static, A: bytemuck::Pod + 'static>(
        inputs: &'i Inputs<'a, W, A>,
        dtype: DType,
    ) -> Self {
        AnyInputs {
            storage: Storage {
                dtype,
                values: W::VALUES,
            },
            op: inputs.op(),
            optional: inputs.optional(),
            softcap: inputs.softcap(),
            tensors: tensors(inputs),
            types: TypeId::of::<(W, A)>(),
            ptr: (inputs as *const Inputs<'a, W, A>).cast(),
            _inputs: PhantomData,
        }
    }

    /// The tensors as bytes, in the op table's order.
    pub fn tensors(&self) -> &[AnyTensor<'a>] {
        &self.tensors
    }

    /// [`Inputs::validate`], on the erased tensors.
    pub fn validate(&self, s: &Shape, out_len: usize) -> Result<(), InputError> {
        check(self.op, &self.tensors, s, out_len)
    }

    /// The typed inputs, if their weights are `W` and their activations `A`.
    pub fn typed<W: 'static, A: 'static>(&self) -> Option<&'i Inputs<'a, W, A>> {
        // SAFETY: `ptr` was made from an `&'i Inputs<'a, W', A'>` with `(W', A')` the types
        // `types` names, so when those are `(W, A)` it points to a live `Inputs<'a, W, A>` for
        // `'i`.
        (self.types == TypeId::of::<(W, A)>())
            .then(|| unsafe { &*self.ptr.cast::<Inputs<'a, W, A>>() })
    }
}
