//! The skeletons that multiply activations and weights as GEMM operands ([`Weight::gemm_nt`]):
//! tokens grouped by expert, the persistent loop over experts, the dense MLP. Plain weights are
//! multiplied beside activations of their own type, blocks beside either.

use super::{Bank, Pair, Routes, blocks, combine_routes, gate_rows, with_pair};
use crate::quant::GemmRows;
use crate::{Element, Grid, Scratch, SharedOut, Weight, clip, values};
use moek_ir::DimName::{F, H, T};
use moek_ir::cpu::Tables;
use moek_ir::reference::Shape;
use rayon::prelude::*;
use std::ops::Range;

/// `n` token rows `xs [n, H]` in token order.
struct Rows<'a, A> {
    xs: &'a [A],
    n: usize,
}

/// Rows a unit of a GEMM phase takes at least, where there are that many: the spec's T split
/// cuts tokens over Spyre's cores, and on a CPU each unit reads its weights whole, so a part of
/// a few rows (an expert's 32 tokens over 8 parts: 4) re-reads them for every few. The T parts
/// are merged into units of this many rows (one block of the f32 tiles, `gemm::MC`); tokens are
/// independent rows, so no sum changes order.
const UNIT_ROWS: usize = 64;

/// The T parts of a GEMM phase over `n` rows, the spec declaring `declared`.
fn row_parts(n: usize, declared: usize) -> usize {
    declared.min(n.div_ceil(UNIT_ROWS)).max(1)
}

/// GEMM gate/up phase: units T x F x H (the first phase's split, T parts merged by
/// [`row_parts`]), H in declared blocks, H parts completed in part order; returns the
/// activation `[n, F]` ([`Weight::Gated`]).
fn gemm_gate_up<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    rows: &Rows<'_, A>,
    gate: &[W],
    up: &[W],
    pair: impl Pair,
) -> Scratch<W::Gated<A>> {
    let (f_n, h_n, n) = (s.f, s.h, rows.n);
    let p = t.cores[0];
    let ph = p.of_dim(H);
    let grid = Grid::new([
        (n, row_parts(n, p.of_dim(T))),
        (f_n, p.of_dim(F)),
        (h_n, ph),
    ]);
    let h_blocks = blocks(&t.reduce_h, h_n);
    // The rows made ready once for gate and up and every unit.
    let xr = GemmRows::new::<W>(rows.xs, n, h_n);
    let mut partials = vec![0f32; ph * n * 2 * f_n];
    {
        let shared = SharedOut::new(&mut partials);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [m, fr, hr] = grid.ranges(unit);
            let hp = grid.index(unit)[2];
            if m.is_empty() || fr.is_empty() {
                return;
            }
            let segs = clip(&h_blocks, hr);
            let ids: Vec<usize> = m.clone().collect();
            for (mat, off) in [(gate, 0), (up, f_n)] {
                let (fl, w) = (fr.len(), values(mat, fr.start * h_n..));
                let mut c = vec![0f32; m.len() * fl];
                xr.gemm(&ids, &segs, w, h_n, &mut c, fl, fl);
                let at = (hp * n + m.start) * 2 * f_n + off + fr.start;
                // SAFETY: this unit owns rows m, columns fr of its H part.
                unsafe { shared.write_tile(at, 2 * f_n, &c, m.len(), fr.len()) };
            }
        });
    }
    // The H parts completed in part order into part 0's rows, then gated: a task a few rows.
    let (first, rest) = partials.split_at_mut(n * 2 * f_n);
    let mut aw = Scratch::<W::Gated<A>>::zeroed(n * f_n);
    first
        .par_chunks_mut(GATE_ROWS * 2 * f_n)
        .zip(aw.par_chunks_mut(GATE_ROWS * f_n))
        .enumerate()
        .for_each(|(c, (gu, a))| {
            add_parts(rest, n * 2 * f_n, c * GATE_ROWS * 2 * f_n, gu);
            gate_rows(gu, a, f_n, None, pair);
        });
    aw
}

/// Rows a task of [`gemm_gate_up`]'s epilogue completes and gates.
const GATE_ROWS: usize = 8;

