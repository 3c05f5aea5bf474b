//! The Gemma-4 26B-A4B MoE geometry the optimised variants are fixed at, in one place for tests,
//! benches and `moek check`.

use moek_ir::reference::Shape;

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
