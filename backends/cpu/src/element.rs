//! The element types kernels read: f16, bf16, f32.

use half::{bf16, f16};

/// A storage type of weights and activations. Arithmetic is always f32 (f64 in references).
pub trait Element: Copy + Default + Send + Sync + PartialEq + std::fmt::Debug + 'static {
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
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Element for bf16 {
    const NAME: &'static str = "bf16";
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Element for f32 {
    const NAME: &'static str = "f32";
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
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