/// GEMM down phase: `y[fpart][row][H] = aw . down^T`, units T x H x F (the second phase's
/// split, T parts merged by [`row_parts`]), H in column blocks, F in declared blocks; returns
/// `y` and its F parts.
fn gemm_down<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    rows: &Rows<'_, A>,
    aw: &[W::Gated<A>],
    down: &[W],
) -> (Vec<f32>, usize) {
    let (f_n, h_n, n) = (s.f, s.h, rows.n);
    let p = t.cores[1];
    let f_parts = p.of_dim(F);
    let grid = Grid::new([
        (n, row_parts(n, p.of_dim(T))),
        (h_n, p.of_dim(H)),
        (f_n, f_parts),
    ]);
    let f_blocks = blocks(&t.reduce_f, f_n);
    let h_cols = blocks(&t.columns_h, h_n);
    // The gated rows made ready once for every unit and column block.
    let ar = GemmRows::new::<W>(aw, n, f_n);
    let mut y = vec![0f32; f_parts * n * h_n];
    {
        let shared = SharedOut::new(&mut y);
        (0..grid.units()).into_par_iter().for_each(|unit| {
            let [m, hr, fr] = grid.ranges(unit);
            let fp = grid.index(unit)[2];
            if m.is_empty() {
                return;
            }
            let segs = clip(&f_blocks, fr);
            let ids: Vec<usize> = m.clone().collect();
            for (c0, c1) in clip(&h_cols, hr) {
                let (cl, ml) = (c1 - c0, m.len());
                let mut c = vec![0f32; ml * cl];
                ar.gemm(&ids, &segs, values(down, c0 * f_n..), f_n, &mut c, cl, cl);
                // SAFETY: this unit owns rows m, columns c0..c1 of its F part.
                unsafe { shared.write_tile((fp * n + m.start) * h_n + c0, h_n, &c, ml, cl) };
            }
        });
    }
    (y, f_parts)
}

/// `out` = the sum over parts `p`, in order, of row `i` of part `p` of `y` ([`gemm_down`]'s
/// F parts, `out.len()` values a row).
fn sum_parts(y: &[f32], parts: usize, i: usize, out: &mut [f32]) {
    let h = out.len();
    let (first, rest) = y.split_at(y.len() / parts);
    out.copy_from_slice(&first[i * h..][..h]);
    add_parts(rest, first.len(), i * h, out);
}

/// `out += part[at..at + out.len()]` for each part of `len` values in `parts`, in order: a
/// split reduction's partial sums completed in part order.
fn add_parts(parts: &[f32], len: usize, at: usize, out: &mut [f32]) {
    for part in parts.chunks_exact(len) {
        let part = &part[at..][..out.len()];
        out.iter_mut().zip(part).for_each(|(o, v)| *o += v);
    }
}

/// Dense over experts, in a persistent loop: x and the accumulator (`out`) stay, one expert bank
/// per trip; token groups own their accumulator rows. Routing is materialised densely (one
/// weight per token and expert, 0 when unselected); a token whose weight is 0 adds exactly 0, so
/// its rows are skipped (the loop still visits every expert).
pub fn persistent_ffn<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    out: &mut [f32],
) {
    let (t_n, r_n, e_n, f_n, h_n) = (s.t, s.r, s.e, s.f, s.h);
    let route = crate::dense_routes(routes.idx, routes.weights, t_n, r_n, e_n);
    let groups = Grid::new([(t_n, t.groups)]);
    out[..t_n * h_n].fill(0.0);
    for e in 0..e_n {
        let active: Vec<usize> = (0..t_n)
            .filter(|&tok| route[tok * e_n + e] != 0.0)
            .collect();
        if active.is_empty() {
            continue;
        }
        let n = active.len();
        let rows_of = |tr: Range<usize>| {
            active.partition_point(|&tok| tok < tr.start)
                ..active.partition_point(|&tok| tok < tr.end)
        };
        let mut xs = Scratch::<A>::zeroed(n * h_n);
        crate::gather_rows_into(&mut xs, x, h_n, active.iter().copied());
        let bank_gu = values(bank.gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
        let bank_dn = values(bank.down, e * h_n * f_n..(e + 1) * h_n * f_n);
        let rows = Rows { xs: &xs, n };
        let (gate, up) = (values(bank_gu, 0..f_n * h_n), values(bank_gu, f_n * h_n..));
        let aw = with_pair!(t.activation, |pair| gemm_gate_up(
            t, s, &rows, gate, up, pair
        ));
        let (y, f_parts) = gemm_down(t, s, &rows, &aw, bank_dn);
        // Token groups add their tokens' weighted results to the resident accumulator.
        let acc = SharedOut::new(&mut out[..t_n * h_n]);
        (0..groups.units()).into_par_iter().for_each(|g| {
            let [tr] = groups.ranges(g);
            let mut v = vec![0f32; h_n];
            for i in rows_of(tr) {
                let tok = active[i];
                let w = route[tok * e_n + e];
                // SAFETY: token `tok` belongs to this group only.
                let o = unsafe { acc.slice(tok * h_n, h_n) };
                sum_parts(&y, f_parts, i, &mut v);
                o.iter_mut().zip(&v).for_each(|(o, v)| *o += w * v);
            }
        });
    }
}

/// Tokens grouped by expert (data-dependent sizes): one GEMM pair per expert, experts as work
/// units (H in declared blocks for gate/up; H in column blocks, F in declared blocks for down),
/// then the K-axis combine in route order.
pub fn grouped_ffn<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    out: &mut [f32],
) {
    with_pair!(t.activation, |pair| grouped_with(
        t, s, x, routes, bank, pair, out
    ));
}

