//! The skeletons that read weight rows only through matrix-vector products, banks gathered by
//! route in place: any stored weight (plain or quantized blocks) beside activations of their own
//! type.

use super::{Bank, Pair, Routes, add_gate_up_bias, blocks, combine_routes, with_pair};
use crate::{Element, Grid, SharedOut, Weight, clip, matvec_row, values};
use moek_ir::DimName::{F, H, R, T, V};
use moek_ir::cpu::Tables;
use moek_ir::reference::Shape;
use rayon::prelude::*;

/// Gate/up over gathered routes: units T x R x F x H (the first phase's split), H in declared
/// blocks, F in column blocks; writes `gated(g, u)` (plus the bias, if any) to `dst [T, R, F]`.
#[allow(clippy::too_many_arguments)]
fn gate_up_phase<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    idx: &[u32],
    gate_up: &[W],
    bias: Option<&[f32]>,
    pair: impl Pair,
    dst: &mut [f32],
) {
    let (t_n, r_n, f_n, h_n) = (s.t, s.r, s.f, s.h);
    let p = t.cores[0];
    let ph = p.of_dim(H);
    let grid = Grid::new([
        (t_n, p.of_dim(T)),
        (r_n, p.of_dim(R)),
        (f_n, p.of_dim(F)),
        (h_n, ph),
    ]);
    let h_blocks = blocks(&t.reduce_h, h_n);
    let f_cols = blocks(&t.columns_f, f_n);
    let mut partials = vec![0f32; ph * t_n * r_n * 2 * f_n];
    // Each token's row made ready once, shared by gate and up and every route it takes.
    let x_rows = rows_of::<W, A>(x, t_n, h_n);
    {
        let shared = SharedOut::new(&mut partials);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [tr, rr, fr, hr] = grid.ranges(unit);
            let hp = grid.index(unit)[3];
            let segs = clip(&h_blocks, hr);
            for tok in tr {
                let xt = &x_rows[tok];
                for r in rr.clone() {
                    let slot = tok * r_n + r;
                    let e = idx[slot] as usize;
                    let bank = values(gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
                    let up = values(bank, f_n * h_n..2 * f_n * h_n);
                    let base = (hp * t_n * r_n + slot) * 2 * f_n;
                    for (c0, c1) in clip(&f_cols, fr.clone()) {
                        // SAFETY: this unit owns (H part, slot, columns c0..c1) of gate and up.
                        let g = unsafe { shared.slice(base + c0, c1 - c0) };
                        matvec_row::<A, W>(xt, bank, h_n, c0..c1, &segs, g);
                        let u = unsafe { shared.slice(base + f_n + c0, c1 - c0) };
                        matvec_row::<A, W>(xt, up, h_n, c0..c1, &segs, u);
                    }
                }
            }
        });
    }
    // Completed sum over the H parts in part order, then the epilogue gated(g, u).
    dst[..t_n * r_n * f_n]
        .par_chunks_mut(f_n)
        .enumerate()
        .for_each(|(slot, a)| {
            let e = idx[slot] as usize;
            for (j, a) in a.iter_mut().enumerate() {
                let (mut g, mut u) = (0f32, 0f32);
                for p in 0..ph {
                    let b = (p * t_n * r_n + slot) * 2 * f_n;
                    g += partials[b + j];
                    u += partials[b + f_n + j];
                }
                add_gate_up_bias(bias, e, f_n, j, &mut g, &mut u);
                *a = pair(g, u);
            }
        });
}

