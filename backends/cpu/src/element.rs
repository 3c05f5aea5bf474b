//! The plain element types kernels read (f16, bf16, f32: [`moek_ir::Element`]), sorted for
//! picking a SIMD path.

use moek_ir::{DType, Element};

/// Which of the three plain element types `W` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    F16,
    Bf16,
    F32,
}

pub(crate) fn kind<W: Element>() -> Kind {
    match W::KIND {
        moek_ir::Kind::Plain(DType::F16) => Kind::F16,
        moek_ir::Kind::Plain(DType::Bf16) => Kind::Bf16,
        moek_ir::Kind::Plain(DType::F32) => Kind::F32,
        k => unreachable!("{k:?} is not a plain element"),
    }
}

/// Reinterprets a slice of `W` as its raw 16-bit words (`W` must be a 16-bit kind).
pub(crate) fn bits16<W: Element>(s: &[W]) -> &[u16] {
    debug_assert_eq!(std::mem::size_of::<W>(), 2);
    // SAFETY: f16 and bf16 are `repr(transparent)` over u16; the caller checked the kind.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u16>(), s.len()) }
}
