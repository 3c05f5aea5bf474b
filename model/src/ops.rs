//! The CPU-side pieces of the forward pass (until they become DSL ops): RMSNorm, RoPE, linear
//! layers over `[out, in]` weights, attention, softmax.

/// Rotary embedding of one layer kind: `pairs` of the `head_dim / 2` frequency pairs rotate, with
/// `inv_freq[j] = theta^(-2j / head_dim)`; the others pass through (proportional RoPE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub theta: f64,
    pub pairs: usize,
    /// Divides every frequency (`factor`, 1 by default).
    pub factor: f64,
}

/// What attention needs of a layer, in any family: its heads, KV heads, head width, and the
/// window of a sliding layer (`None`: every earlier position is visible).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub window: Option<usize>,
}
use crate::quantized::Stored;
use moek_cpu::quant::{GemmRows, Weight};
use moek_kernels::Element;
use moek_kernels::ir::quant::{BlockMxfp4, BlockQ4_0, BlockQ8_0};
use rayon::prelude::*;
use std::borrow::Borrow;
use std::ops::Range;
use std::sync::OnceLock;

/// RMSNorm over each `n`-wide row, in f32, weight applied as is (Gemma-4: no `1 + w`);
/// `w = None` is the weightless norm.
pub fn rms_norm(x: &mut [f32], n: usize, w: Option<&[f32]>, eps: f32) {
    x.chunks_mut(n).for_each(|row| {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32 + eps;
        let r = 1.0 / ms.sqrt();
        match w {
            Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w),
            None => row.iter_mut().for_each(|v| *v *= r),
        }
    });
}

/// `rms_norm` into a new buffer.
pub fn normed(x: &[f32], n: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut y = x.to_vec();
    rms_norm(&mut y, n, Some(w), eps);
    y
}

/// Rounds activations to the weight dtype (what a 16-bit checkpoint's model computes on).
pub fn to_w<W: Element>(x: &[f32]) -> Vec<W> {
    x.iter().map(|&v| <W as Element>::from_f32(v)).collect()
}

/// `y[t, o] = x[t, :] . w[o, :]` for `rows` rows of `x` (`[rows, inp]`) and `w` `[out, inp]`,
/// plain (`x` rounded to `W`) or in blocks (`x` as it is, quantized per row by the block
/// product where the format does). Output rows are cut across threads; each dot is one f32 sum.
pub fn linear<W: Element>(
    x: &[f32],
    rows: usize,
    w: &Stored<'_, W>,
    out: usize,
    inp: usize,
) -> Vec<f32> {
    let mut ys = linears(x, rows, &[(w, out)], inp);
    ys.pop().expect("one matrix in, one result out")
}

