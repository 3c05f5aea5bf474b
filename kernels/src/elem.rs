//! The storage dtypes kernels run on, tied to their IR names and function tables: the plain
//! ones ([`Elem`]), the block-quantized weights ([`QuantElem`]) and the activations beside them
//! ([`QuantAct`]).

use crate::registry::{CpuFn, CpuFns, QuantFns};
use half::{bf16, f16};
use moek_ir::DType;
use moek_ir::quant::{BlockQ4, BlockQ8, Packed, Quantized};
use moek_ir::reference::Real;

/// f16, bf16 or f32: a storage dtype with its IR name and its slot in a spec's function table.
pub trait Elem:
    Copy + Default + Send + Sync + PartialEq + std::fmt::Debug + Real + Packed + 'static
{
    const DTYPE: DType;
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    fn cpu_fn(fns: &CpuFns) -> Option<CpuFn<Self>>;
}

impl Elem for f16 {
    const DTYPE: DType = DType::F16;
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        // The software conversion: `to_f32` asks the CPU for F16C on every element, which keeps
        // loops over whole banks from vectorising.
        self.to_f32_const()
    }
    fn cpu_fn(fns: &CpuFns) -> Option<CpuFn<Self>> {
        fns.f16
    }
}

impl Elem for bf16 {
    const DTYPE: DType = DType::Bf16;
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn cpu_fn(fns: &CpuFns) -> Option<CpuFn<Self>> {
        fns.bf16
    }
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn cpu_fn(fns: &CpuFns) -> Option<CpuFn<Self>> {
        fns.f32
    }
}

/// A block-quantized weight format at one block size ([`moek_ir::quant`]) with its CPU variants
/// in a spec's function table (none when the spec declares another block size).
pub trait QuantElem: Quantized + Packed + 'static {
    fn cpu_fns(fns: &CpuFns) -> Option<&'static QuantFns<Self>>;
}

impl<const G: usize> QuantElem for BlockQ8<G> {
    fn cpu_fns(fns: &CpuFns) -> Option<&'static QuantFns<Self>> {
        fns.q8_0.get()
    }
}

impl<const G: usize> QuantElem for BlockQ4<G> {
    fn cpu_fns(fns: &CpuFns) -> Option<&'static QuantFns<Self>> {
        fns.q4_0.get()
    }
}

/// An activation dtype beside quantized weights (f32 or bf16), with its slot in a block
/// format's table.
pub trait QuantAct: Elem {
    fn quant_fn<Q>(fns: &QuantFns<Q>) -> Option<CpuFn<Q, Self>>;
}

impl QuantAct for f32 {
    fn quant_fn<Q>(fns: &QuantFns<Q>) -> Option<CpuFn<Q, Self>> {
        fns.f32
    }
}

impl QuantAct for bf16 {
    fn quant_fn<Q>(fns: &QuantFns<Q>) -> Option<CpuFn<Q, Self>> {
        fns.bf16
    }
}

/// The spec dtype of weights in blocks of `Q` beside activations in `A`.
pub const fn quantized_dtype<Q: QuantElem, A: QuantAct>() -> DType {
    match DType::quantized(Q::FORMAT, A::DTYPE) {
        Some(d) => d,
        None => panic!("every block format pairs with f32 and bf16"),
    }
}

/// Runs `$body` with `$Q` the block type of quantized `$dtype` (either activation) at `$block`
/// values a block, one of [`moek_ir::quant::BLOCK_SIZES`]: where a block size known at run time
/// (a spec's) becomes the type the kernels are compiled for.
#[macro_export]
#[doc(hidden)]
macro_rules! with_block {
    ($dtype:expr, $block:expr, |$Q:ident| $body:expr) => {{
        use $crate::__private::ir::BlockFormat;
        use $crate::__private::ir::quant::{BlockQ4, BlockQ8};
        match ($dtype.blocks(), $block) {
            (Some(BlockFormat::Q8_0), 32) => {
                type $Q = BlockQ8<1>;
                $body
            }
            (Some(BlockFormat::Q8_0), 64) => {
                type $Q = BlockQ8<2>;
                $body
            }
            (Some(BlockFormat::Q8_0), 128) => {
                type $Q = BlockQ8<4>;
                $body
            }
            (Some(BlockFormat::Q8_0), 256) => {
                type $Q = BlockQ8<8>;
                $body
            }
            (Some(BlockFormat::Q4_0), 32) => {
                type $Q = BlockQ4<1>;
                $body
            }
            (Some(BlockFormat::Q4_0), 64) => {
                type $Q = BlockQ4<2>;
                $body
            }
            (Some(BlockFormat::Q4_0), 128) => {
                type $Q = BlockQ4<4>;
                $body
            }
            (Some(BlockFormat::Q4_0), 256) => {
                type $Q = BlockQ4<8>;
                $body
            }
            (format, block) => unreachable!(
                "no block type for {format:?} at {block} values (the checker allows {:?})",
                $crate::__private::ir::quant::BLOCK_SIZES
            ),
        }
    }};
}