fn grouped_with<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    routes: Routes<'_>,
    bank: Bank<'_, W>,
    pair: impl Pair,
    out: &mut [f32],
) {
    let (t_n, r_n, e_n, f_n, h_n) = (s.t, s.r, s.e, s.f, s.h);
    let h_blocks = blocks(&t.reduce_h, h_n);
    let f_blocks = blocks(&t.reduce_f, f_n);
    let h_cols = blocks(&t.columns_h, h_n);
    let lists = crate::group_by_expert(&routes.idx[..t_n * r_n], e_n);
    let bias = bank.declared_bias(t);
    // Every token's row made ready once, for gate and up and every expert it routes to.
    let xr = GemmRows::new::<W>(x, t_n, h_n);
    // Every slot is written (each route chose one expert); pooled, so a call does not fault
    // in its pages afresh.
    let mut ys = Scratch::<f32>::zeroed(t_n * r_n * h_n);
    {
        let shared = SharedOut::new(&mut ys);
        (0..e_n).into_par_iter().for_each(|e| {
            let slots = &lists[e];
            if slots.is_empty() {
                return;
            }
            let n = slots.len();
            let tokens: Vec<usize> = slots.iter().map(|s| s / r_n).collect();
            let bank_gu = values(bank.gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
            let bank_dn = values(bank.down, e * h_n * f_n..(e + 1) * h_n * f_n);
            // This worker's scratch, reused from one expert to the next.
            let mut gu = Scratch::<f32>::zeroed(n * 2 * f_n);
            xr.gemm(&tokens, &h_blocks, bank_gu, h_n, &mut gu, 2 * f_n, 2 * f_n);
            let mut aw = Scratch::<W::Gated<A>>::zeroed(n * f_n);
            let bias_gu = bias.gate_up.map(|b| &b[e * 2 * f_n..(e + 1) * 2 * f_n]);
            gate_rows(&gu, &mut aw, f_n, bias_gu, pair);
            // The gated rows made ready once for every column block.
            let ar = GemmRows::new::<W>(&aw, n, f_n);
            let all: Vec<usize> = (0..n).collect();
            let mut y = Scratch::<f32>::zeroed(n * h_n);
            for &(c0, c1) in h_cols.iter() {
                let w = values(bank_dn, c0 * f_n..);
                ar.gemm(&all, &f_blocks, w, f_n, &mut y[c0..], h_n, c1 - c0);
            }
            if let Some(b) = bias.down {
                let b = &b[e * h_n..(e + 1) * h_n];
                y.chunks_exact_mut(h_n)
                    .for_each(|row| row.iter_mut().zip(b).for_each(|(v, b)| *v += b));
            }
            for (i, &slot) in slots.iter().enumerate() {
                // SAFETY: each route slot chose exactly one expert.
                unsafe { shared.slice(slot * h_n, h_n) }
                    .copy_from_slice(&y[i * h_n..(i + 1) * h_n]);
            }
        });
    }
    combine_routes(out, &ys, routes.weights, t_n, r_n, h_n);
}

/// The dense MLP: GEMM gate/up and down over all tokens, then the completed sum over the F parts
/// in part order, each row scaled by `sigmoid(x[t] . output_gate)` if the MLP has that gate.
pub fn dense_mlp<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    x: &[A],
    [gate, up, down]: [&[W]; 3],
    output_gate: Option<&[W]>,
    out: &mut [f32],
) {
    let (t_n, h_n) = (s.t, s.h);
    let output_gate = t
        .optional
        .has(moek_ir::tensors::Optional::OutputGate)
        .then(|| output_gate.expect("the backend checks the spec's output gate is given"));
    let rows = Rows {
        xs: &x[..t_n * h_n],
        n: t_n,
    };
    let aw = with_pair!(t.activation, |pair| gemm_gate_up(
        t, s, &rows, gate, up, pair
    ));
    let (y, f_parts) = gemm_down(t, s, &rows, &aw, down);
    out[..t_n * h_n]
        .par_chunks_mut(h_n)
        .enumerate()
        .for_each(|(tok, o)| {
            let scale = output_gate.map(|w| {
                let mut z = [0f32];
                let xt = &x[tok * h_n..(tok + 1) * h_n];
                W::matvec_segments(xt, w, h_n, 0..1, &[(0, h_n)], &mut z);
                1.0 / (1.0 + (-z[0]).exp())
            });
            sum_parts(&y, f_parts, tok, o);
            if let Some(scale) = scale {
                o.iter_mut().for_each(|o| *o *= scale);
            }
        });
}