/// [`linear`] for several matrices `(w, out)` applied to the same `x`, in one parallel loop: `x`
/// is rounded once, and the column blocks of all the matrices are the loop's work units, so the
/// workers go from one matrix straight to the next without waiting for each other in between
/// (attention's q, k and v projections).
pub fn linears<W: Element>(
    x: &[f32],
    rows: usize,
    ws: &[(&Stored<'_, W>, usize)],
    inp: usize,
) -> Vec<Vec<f32>> {
    debug_assert_eq!(x.len(), rows * inp);
    // The rows in `W`, for plain matrices and for blocks widened in prefill.
    let plain = ws.iter().any(|(w, _)| matches!(w, Stored::Plain(_)));
    let wide = plain || rows >= moek_cpu::gemm::STREAM_ROWS;
    let a = if wide { to_w::<W>(x) } else { Vec::new() };
    // Rows made ready once for the products of matrices in blocks, shared by their column
    // blocks: decode's (Q8_0 and Q4_0 read the same 8-bit groups), and prefill's GEMM rows
    // (quantized once where the GEMM multiplies in integers).
    let (grouped, widened) = (OnceLock::new(), OnceLock::new());
    let (rows_q8, rows_q4) = (OnceLock::new(), OnceLock::new());
    // Column blocks of the outputs, each a GEMM over all rows: a few per thread, so a GEMM packs
    // its rows of activations a few times per call. A streamed weight (decode) is cut finer, 8
    // blocks per thread, so that threads taking blocks of uneven matrices (q beside k, a
    // 2816-row o_proj) finish together: 2 per thread left one thread reading alone at the end
    // (attention at 69% of the read bandwidth against 81-85% with 8, 26B-A4B on 2 cores).
    let per_thread = if rows < moek_cpu::gemm::STREAM_ROWS {
        8
    } else {
        4
    };
    let total: usize = ws.iter().map(|w| w.1).sum();
    let cols = total
        .div_ceil(per_thread * rayon::current_num_threads())
        .next_multiple_of(64);
    let blocks: Vec<(usize, usize, usize)> = ws
        .iter()
        .enumerate()
        .flat_map(|(i, &(_, out))| {
            (0..out.div_ceil(cols)).map(move |b| (i, b * cols, ((b + 1) * cols).min(out)))
        })
        .collect();
    let results: Vec<Vec<f32>> = blocks
        .par_iter()
        .map(|&(i, c0, c1)| {
            let n = c1 - c0;
            let mut c = vec![0f32; rows * n];
            match ws[i].0 {
                Stored::Plain(w) => {
                    debug_assert_eq!(w.len(), ws[i].1 * inp);
                    let w = &w[c0 * inp..c1 * inp];
                    moek_cpu::gemm_nt(&a, inp, w, inp, &mut c, n, rows, n, inp);
                }
                Stored::Q8_0(b) => {
                    let ready = || prepared::<BlockQ8_0>(x, inp);
                    let ready = || &grouped.get_or_init(ready)[..];
                    let gemm = || rows_q8.get_or_init(|| GemmRows::new::<BlockQ8_0>(&a, rows, inp));
                    block_rows(x, ready, gemm, b, inp, c0..c1, &mut c)
                }
                Stored::Q4_0(b) => {
                    let ready = || prepared::<BlockQ8_0>(x, inp);
                    let ready = || &grouped.get_or_init(ready)[..];
                    let gemm = || rows_q4.get_or_init(|| GemmRows::new::<BlockQ4_0>(&a, rows, inp));
                    block_rows(x, ready, gemm, b, inp, c0..c1, &mut c)
                }
                Stored::Mxfp4(b) => {
                    let ready = || prepared::<BlockMxfp4>(x, inp);
                    let ready = || &widened.get_or_init(ready)[..];
                    let gemm = || GemmRows::new::<BlockMxfp4>(&a, rows, inp);
                    block_rows(x, ready, gemm, b, inp, c0..c1, &mut c)
                }
            }
            c
        })
        .collect();
    let mut ys: Vec<Vec<f32>> = ws.iter().map(|&(_, out)| vec![0f32; rows * out]).collect();
    for (&(i, c0, c1), c) in blocks.iter().zip(&results) {
        let (out, n) = (ws[i].1, c1 - c0);
        for t in 0..rows {
            ys[i][t * out + c0..][..n].copy_from_slice(&c[t * n..(t + 1) * n]);
        }
    }
    ys
}

/// Every row of `x` (`[rows, inp]`) made ready for `Q`'s products.
fn prepared<Q: Weight>(x: &[f32], inp: usize) -> Vec<Q::Row<'_, f32>> {
    x.chunks_exact(inp).map(Q::row).collect()
}

/// Outputs `cols` of every row of `x` (`[rows, inp]`) against a matrix in blocks, into `c`
/// (`[rows, cols.len()]`). A few rows (decode): a row product per activation row, each row
/// made ready once (`ready`) for every column block. More (prefill): one GEMM over the blocks
/// (`moek_cpu::quant::GemmRows::gemm`, the rows in the model's type made ready once for every
/// column block and matrix, `gemm`), whose tiles multiply a panel of the columns at a time; it
/// outruns integer dots row by row. Its rounding is the experts' prefill's
/// (docs/quantization.md).
#[allow(clippy::too_many_arguments)]
fn block_rows<'x, 'a, W: Element, Q: Weight, G: Borrow<GemmRows<'a, W>>>(
    x: &[f32],
    ready: impl FnOnce() -> &'x [Q::Row<'x, f32>],
    gemm: impl FnOnce() -> G,
    blocks: &[Q],
    inp: usize,
    cols: Range<usize>,
    c: &mut [f32],
) {
    let (n, rows) = (cols.len(), x.len() / inp);
    if rows < moek_cpu::gemm::STREAM_ROWS {
        for (xr, cr) in ready().iter().zip(c.chunks_exact_mut(n)) {
            Q::matvec_row(xr, blocks, inp, cols.clone(), &[(0, inp)], cr);
        }
        return;
    }
    let per_row = inp / Q::VALUES;
    let w = &blocks[cols.start * per_row..cols.end * per_row];
    let all: Vec<usize> = (0..rows).collect();
    gemm().borrow().gemm(&all, &[(0, inp)], w, inp, c, n, n);
}

