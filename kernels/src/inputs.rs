//! The tensors each op takes, and the checks that run before any variant touches them. What
//! each tensor is (name, shape, element class) is the op table, [`moek_ir::tensors`]; this
//! module binds host slices to it.

use moek_ir::quant::Packed;
use moek_ir::reference::Biases;
use moek_ir::reference::Shape;
use moek_ir::tensors::ElemClass;
use moek_ir::tensors::TensorDef;
use moek_ir::{Bias, DType, Op};
use std::any::TypeId;
use std::marker::PhantomData;
use thiserror::Error;

/// An op's inputs, row-major, in the checkpoint's own layouts: weights in `W`, activations in
/// `A` (the op table's two element classes). Plain dtypes take `A = W`, the default;
/// block-quantized weights (`W` a block of [`moek_ir::quant`]) come beside f32 activations, and
/// a weight slice then holds blocks, a row's values `BLOCK` to a block.
#[derive(Clone, Copy, Debug)]
pub enum Inputs<'a, W, A = W> {
    /// `x [T, H]`, `idx [T, R]`, `gate_up [E, 2F, H]` (gate rows first).
    GateUp {
        x: &'a [A],
        idx: &'a [u32],
        gate_up: &'a [W],
    },
    /// `act [T, R, F]` (f32), `idx [T, R]`, `weights [T, R]`, `down [E, H, F]`.
    Down {
        act: &'a [f32],
        idx: &'a [u32],
        weights: &'a [f32],
        down: &'a [W],
    },
    /// `x [T, H]`, `idx [T, R]`, `weights [T, R]`, `gate_up [E, 2F, H]`, `down [E, H, F]`, and
    /// the experts' biases if they have them (only a spec that declares the same biases runs
    /// them).
    ExpertFfn {
        x: &'a [A],
        idx: &'a [u32],
        weights: &'a [f32],
        gate_up: &'a [W],
        down: &'a [W],
        bias: Biases<'a, W>,
    },
    /// `x [T, H]`, `gate [F, H]`, `up [F, H]`, `down [H, F]`, and the output gate `[H]` if the
    /// MLP has one (Qwen2-MoE's shared experts: `sigmoid(x . output_gate)` scales each row).
    DenseMlp {
        x: &'a [A],
        gate: &'a [W],
        up: &'a [W],
        down: &'a [W],
        output_gate: Option<&'a [W]>,
    },
    /// `hidden [T, H]` (only row T-1 is read), `emb [V, H]`, and the final softcap
    /// (`cap * tanh(x / cap)`), if the model has one (Gemma does; Qwen3, Mixtral, DeepSeek and
    /// gpt-oss do not).
    LmHeadRow {
        hidden: &'a [A],
        emb: &'a [W],
        softcap: Option<f32>,
    },
}

