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
    shape_for(k, &free)
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

/// Whether every dim of the spec admits the size `shape` gives it.
pub fn admits(k: &Kernel, shape: &Shape) -> bool {
    k.op.dims()
        .iter()
        .all(|&d| k.dim(d).is_none_or(|dim| dim.admits(shape.dim(d))))
}

/// The problem a spec runs on: its fixed sizes, and `free`'s for its free dims (H and F
/// rounded up to whole blocks where the spec has quantized weights, whose rows are blocks).
pub fn shape_for(k: &Kernel, free: &Shape) -> Shape {
    let block = match k.dtypes.iter().any(|d| d.is_quantized()) {
        true => k.quant_block,
        false => 1,
    };
    let pick = |d: DimName, dflt: usize| match k.dim(d) {
        Some(dim) => dim.size.unwrap_or_else(|| {
            let dflt = match d {
                DimName::H | DimName::F => dflt.next_multiple_of(block),
                _ => dflt,
            };
            dflt.max(dim.min).min(dim.max.unwrap_or(usize::MAX))
        }),
        None => dflt,
    };
    let has = |d: DimName| k.op.dims().contains(&d);
    Shape {
        t: pick(DimName::T, free.t),
        r: if has(DimName::R) {
            pick(DimName::R, free.r)
        } else {
            0
        },
        e: if has(DimName::E) {
            pick(DimName::E, free.e)
        } else {
            0
        },
        h: pick(DimName::H, free.h),
        f: if has(DimName::F) {
            pick(DimName::F, free.f)
        } else {
            0
        },
        v: if has(DimName::V) {
            pick(DimName::V, free.v)
        } else {
            0
        },
    }
}