/// Inverse frequencies of a layer's RoPE: `theta^(-2j/d) / factor` for the rotated pairs, 0 for
/// the pairs that pass through.
pub fn inv_freq(rope: &Rope, d: usize) -> Vec<f32> {
    (0..d / 2)
        .map(|j| {
            if j < rope.pairs {
                (1.0 / rope.theta.powf(2.0 * j as f64 / d as f64) / rope.factor) as f32
            } else {
                0.0
            }
        })
        .collect()
}

/// Rotates each `d`-wide head of `x` (`[rows, heads, d]`) at its row's position: pairs are
/// `(i, i + d/2)` (the halves convention).
pub fn rope(x: &mut [f32], d: usize, positions: &[usize], inv: &[f32]) {
    let per_row = x.len() / positions.len();
    x.chunks_mut(per_row).zip(positions).for_each(|(row, &p)| {
        let (cos, sin): (Vec<f32>, Vec<f32>) = inv
            .iter()
            .map(|f| {
                let a = p as f32 * f;
                (a.cos(), a.sin())
            })
            .unzip();
        row.chunks_mut(d).for_each(|head| {
            let (lo, hi) = head.split_at_mut(d / 2);
            for j in 0..d / 2 {
                let (a, b) = (lo[j], hi[j]);
                lo[j] = a * cos[j] - b * sin[j];
                hi[j] = b * cos[j] + a * sin[j];
            }
        });
    });
}

