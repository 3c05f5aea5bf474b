//! [`Element`], the one trait of a tensor's stored element: a plain value (f16, bf16, f32) or a
//! block of quantized values ([`crate::quant`]). Every layer above names its element types by
//! it: the reference reads their exact values, dispatch finds a spec's variant for them, the
//! CPU products read them.

use crate::quant::GROUP;
use crate::{BlockFormat, DType};
use half::{bf16, f16};

/// What one stored element is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// One value in a plain dtype.
    Plain(DType),
    /// A block of values in a block format.
    Blocks(BlockFormat),
}

/// A stored element of a tensor: its kind, how many values it holds, their exact values and
/// the nearest element to given values. Offsets into a weight tensor are counted in values and
/// divided by [`Element::VALUES`] (rows are whole blocks, which the checker and the input checks
/// hold).
pub trait Element:
    bytemuck::Pod + Default + Send + Sync + PartialEq + std::fmt::Debug + 'static
{
    const KIND: Kind;
    /// Values one element holds: 1 plain, the block size for blocks.
    const VALUES: usize;
    /// The plain dtype (a compile error where a block type asks: a block's spec dtype depends
    /// on its activations, [`DType::quantized`]).
    const DTYPE: DType = match Self::KIND {
        Kind::Plain(d) => d,
        Kind::Blocks(_) => panic!("a block type has no plain dtype"),
    };
    /// The block format (a compile error where a plain type asks).
    const FORMAT: BlockFormat = match Self::KIND {
        Kind::Blocks(f) => f,
        Kind::Plain(_) => panic!("a plain type has no block format"),
    };
    /// Groups of [`GROUP`] values one element holds (blocks; 0 plain).
    const GROUPS: usize = Self::VALUES / GROUP;

    /// Value `i` (below [`Element::VALUES`]), exactly.
    fn value(&self, i: usize) -> f32;

    /// The element nearest `values` (exactly [`Element::VALUES`] of them): a plain value rounded
    /// to nearest even, a block quantized as its format says.
    fn quantize(values: &[f32]) -> Self;

    /// Value `i` of a tensor stored as `w`, exactly (counted in values, across elements).
    fn value_at(w: &[Self], i: usize) -> f32 {
        w[i / Self::VALUES].value(i % Self::VALUES)
    }

    /// The exact values of the element.
    fn dequantize(&self, out: &mut [f32]) {
        for (i, o) in out.iter_mut().enumerate().take(Self::VALUES) {
            *o = self.value(i);
        }
    }

    /// A plain element's value.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        debug_assert_eq!(Self::VALUES, 1, "to_f32 of a block");
        self.value(0)
    }

    /// The plain element nearest `v`.
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        Self::quantize(&[v])
    }
}

/// The spec dtype of weights in blocks of `Q` beside activations in `A`.
pub const fn quantized_dtype<Q: Element, A: Element>() -> DType {
    match DType::quantized(Q::FORMAT, A::DTYPE) {
        Some(d) => d,
        None => panic!("every block format pairs with f32 and bf16"),
    }
}

impl Element for f32 {
    const KIND: Kind = Kind::Plain(DType::F32);
    const VALUES: usize = 1;
    #[inline(always)]
    fn value(&self, _: usize) -> f32 {
        *self
    }
    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        values[0]
    }
}

impl Element for bf16 {
    const KIND: Kind = Kind::Plain(DType::Bf16);
    const VALUES: usize = 1;
    #[inline(always)]
    fn value(&self, _: usize) -> f32 {
        bf16::to_f32(*self)
    }
    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        bf16::from_f32(values[0])
    }
}

impl Element for f16 {
    const KIND: Kind = Kind::Plain(DType::F16);
    const VALUES: usize = 1;
    #[inline(always)]
    fn value(&self, _: usize) -> f32 {
        f16_to_f32(self.to_bits())
    }
    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        f16::from_f32(values[0])
    }
}

/// f16 bits widened exactly to f32 in plain arithmetic. `half`'s conversion asks the CPU for
/// F16C on every call (a branch and a call per element, so no loop over it vectorises: f16
/// weights cost seven times bf16 on the portable path); this one is a shift, a multiply by
/// 2^112 (exact, subnormals included) and a select for infinities and NaNs, which vectorise.
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let magnitude = h & 0x7fff;
    let bits = if magnitude >= 0x7c00 {
        // infinity or NaN: all exponent bits set, the payload kept
        (magnitude << 13) | 0x7f80_0000
    } else {
        // 2^112 rebiases the exponent (15 -> 127); f16 subnormals become f32 normals
        (f32::from_bits(magnitude << 13) * f32::from_bits((127 + 112) << 23)).to_bits()
    };
    f32::from_bits(bits | sign)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_widening_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let (got, want) = (f16_to_f32(h), f16::from_bits(h).to_f32());
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}: {got} is not NaN");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}: {got} vs {want}");
            }
        }
    }
}
