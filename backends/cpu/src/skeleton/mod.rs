//! The generic loop nests a schedule runs on: one function per [`Skeleton`], reading the
//! schedule from its [`Tables`] (blocks, column blocks, core splits, groups), never from code.
//!
//! Work units are the declared core splits (a [`Grid`], run with rayon); reduction blocks are
//! summed in declared order ([`clip`] keeps the order inside a unit's range); a reduction split
//! across units is completed by adding the units' partials in part order; route owners write one
//! slot each and the K-axis combine adds routes in route order. Sums therefore never depend on the
//! thread count. Arithmetic is f32; GEMM paths store the gate/up activation in
//! [`crate::Weight::Gated`] (the activation's type for plain weights and MXFP4, f32 beside Q8_0
//! and Q4_0).
//!
//! A generated CPU variant is its spec's tables as a constant and a call into these functions
//! (moek-kernels binds the op's inputs to them); a schedule given at run time ([`Tables::of`]
//! its IR) runs the same functions, so the two compute the same numbers at the same speed.
//!
//! [`Skeleton`]: moek_ir::cpu::Skeleton
//! [`Grid`]: crate::Grid
//! [`clip`]: crate::clip
//! [`Tables::of`]: moek_ir::cpu::Tables::of

mod gathered;
mod gemm;

pub use gathered::{down, gate_up, gathered_ffn, lm_head_row, route_owned_ffn};
pub use gemm::{dense_mlp, grouped_ffn, persistent_ffn};

use moek_ir::cpu::{Ranges, Tables};
use moek_ir::reference::Biases;
use moek_ir::tensors::Optional;
use rayon::prelude::*;
use std::borrow::Cow;

/// A routed token's experts and their weights: `idx [T, R]`, `weights [T, R]`.
#[derive(Clone, Copy, Debug)]
pub struct Routes<'a> {
    pub idx: &'a [u32],
    pub weights: &'a [f32],
}

/// The expert banks in the checkpoint's layouts: `gate_up [E, 2F, H]` (gate rows first),
/// `down [E, H, F]`, and the biases if the experts have them.
#[derive(Clone, Copy, Debug)]
pub struct Bank<'a, W> {
    pub gate_up: &'a [W],
    pub down: &'a [W],
    pub bias: Biases<'a>,
}

impl<'a, W> Bank<'a, W> {
    /// The biases the spec declares (the backend checked the inputs carry exactly those).
    fn declared_bias(&self, t: &Tables) -> Biases<'a> {
        let given = |declared: bool, b: Option<&'a [f32]>| {
            declared.then(|| b.expect("the backend checks the spec's biases are given"))
        };
        Biases {
            gate_up: given(t.optional.has(Optional::GateUpBias), self.bias.gate_up),
            down: given(t.optional.has(Optional::DownBias), self.bias.down),
        }
    }
}

/// Runs `$body` with `$pair` bound to the spec's gated pair `gated(g, u)` as a closure of its
/// own type per activation (parameters captured), so each skeleton is compiled once per
/// activation and its epilogue loops vectorise as a generated variant's did; a `match` on the
/// activation inside those loops measured 8-10% slower on the grouped prefill.
macro_rules! with_pair {
    ($act:expr, |$pair:ident| $body:expr) => {
        match $act {
            moek_ir::Activation::GeluTanh => {
                let $pair = |g: f32, u: f32| crate::gelu_tanh(g) * u;
                $body
            }
            moek_ir::Activation::Silu => {
                let $pair = |g: f32, u: f32| crate::silu(g) * u;
                $body
            }
            moek_ir::Activation::SwigluClamped { limit, alpha } => {
                let $pair = move |g: f32, u: f32| crate::swiglu_clamped(g, u, limit, alpha);
                $body
            }
        }
    };
}
use with_pair;

/// A gated pair `gated(g, u)`, as [`with_pair`] binds it.
trait Pair: Fn(f32, f32) -> f32 + Copy + Send + Sync {}
impl<P: Fn(f32, f32) -> f32 + Copy + Send + Sync> Pair for P {}

/// An expert's gated rows, `out[row][j] = pair(g + bg, u + bu)` from the rows of `gu` (`f`
/// gate values, then `f` up values, a row) and its gate/up biases `bias` (`f` each), if any:
/// zipped slices (no index to check), compiled for the level's vector width. Plain f32
/// arithmetic that vectorising does not reorder, so every level gives the same bits.
fn gate_rows<G: crate::Element>(
    gu: &[f32],
    out: &mut [G],
    f: usize,
    bias: Option<&[f32]>,
    pair: impl Pair,
) {
    crate::isa::vectorised(
        #[inline(always)]
        || {
            for (a, g) in out.chunks_exact_mut(f).zip(gu.chunks_exact(2 * f)) {
                let (gate, up) = g.split_at(f);
                match bias {
                    Some(b) => {
                        let (bg, bu) = b.split_at(f);
                        for ((((a, g), u), bg), bu) in
                            a.iter_mut().zip(gate).zip(up).zip(bg).zip(bu)
                        {
                            *a = G::from_f32(pair(g + bg, u + bu));
                        }
                    }
                    None => {
                        for ((a, g), u) in a.iter_mut().zip(gate).zip(up) {
                            *a = G::from_f32(pair(*g, *u));
                        }
                    }
                }
            }
        },
    )
}

/// Declared blocks, or one block over the whole dim of size `n`.
fn blocks<'t>(r: &'t Ranges<'_>, n: usize) -> Cow<'t, [(usize, usize)]> {
    match r {
        Some(b) => Cow::Borrowed(b),
        None => Cow::Owned(vec![(0, n)]),
    }
}

/// Expert `e`'s gate/up bias added to `g` and `u` for column `j`, if it has one.
#[inline(always)]
fn add_gate_up_bias(b: Option<&[f32]>, e: usize, f: usize, j: usize, g: &mut f32, u: &mut f32) {
    if let Some(b) = b {
        *g += b[e * 2 * f + j];
        *u += b[e * 2 * f + f + j];
    }
}

/// The K-axis combine `out[t] = sum_r w[t,r] * rows[t * R + r]` over one `[H]` row per route
/// slot, routes added in route order.
fn combine_routes(out: &mut [f32], rows: &[f32], weights: &[f32], t: usize, r: usize, h: usize) {
    out[..t * h]
        .par_chunks_mut(h)
        .enumerate()
        .for_each(|(tok, o)| {
            o.fill(0.0);
            for route in 0..r {
                let slot = tok * r + route;
                let w = weights[slot];
                for (o, y) in o.iter_mut().zip(&rows[slot * h..(slot + 1) * h]) {
                    *o += w * y;
                }
            }
        });
}