/// Causal attention of `s` new queries (`q` `[s, heads, d]`, positions `qpos`) over `n` keys and
/// values held by KV head (`k[g]`, `v[g]` `[n, d]`, positions `kpos`), score scale 1, softmax in
/// f32; a sliding layer sees keys with `0 <= q - k < window`; `sinks`, one logit per head, join
/// each softmax's denominator. Both position lists ascend (the cache appends in order). Returns
/// `[s, heads * d]`.
///
/// Work goes by KV head and block of query rows, so the heads sharing a KV head read its keys
/// and values once, as one contiguous run: the block's query rows of all those heads are one
/// matrix, scored against every key up to the block's last position as one GEMM (a prompt's
/// later keys are invisible to the whole block), masked to `-inf` where invisible (probability
/// exactly 0), softmaxed by row, then multiplied by the values: a GEMM against the values
/// transposed once per call, or a sum of scaled value rows when the rows are too few to pay for
/// the transpose (decode).
pub fn attention(
    shape: Heads,
    q: &[f32],
    qpos: &[usize],
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    kpos: &[usize],
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let (d, kv, heads) = (shape.head_dim, shape.kv_heads, shape.heads);
    let (s, n) = (qpos.len(), kpos.len());
    debug_assert!(
        kpos.is_sorted() && qpos.is_sorted(),
        "attention: positions in order"
    );
    assert!(
        k.len() == kv && v.len() == kv,
        "attention: {kv} KV heads expected"
    );
    let group = heads / kv;
    // Query positions per block: about 256 score rows (QB x n scores in flight per task).
    let qb = (256 / group).max(1);
    let visible = |p: usize, kp: usize| kp <= p && shape.window.is_none_or(|w| p - kp < w);
    // `vt[g]` is value head g transposed, `[d, n]`.
    let vt: Option<Vec<Vec<f32>>> = (s >= moek_cpu::gemm::STREAM_ROWS).then(|| {
        v.par_iter()
            .map(|vg| {
                let mut t = vec![0f32; d * n];
                for (j, row) in vg.chunks(d).enumerate() {
                    for (dd, &x) in row.iter().enumerate() {
                        t[dd * n + j] = x;
                    }
                }
                t
            })
            .collect()
    });
    let tasks: Vec<(usize, usize)> = (0..kv)
        .flat_map(|g| (0..s).step_by(qb).map(move |q0| (g, q0)))
        .collect();
    let outs: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(g, q0)| {
            let qs = qb.min(s - q0);
            // Rows (i, hh): query position q0 + i, head g * group + hh.
            let rows = qs * group;
            let qg: Vec<f32> = (0..qs)
                .flat_map(|i| &q[((q0 + i) * heads + g * group) * d..][..group * d])
                .copied()
                .collect();
            // Keys after the block's last query are masked on every row (causal): they are not
            // computed. Keys are in position order (the cache appends in order), so they are a
            // suffix; every sum runs in the same order with or without them (they add exact
            // zeros at the end), so the result is the same bit for bit.
            let nv = kpos.partition_point(|&kp| kp <= qpos[q0 + qs - 1]);
            let mut sc = vec![0f32; rows * nv];
            moek_cpu::gemm_nt(&qg, d, &k[g], d, &mut sc, nv, rows, nv, d);
            for (r, row) in sc.chunks_mut(nv).enumerate() {
                let p = qpos[q0 + r / group];
                for (x, &kp) in row.iter_mut().zip(kpos) {
                    if !visible(p, kp) {
                        *x = f32::NEG_INFINITY;
                    }
                }
                softmax_beside_sink(row, sinks.map(|s| s[g * group + r % group]));
            }
            let mut o = vec![0f32; rows * d];
            match &vt {
                Some(vt) => moek_cpu::gemm_nt(&sc, nv, &vt[g], n, &mut o, d, rows, d, nv),
                None => {
                    for (j, vj) in v[g].chunks(d).take(nv).enumerate() {
                        for (orow, probs) in o.chunks_mut(d).zip(sc.chunks(nv)) {
                            if probs[j] > 0.0 {
                                moek_cpu::axpy(probs[j], vj, orow);
                            }
                        }
                    }
                }
            }
            o
        })
        .collect();
    let mut out = vec![0f32; s * heads * d];
    for (&(g, q0), o) in tasks.iter().zip(&outs) {
        for (r, row) in o.chunks(d).enumerate() {
            let (i, hh) = (r / group, r % group);
            out[((q0 + i) * heads + g * group + hh) * d..][..d].copy_from_slice(row);
        }
    }
    out
}

/// The indices of the `k` largest of `p`, largest first; ties go to the lower index (a stable
/// sort), as a router picks its experts.
pub fn top_k(p: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
    order.truncate(k);
    order
}

/// Probabilities below this (2^-64) are 0 (see [`softmax_in_place`]).
pub const PROB_FLUSH: f32 = 5.421_011e-20;

/// Softmax in f32 (max subtracted first).
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let mut e = x.to_vec();
    softmax_in_place(&mut e);
    e
}

/// [`softmax`] over `x` itself; `-inf` entries get probability 0 (at least one must be finite).
///
/// Probabilities below [`PROB_FLUSH`] are flushed to 0: subnormal operands and products cost
/// the FMA units a microcode assist each (measured: a 512-key attention on peaked scores ran 25x
/// slower with subnormal probabilities, and 2-4x slower with products `p * v` turning subnormal).
/// A flushed term moves a sum over `n` values by at most `n * 2^-64 * max|v|`, while its largest
/// term is at least `max|v| / n`-sized: far below f32 resolution for any context length.
pub fn softmax_in_place(x: &mut [f32]) {
    softmax_beside_sink(x, None);
}