/// Down over gathered routes: units T x R x H x F (the second phase's split), H in column
/// blocks, F in reduction blocks, then the K-axis combine `out[t] = sum_r w[t,r] * y[t,r]` in
/// route order, each route the completed sum of its F parts in part order (plus the bias).
fn down_phase<W: Weight>(
    t: &Tables,
    s: &Shape,
    act: &[f32],
    routes: Routes<'_>,
    down: &[W],
    bias: Option<&[f32]>,
    out: &mut [f32],
) {
    let (t_n, r_n, f_n, h_n) = (s.t, s.r, s.f, s.h);
    let idx = routes.idx;
    let p = t.cores[1];
    let pf = p.of_dim(F);
    let grid = Grid::new([
        (t_n, p.of_dim(T)),
        (r_n, p.of_dim(R)),
        (h_n, p.of_dim(H)),
        (f_n, pf),
    ]);
    let f_blocks = blocks(&t.reduce_f, f_n);
    let h_cols = blocks(&t.columns_h, h_n);
    let mut y = vec![0f32; pf * t_n * r_n * h_n];
    // Each route's gated activation made ready once, shared by every column block.
    let a_rows = rows_of::<W, f32>(act, t_n * r_n, f_n);
    {
        let shared = SharedOut::new(&mut y);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [tr, rr, hr, fr] = grid.ranges(unit);
            let fp = grid.index(unit)[3];
            let segs = clip(&f_blocks, fr);
            for tok in tr {
                for r in rr.clone() {
                    let slot = tok * r_n + r;
                    let e = idx[slot] as usize;
                    let a = &a_rows[slot];
                    let bank = values(down, e * h_n * f_n..(e + 1) * h_n * f_n);
                    let base = (fp * t_n * r_n + slot) * h_n;
                    for (c0, c1) in clip(&h_cols, hr.clone()) {
                        // SAFETY: this unit owns (F part, slot, columns c0..c1).
                        let yv = unsafe { shared.slice(base + c0, c1 - c0) };
                        matvec_row::<f32, W>(a, bank, f_n, c0..c1, &segs, yv);
                    }
                }
            }
        });
    }
    out[..t_n * h_n]
        .par_chunks_mut(h_n)
        .enumerate()
        .for_each(|(tok, o)| {
            o.fill(0.0);
            for r in 0..r_n {
                let slot = tok * r_n + r;
                let w = routes.weights[slot];
                let e = idx[slot] as usize;
                for (i, o) in o.iter_mut().enumerate() {
                    let mut v = 0f32;
                    for p in 0..pf {
                        v += y[(p * t_n * r_n + slot) * h_n + i];
                    }
                    if let Some(b) = bias {
                        v += b[e * h_n + i];
                    }
                    *o += w * v;
                }
            }
        });
}

/// The gate_up op: `out [T, R, F] = gated(x . Wg[e], x . Wu[e])` over gathered routes.
pub fn gate_up<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    idx: &[u32],
    gate_up: &[W],
    out: &mut [f32],
) {
    with_pair!(t.activation, |pair| {
        gate_up_phase(t, s, x, idx, gate_up, None, pair, out)
    });
}

/// The down op: each route's `act . Wd[e]`, combined by route weight.
pub fn down<W: Weight>(
    t: &Tables,
    s: &Shape,
    act: &[f32],
    routes: Routes<'_>,
    down: &[W],
    out: &mut [f32],
) {
    down_phase(t, s, act, routes, down, None, out);
}

/// A gathered expert FFN in two phases, each cut its own way, with the activation between.
pub fn gathered_ffn<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    out: &mut [f32],
) {
    let bias = bank.declared_bias(t);
    let mut act = vec![0f32; s.t * s.r * s.f];
    with_pair!(t.activation, |pair| {
        let (idx, gate_up) = (routes.idx, bank.gate_up);
        gate_up_phase(t, s, x, idx, gate_up, bias.gate_up, pair, &mut act)
    });
    down_phase(t, s, &act, routes, bank.down, bias.down, out);
}

/// A gathered expert FFN whose units own whole routes in both phases: each unit runs gate/up
/// (H in declared blocks), the activation and down (H in column blocks, F in declared blocks)
/// for each of its routes back to back (no barrier between the phases: a route's down reads
/// only its own activation), then the K-axis combine. The arithmetic is the two-phase
/// skeleton's, term for term.
pub fn route_owned_ffn<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    out: &mut [f32],
) {
    with_pair!(t.activation, |pair| {
        route_owned_with(t, s, x, routes, bank, pair, out)
    });
}