/// One bound tensor, as its element class carries it.
#[derive(Clone, Copy, Debug)]
pub enum Bound<'a, W, A = W> {
    /// Activations, in `A`.
    Act(&'a [A]),
    /// Weights, in `W`.
    Weight(&'a [W]),
    F32(&'a [f32]),
    Index(&'a [u32]),
}

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

impl<W: crate::elem::Elem, A: crate::elem::Elem> Bound<'_, W, A> {
    /// The values widened to f32 (route indices as numbers).
    pub fn to_f32(&self) -> Vec<f32> {
        match *self {
            Bound::Act(v) => v.iter().map(|x| x.to_f32()).collect(),
            Bound::Weight(v) => v.iter().map(|x| x.to_f32()).collect(),
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

impl<'a, W: Packed, A: bytemuck::Pod> Inputs<'a, W, A> {
    pub fn op(&self) -> Op {
        match self {
            Inputs::GateUp { .. } => Op::GateUp,
            Inputs::Down { .. } => Op::Down,
            Inputs::ExpertFfn { .. } => Op::ExpertFfn,
            Inputs::DenseMlp { .. } => Op::DenseMlp,
            Inputs::LmHeadRow { .. } => Op::LmHeadRow,
        }
    }

    /// The biases these inputs carry (none but for a biased expert FFN).
    pub fn bias(&self) -> Bias {
        match self {
            Inputs::ExpertFfn { bias, .. } => bias.kinds(),
            _ => Bias::default(),
        }
    }

    /// Whether these inputs carry a dense MLP's output gate.
    pub fn output_gate(&self) -> bool {
        matches!(
            self,
            Inputs::DenseMlp {
                output_gate: Some(_),
                ..
            }
        )
    }

    /// The tensors bound, as the op table defines them ([`Op::tensors_with`] the optional ones).
    pub fn defs(&self) -> Vec<&'static TensorDef> {
        self.op().tensors_with(self.bias(), self.output_gate())
    }

    /// The tensors in the order of [`Inputs::defs`].
    pub fn bound(&self) -> Vec<Bound<'a, W, A>> {
        use Bound::{Act, F32, Index, Weight};
        match *self {
            Inputs::GateUp { x, idx, gate_up } => vec![Act(x), Index(idx), Weight(gate_up)],
            Inputs::Down {
                act,
                idx,
                weights,
                down,
            } => vec![F32(act), Index(idx), F32(weights), Weight(down)],
            Inputs::ExpertFfn {
                x,
                idx,
                weights,
                gate_up,
                down,
                bias,
            } => {
                let mut all = vec![
                    Act(x),
                    Index(idx),
                    F32(weights),
                    Weight(gate_up),
                    Weight(down),
                ];
                all.extend(bias.gate_up.map(Weight));
                all.extend(bias.down.map(Weight));
                all
            }
            Inputs::DenseMlp {
                x,
                gate,
                up,
                down,
                output_gate,
            } => {
                let mut all = vec![Act(x), Weight(gate), Weight(up), Weight(down)];
                all.extend(output_gate.map(Weight));
                all
            }
            Inputs::LmHeadRow { hidden, emb, .. } => vec![Act(hidden), Weight(emb)],
        }
    }

    /// The tensor the op's table names `name`, if the op has one.
    pub fn named(&self, name: &str) -> Option<Bound<'a, W, A>> {
        let i = self.defs().iter().position(|t| t.name == name)?;
        Some(self.bound()[i])
    }

    /// The final logit softcap, for the LM head with one (`None` for every other op).
    pub fn softcap(&self) -> Option<f32> {
        match *self {
            Inputs::LmHeadRow { softcap, .. } => softcap,
            _ => None,
        }
    }

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
fn tensors<'a, W: Packed, A: bytemuck::Pod>(inputs: &Inputs<'a, W, A>) -> Vec<AnyTensor<'a>> {
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
    /// How the weights are stored and the activations beside them (a plain dtype, or a block
    /// format paired with its activation dtype).
    pub dtype: DType,
    /// Values per stored weight element: 1 for plain dtypes, the block size for blocks.
    pub values: usize,
    pub op: Op,
    pub bias: Bias,
    pub output_gate: bool,
    pub softcap: Option<f32>,
    tensors: Vec<AnyTensor<'a>>,
    /// `(W, A)` of the `Inputs<'a, W, A>` behind `ptr`.
    types: TypeId,
    ptr: *const (),
    _inputs: PhantomData<&'i Inputs<'a, (), ()>>,
}

impl<'i, 'a> AnyInputs<'i, 'a> {
    /// `inputs`, whose weights are stored as `dtype` says.
    pub fn new<W: Packed + 'static, A: bytemuck::Pod + 'static>(
        inputs: &'i Inputs<'a, W, A>,
        dtype: DType,
    ) -> Self {
        AnyInputs {
            dtype,
            values: W::VALUES,
            op: inputs.op(),
            bias: inputs.bias(),
            output_gate: inputs.output_gate(),
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