/// [`softmax_in_place`] with one more logit, `sink`, in the denominator only (gpt-oss's learned
/// attention sink: the probabilities then sum to less than 1).
pub fn softmax_beside_sink(x: &mut [f32], sink: Option<f32>) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let m = sink.map_or(m, |s| m.max(s));
    x.iter_mut().for_each(|v| *v = (*v - m).exp());
    let sum: f32 = x.iter().sum::<f32>() + sink.map_or(0.0, |s| (s - m).exp());
    x.iter_mut().for_each(|v| {
        *v /= sum;
        if *v < PROB_FLUSH {
            *v = 0.0;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attention formula in f64, one query row and head at a time, over visible keys only.
    fn attention_f64(
        shape: Heads,
        q: &[f32],
        qpos: &[usize],
        k: &[f32],
        v: &[f32],
        kpos: &[usize],
    ) -> Vec<f64> {
        let (d, kv, heads) = (shape.head_dim, shape.kv_heads, shape.heads);
        let mut out = vec![0f64; qpos.len() * heads * d];
        for (i, &p) in qpos.iter().enumerate() {
            for h in 0..heads {
                let g = h / (heads / kv);
                let qh = &q[(i * heads + h) * d..][..d];
                let seen: Vec<usize> = (0..kpos.len())
                    .filter(|&j| kpos[j] <= p && shape.window.is_none_or(|w| p - kpos[j] < w))
                    .collect();
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&j| {
                        let kh = &k[(j * kv + g) * d..][..d];
                        qh.iter().zip(kh).map(|(a, b)| *a as f64 * *b as f64).sum()
                    })
                    .collect();
                let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for (&j, w) in seen.iter().zip(e) {
                    let vh = &v[(j * kv + g) * d..][..d];
                    for (o, x) in out[(i * heads + h) * d..][..d].iter_mut().zip(vh) {
                        *o += w / sum * *x as f64;
                    }
                }
            }
        }
        out
    }

    /// Both layer kinds of the tiny model (sliding with a 4-key window and two KV heads; full with
    /// one), prefill-sized blocks (the transposed-value GEMM) and single rows (decode), after a
    /// cache of earlier positions: every output within 1e-5 of the f64 formula, none NaN.
    #[test]
    fn attention_matches_f64_on_both_paths() {
        let cfg = crate::gemma4::tiny::config();
        let val = |i: usize, salt: usize| (((i * 31 + salt) % 23) as f32 - 11.0) / 9.0;
        for layer in &cfg.layers[..2] {
            let shape = Heads {
                heads: cfg.num_attention_heads,
                kv_heads: layer.num_key_value_heads,
                head_dim: layer.head_dim,
                window: (layer.attention == crate::gemma4::config::Attention::Sliding)
                    .then_some(cfg.sliding_window),
            };
            let (d, kv, heads) = (shape.head_dim, shape.kv_heads, shape.heads);
            for (cached, s) in [(0, 7), (5, 6), (9, 1), (0, 1)] {
                let n = cached + s;
                let qpos: Vec<usize> = (cached..n).collect();
                let kpos: Vec<usize> = (0..n).collect();
                let q: Vec<f32> = (0..s * heads * d).map(|i| val(i, 1)).collect();
                let k: Vec<f32> = (0..n * kv * d).map(|i| val(i, 2)).collect();
                let v: Vec<f32> = (0..n * kv * d).map(|i| val(i, 3)).collect();
                let by_head = |x: &[f32]| -> Vec<Vec<f32>> {
                    (0..kv)
                        .map(|g| {
                            (0..n)
                                .flat_map(|j| x[(j * kv + g) * d..][..d].to_vec())
                                .collect()
                        })
                        .collect()
                };
                let got = attention(shape, &q, &qpos, &by_head(&k), &by_head(&v), &kpos, None);
                let want = attention_f64(shape, &q, &qpos, &k, &v, &kpos);
                for (g, w) in got.iter().zip(&want) {
                    assert!(
                        (*g as f64 - w).abs() <= 1e-5,
                        "{:?} cached {cached} rows {s}: {g} vs {w}",
                        layer.attention
                    );
                }
            }
        }
    }

    #[test]
    fn softmax_flushes_only_negligible_probabilities() {
        let mut x = vec![0.0, -50.0, -100.0, f32::NEG_INFINITY];
        softmax_in_place(&mut x);
        // e^-50 = 1.9e-22 is below 2^-64 and flushed; e^-100 and -inf are 0 either way.
        assert_eq!(&x[1..], &[0.0, 0.0, 0.0]);
        assert_eq!(x[0], 1.0);
        let mut y = vec![0.0, -40.0];
        softmax_in_place(&mut y);
        assert!(y[1] > 0.0, "e^-40 = 4.2e-18 is kept");
    }
}