fn route_owned_with<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    pair: impl Pair,
    out: &mut [f32],
) {
    let (t_n, r_n, f_n, h_n) = (s.t, s.r, s.f, s.h);
    let bias = bank.declared_bias(t);
    let p = t.cores[0];
    let grid = Grid::new([(t_n, p.of_dim(T)), (r_n, p.of_dim(R))]);
    let h_blocks = blocks(&t.reduce_h, h_n);
    let f_blocks = blocks(&t.reduce_f, f_n);
    let h_cols = blocks(&t.columns_h, h_n);
    let mut y = vec![0f32; t_n * r_n * h_n];
    // Each token's row made ready once, shared by gate and up and every route it takes.
    let x_rows = rows_of::<W, A>(x, t_n, h_n);
    {
        let shared = SharedOut::new(&mut y);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [tr, rr] = grid.ranges(unit);
            let (mut g, mut u, mut a) = (vec![0f32; f_n], vec![0f32; f_n], vec![0f32; f_n]);
            for tok in tr {
                let xt = &x_rows[tok];
                for r in rr.clone() {
                    let slot = tok * r_n + r;
                    let e = routes.idx[slot] as usize;
                    let gu = values(bank.gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
                    let up = values(gu, f_n * h_n..2 * f_n * h_n);
                    matvec_row::<A, W>(xt, gu, h_n, 0..f_n, &h_blocks, &mut g);
                    matvec_row::<A, W>(xt, up, h_n, 0..f_n, &h_blocks, &mut u);
                    for j in 0..f_n {
                        add_gate_up_bias(bias.gate_up, e, f_n, j, &mut g[j], &mut u[j]);
                        a[j] = pair(g[j], u[j]);
                    }
                    let dn = values(bank.down, e * h_n * f_n..(e + 1) * h_n * f_n);
                    // Made ready once for every column block of `down`.
                    let ar = W::row(&a[..]);
                    for &(c0, c1) in h_cols.iter() {
                        // SAFETY: this unit owns route slot `slot`.
                        let yv = unsafe { shared.slice(slot * h_n + c0, c1 - c0) };
                        matvec_row::<f32, W>(&ar, dn, f_n, c0..c1, &f_blocks, yv);
                        if let Some(b) = bias.down {
                            for (i, y) in (c0..c1).zip(yv.iter_mut()) {
                                *y += b[e * h_n + i];
                            }
                        }
                    }
                }
            }
        });
    }
    combine_routes(out, &y, routes.weights, t_n, r_n, h_n);
}

/// The LM head on the final row only: vocabulary rows as units (column blocks of V), the
/// softcap if any, then the argmax.
pub fn lm_head_row<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    hidden: &[A],
    emb: &[W],
    softcap: Option<f32>,
    out: &mut [f32],
) -> u32 {
    let (t_n, h_n, v_n) = (s.t, s.h, s.v);
    // The final row made ready once for every vocabulary slice.
    let last = W::row(&hidden[(t_n - 1) * h_n..t_n * h_n]);
    let grid = Grid::new([(v_n, t.cores[0].of_dim(V))]);
    let h_blocks = blocks(&t.reduce_h, h_n);
    let v_cols = blocks(&t.columns_v, v_n);
    {
        let shared = SharedOut::new(&mut out[..v_n]);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [vr] = grid.ranges(unit);
            for (c0, c1) in clip(&v_cols, vr) {
                // SAFETY: this unit owns vocabulary rows c0..c1.
                let o = unsafe { shared.slice(c0, c1 - c0) };
                matvec_row::<A, W>(&last, emb, h_n, c0..c1, &h_blocks, o);
                if let Some(cap) = softcap {
                    crate::softcap_slice(o, cap);
                }
            }
        });
    }
    moek_ir::reference::argmax(&out[..v_n])
}

/// The `n` rows of `x` (each `len` wide) made ready for `W`'s products, once each.
fn rows_of<W: Weight, A: Element>(x: &[A], n: usize, len: usize) -> Vec<W::Row<'_, A>> {
    x[..n * len].par_chunks(len).map(W::row).collect()
}
