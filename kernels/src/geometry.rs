//! The MoE geometries the optimised variants are fixed at (Gemma-4 26B-A4B, Qwen3-30B-A3B), in one place for tests,
//! benches and `moek check`.

use moek_ir::reference::Shape;
use moek_ir::{DimName, Kernel, Op};

/// One decoded token and its eight routes over the 128-expert bank.
pub const DECODE: Shape = Shape {
    t: 1,
    r: 8,
    e: 128,
    h: 2816,
    f: 704,
    v: 0,
};
/// A 512-token prompt.
pub const PREFILL: Shape = Shape { t: 512, ..DECODE };
/// Vocabulary rows of the LM head.
pub const VOCAB: usize = 262_144;
/// Width of the shared dense MLP.
pub const DENSE_F: usize = 2112;

/// Sizes for free dims: the 26B-A4B layer (decode when T is free and may be 1, a 512-token prompt
/// when it must be more).
pub const REAL: Shape = Shape { v: VOCAB, ..DECODE };

/// A spec's fixed sizes, 26B-A4B sizes for its free dims (the dense MLP's F is [`DENSE_F`]):
/// the shape `moek check` runs and `moek emit` plans for.
pub fn real_shape(k: &Kernel) -> Shape {
    let mut free = REAL;
    if k.op == Op::DenseMlp {
        free.f = DENSE_F;
    }
    if let Some(t) = k.dim(DimName::T).filter(|d| !d.admits(1)) {
        free.t = PREFILL.t.max(t.min);
    }
    crate::testing::shape_for(k, &free)
}

/// Qwen3-30B-A3B's MoE: one decoded token and its eight routes over 128 experts of width 768.
pub const QWEN3_DECODE: Shape = Shape {
    t: 1,
    r: 8,
    e: 128,
    h: 2048,
    f: 768,
    v: 0,
};
/// A 512-token prompt at Qwen3-30B-A3B's MoE.
pub const QWEN3_PREFILL: Shape = Shape {
    t: 512,
    ..QWEN3_DECODE
};
