//! The element types kernels read: f16, bf16, f32.

use half::{bf16, f16};

/// A storage type of weights and activations. Arithmetic is always f32 (f64 in references).
pub trait Element:
    Copy + Default + Send + Sync + PartialEq + std::fmt::Debug + crate::quant::Weight + 'static
{
    /// The spec name of the type (`f16`, `bf16`, `f32`).
    const NAME: &'static str;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl Element for f16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16_to_f32(self.to_bits())
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
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

/// Which of the three element types `W` is, for picking a SIMD path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    F16,
    Bf16,
    F32,
}

pub(crate) fn kind<W: Element>() -> Kind {
    match W::NAME {
        "f16" => Kind::F16,
        "bf16" => Kind::Bf16,
        _ => Kind::F32,
    }
}

/// Reinterprets a slice of `W` as its raw 16-bit words (`W` must be a 16-bit kind).
pub(crate) fn bits16<W: Element>(s: &[W]) -> &[u16] {
    debug_assert_eq!(std::mem::size_of::<W>(), 2);
    // SAFETY: f16 and bf16 are `repr(transparent)` over u16; the caller checked the kind.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u16>(), s.len()) }
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
