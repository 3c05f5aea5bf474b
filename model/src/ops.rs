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
/// `w = None` is the weightless norm. Rows go to the pool's threads (a prompt's are thousands),
/// each squared sum in [`LANES`] lanes.
pub fn rms_norm(x: &mut [f32], n: usize, w: Option<&[f32]>, eps: f32) {
    x.par_chunks_mut(n).for_each(|row| {
        moek_cpu::isa::vectorised(
            #[inline(always)]
            || {
                let squares = lanes(row, 0.0, |s, v| s + v * v, |a, b| a + b);
                let r = 1.0 / (squares / n as f32 + eps).sqrt();
                match w {
                    Some(w) => row.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w),
                    None => row.iter_mut().for_each(|v| *v *= r),
                }
            },
        )
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
    moek_cpu::isa::vectorised(
        #[inline(always)]
        || x.iter().map(|&v| <W as Element>::from_f32(v)).collect(),
    )
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

/// The cosines and sines of RoPE's angles at each of a call's positions, `[positions, d/2]`:
/// made once and applied to both q and k ([`Rotation::apply`]).
#[derive(Debug)]
pub struct Rotation {
    cos: Vec<f32>,
    sin: Vec<f32>,
    pairs: usize,
}

impl Rotation {
    /// The angles `position * inv[j]` of every position (in f32, as each rotation used them).
    pub fn new(positions: &[usize], inv: &[f32]) -> Rotation {
        let pairs = inv.len();
        let mut cos = vec![0f32; positions.len() * pairs];
        let mut sin = vec![0f32; positions.len() * pairs];
        cos.par_chunks_mut(pairs.max(1))
            .zip(sin.par_chunks_mut(pairs.max(1)))
            .zip(positions)
            .for_each(|((c, s), &p)| {
                for ((c, s), f) in c.iter_mut().zip(s.iter_mut()).zip(inv) {
                    (*s, *c) = (p as f32 * f).sin_cos();
                }
            });
        Rotation { cos, sin, pairs }
    }

    /// Rotates each `d`-wide head of `x` (`[rows, heads, d]`, a row a position) at its row's
    /// position: pairs are `(i, i + d/2)` (the halves convention).
    pub fn apply(&self, x: &mut [f32], d: usize) {
        assert_eq!(
            d / 2,
            self.pairs,
            "heads of {d} against {} pairs",
            self.pairs
        );
        let per_row = x.len() / (self.cos.len() / self.pairs);
        x.par_chunks_mut(per_row)
            .zip(self.cos.par_chunks(self.pairs))
            .zip(self.sin.par_chunks(self.pairs))
            .for_each(|((row, cos), sin)| {
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
}

/// Causal attention of `s` new queries (`q` `[s, heads, d]`, positions `qpos`) over `n` keys and
/// values held by KV head (`k[g]`, `v[g]` `[n, d]`, positions `kpos`), score scale 1, softmax in
/// f32; a sliding layer sees keys with `0 <= q - k < window`; `sinks`, one logit per head, join
/// each softmax's denominator. Both position lists ascend (the cache appends in order). Returns
/// `[s, heads * d]`.
///
/// The products multiply operands in the model's type `W`, as the model's own framework does
/// in that type: the queries and the probabilities are rounded to `W` here, and the cache holds
/// the keys and values in `W`; the sums are f32. So a bf16 model's prompt runs its attention on
/// the bf16 GEMM tiles (AMX where present), and its decode multiplies the same values, the
/// probabilities' value sums widened to f32 (exact products either way: the two differ by
/// summation order only).
///
/// Work goes by KV head and block of query rows, so the heads sharing a KV head read its keys
/// and values once, as one contiguous run: the block's query rows of all those heads are one
/// matrix, scored against every key up to the block's last position as one GEMM (a prompt's
/// later keys are invisible to the whole block), each row softmaxed over the keys it sees (the
/// others' probabilities exactly 0), then multiplied by the values: a GEMM against the values
/// transposed once per call, or a sum of scaled value rows when the rows are too few to pay for
/// the transpose (decode).
pub fn attention<W: Element>(
    shape: Heads,
    q: &[f32],
    qpos: &[usize],
    k: &[Vec<W>],
    v: &[Vec<W>],
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
    // The keys a query at `p` sees, `0 <= p - kp < window`: a run of the ascending `kpos`.
    let seen = |p: usize| {
        let first = shape
            .window
            .map_or(0, |w| kpos.partition_point(|&kp| kp + w <= p));
        (first, kpos.partition_point(|&kp| kp <= p))
    };
    // A prompt's GEMM operand, once a call: each KV head's values transposed (`[d, n]`).
    let gemm: Option<Vec<Vec<W>>> = (s >= moek_cpu::gemm::STREAM_ROWS).then(|| {
        v.par_iter()
            .map(|vg| {
                let mut t = vec![W::default(); d * n];
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
            let mut qg = Vec::with_capacity(rows * d);
            for i in 0..qs {
                qg.extend_from_slice(&q[((q0 + i) * heads + g * group) * d..][..group * d]);
            }
            // Keys after the block's last query are masked on every row (causal): they are not
            // computed. Keys are in position order (the cache appends in order), so they are a
            // suffix; every sum runs in the same order with or without them (they add exact
            // zeros at the end), so the result is the same bit for bit.
            let nv = kpos.partition_point(|&kp| kp <= qpos[q0 + qs - 1]);
            // Without the GEMMs (decode), keys before the block's first query's window (a
            // sliding layer's cache holds some) are not scored either: each score is its own
            // dot product and the values' sum skips zero probabilities, so the result is the
            // same bit for bit. Scores are kept from key `lo` on.
            let lo = if gemm.is_some() { 0 } else { seen(qpos[q0]).0 };
            let w = nv - lo;
            // The thread's scratch: the next task reuses these pages.
            let mut sc = moek_cpu::Scratch::<f32>::zeroed(rows * w);
            let qw = to_w::<W>(&qg);
            moek_cpu::gemm_nt(&qw, d, &k[g][lo * d..], d, &mut sc, w, rows, w, d);
            let sink = |r: usize| sinks.map(|s| s[g * group + r % group]);
            let mut o = vec![0f32; rows * d];
            match &gemm {
                Some(ops) => {
                    // The probabilities straight into `W`, the GEMM's operand.
                    let mut pw = moek_cpu::Scratch::<W>::zeroed(rows * nv);
                    for (r, (row, p)) in sc.chunks_mut(nv).zip(pw.chunks_mut(nv)).enumerate() {
                        let (first, end) = seen(qpos[q0 + r / group]);
                        softmax_into(&mut row[first..end], sink(r), &mut p[first..end]);
                    }
                    moek_cpu::gemm_nt(&pw, nv, &ops[g], n, &mut o, d, rows, d, nv);
                }
                None => {
                    for (r, row) in sc.chunks_mut(w).enumerate() {
                        let (first, end) = seen(qpos[q0 + r / group]);
                        let (first, end) = (first - lo, end - lo);
                        row[..first].fill(0.0);
                        row[end..].fill(0.0);
                        softmax_beside_sink(&mut row[first..end], sink(r));
                    }
                    round_to::<W>(&mut sc);
                    for (j, vj) in v[g].chunks(d).skip(lo).take(w).enumerate() {
                        for (orow, probs) in o.chunks_mut(d).zip(sc.chunks(w)) {
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
    // Position `t`'s heads of KV head `g` are rows `t % qb` of task `(g, t / qb)`: gathered by
    // position, in parallel (a prompt's output is tens of megabytes).
    let blocks = s.div_ceil(qb);
    let mut out = vec![0f32; s * heads * d];
    out.par_chunks_mut(heads * d)
        .enumerate()
        .for_each(|(t, row)| {
            for (g, heads) in row.chunks_mut(group * d).enumerate() {
                let o = &outs[g * blocks + t / qb];
                heads.copy_from_slice(&o[(t % qb) * group * d..][..group * d]);
            }
        });
    out
}

/// `x` rounded to the nearest values of `W`, kept in f32 (exact): what attention's operands
/// are multiplied as.
pub fn round_to<W: Element>(x: &mut [f32]) {
    if W::KIND != f32::KIND {
        moek_cpu::isa::vectorised(
            #[inline(always)]
            || x.iter_mut().for_each(|v| *v = W::from_f32(*v).to_f32()),
        )
    }
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
/// attention sink: the probabilities then sum to less than 1). The maximum and the sum run in
/// [`LANES`] lanes, added at the end, and the exponentials are [`exp_nonpositive`]'s: a prompt's
/// attention takes millions, which libm's `expf` (a call per value) spent most of its time on.
pub fn softmax_beside_sink(x: &mut [f32], sink: Option<f32>) {
    moek_cpu::isa::vectorised(
        #[inline(always)]
        || {
            let inv = exponentials(x, sink);
            x.iter_mut().for_each(|v| *v = probability(*v, inv));
        },
    )
}

/// [`softmax_beside_sink`] of `x` written to `p` in `W` (a GEMM's operand), in the same pass
/// that scales them; `x` is left holding the exponentials.
fn softmax_into<W: Element>(x: &mut [f32], sink: Option<f32>, p: &mut [W]) {
    moek_cpu::isa::vectorised(
        #[inline(always)]
        || {
            let inv = exponentials(x, sink);
            for (p, &e) in p.iter_mut().zip(x.iter()) {
                *p = W::from_f32(probability(e, inv));
            }
        },
    )
}

/// `x` replaced by `e^(x - m)` (`m` the largest of `x` and `sink`), summed in the same pass;
/// returns one over that sum (the sink's term included).
#[inline(always)]
fn exponentials(x: &mut [f32], sink: Option<f32>) -> f32 {
    let m = lanes(x, f32::NEG_INFINITY, f32::max, f32::max);
    let m = sink.map_or(m, |s| m.max(s));
    let mut acc = [0f32; LANES];
    for c in x.chunks_mut(LANES) {
        for (a, v) in acc.iter_mut().zip(c) {
            *v = exp_nonpositive(*v - m);
            *a += *v;
        }
    }
    let sum = acc.into_iter().fold(0.0, |a, b| a + b);
    1.0 / (sum + sink.map_or(0.0, |s| exp_nonpositive(s - m)))
}

/// An exponential times one over the sum, flushed to 0 below [`PROB_FLUSH`].
#[inline(always)]
fn probability(e: f32, inv: f32) -> f32 {
    let p = e * inv;
    if p < PROB_FLUSH { 0.0 } else { p }
}

/// Lanes a softmax reduces in: one 512-bit vector of f32.
const LANES: usize = 16;

/// `x` folded by `step` in [`LANES`] independent lanes (element `i` into lane `i % LANES`), the
/// lanes then folded by `combine`: a shape the compiler keeps in vectors.
#[inline(always)]
fn lanes(
    x: &[f32],
    init: f32,
    step: impl Fn(f32, f32) -> f32,
    combine: impl Fn(f32, f32) -> f32,
) -> f32 {
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = step(*a, v);
        }
    }
    for (a, &v) in acc.iter_mut().zip(tail) {
        *a = step(*a, v);
    }
    acc.into_iter().fold(init, combine)
}

/// `e^x` for `x <= 0` (a softmax's shifted logits) in f32 arithmetic the compiler vectorises:
/// `x = n ln 2 + r` (`|r| <= ln 2 / 2`, `n ln 2` in two parts so `r` is exact), `e^r` by Cephes'
/// `expf` polynomial, `2^n` written into the exponent bits. Within 2 ulps of the exact value
/// (tested against f64); below -87, where `e^x` nears the smallest normal f32, it is `e^-87`
/// (`1.6e-38`: [`PROB_FLUSH`] makes it 0, and no subnormal is ever made); NaN stays NaN.
#[inline(always)]
fn exp_nonpositive(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 x 2^23: adding and taking it away rounds to a whole number (see `round_small` in
    // moek-cpu's quantizer).
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 0.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5;
    let e = p * r * r + r + 1.0;
    // `n` as an integer is `t`'s low bits less `ROUND`'s (a float-to-int conversion would not
    // vectorise: Rust's saturates), biased and shifted into the exponent.
    let biased = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127);
    e * f32::from_bits(biased << 23)
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

    /// What attention needs of one of the tiny Gemma-4's layers.
    fn tiny_heads(
        cfg: &crate::gemma4::config::Config,
        layer: &crate::gemma4::config::Layer,
    ) -> Heads {
        Heads {
            heads: cfg.num_attention_heads,
            kv_heads: layer.num_key_value_heads,
            head_dim: layer.head_dim,
            window: cfg.window(layer),
        }
    }

    /// The first `n` positions of `x` (`[positions, kv, d]`) by KV head, as the cache holds them.
    fn by_head<W: Element>(x: &[f32], shape: Heads, n: usize) -> Vec<Vec<W>> {
        let (kv, d) = (shape.kv_heads, shape.head_dim);
        (0..kv)
            .map(|g| {
                (0..n)
                    .flat_map(|j| x[(j * kv + g) * d..][..d].iter().map(|&v| W::from_f32(v)))
                    .collect()
            })
            .collect()
    }

    /// Both layer kinds of the tiny model (sliding with a 4-key window and two KV heads; full with
    /// one), prefill-sized blocks (the transposed-value GEMM) and single rows (decode), after a
    /// cache of earlier positions: every output within 1e-5 of the f64 formula, none NaN.
    #[test]
    fn attention_matches_f64_on_both_paths() {
        let cfg = crate::gemma4::tiny::config();
        let val = |i: usize, salt: usize| (((i * 31 + salt) % 23) as f32 - 11.0) / 9.0;
        for layer in &cfg.layers[..2] {
            let shape = tiny_heads(&cfg, layer);
            let (d, kv, heads) = (shape.head_dim, shape.kv_heads, shape.heads);
            for (cached, s) in [(0, 7), (5, 6), (9, 1), (0, 1)] {
                let n = cached + s;
                let qpos: Vec<usize> = (cached..n).collect();
                let kpos: Vec<usize> = (0..n).collect();
                let q: Vec<f32> = (0..s * heads * d).map(|i| val(i, 1)).collect();
                let k: Vec<f32> = (0..n * kv * d).map(|i| val(i, 2)).collect();
                let v: Vec<f32> = (0..n * kv * d).map(|i| val(i, 3)).collect();
                let (kh, vh) = (by_head(&k, shape, n), by_head(&v, shape, n));
                let got = attention::<f32>(shape, &q, &qpos, &kh, &vh, &kpos, None);
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

    /// In bf16 the prompt's path (bf16 GEMMs) and the one-row path (f32 products of the same
    /// rounded values) differ by summation order only: each prompt row within 1e-5 of the row
    /// computed alone. Against the f64 formula on the rounded keys, values and queries, the
    /// probabilities' rounding (half a bf16 step, 2^-9 of each) bounds the error by
    /// `2^-9 max|v|`.
    #[test]
    fn attention_in_bf16_is_one_function_on_both_paths() {
        use half::bf16;
        let cfg = crate::gemma4::tiny::config();
        let round = |x: Vec<f32>| -> Vec<f32> {
            let mut x = x;
            round_to::<bf16>(&mut x);
            x
        };
        let val = |i: usize, salt: usize| (((i * 37 + salt) % 29) as f32 - 14.0) / 7.3;
        for layer in &cfg.layers[..2] {
            let shape = tiny_heads(&cfg, layer);
            let (d, kv, heads) = (shape.head_dim, shape.kv_heads, shape.heads);
            let n = 9;
            let pos: Vec<usize> = (0..n).collect();
            let q = round((0..n * heads * d).map(|i| val(i, 1)).collect());
            let k = round((0..n * kv * d).map(|i| val(i, 2)).collect());
            let v = round((0..n * kv * d).map(|i| val(i, 3)).collect());
            let vmax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            let (kh, vh) = (by_head::<bf16>(&k, shape, n), by_head(&v, shape, n));
            let prompt = attention::<bf16>(shape, &q, &pos, &kh, &vh, &pos, None);
            let want = attention_f64(shape, &q, &pos, &k, &v, &pos);
            for (i, row) in prompt.chunks(heads * d).enumerate() {
                let (kh, vh) = (by_head::<bf16>(&k, shape, i + 1), by_head(&v, shape, i + 1));
                let qi = &q[i * heads * d..][..heads * d];
                let alone = attention::<bf16>(shape, qi, &pos[i..=i], &kh, &vh, &pos[..=i], None);
                for ((a, b), w) in row.iter().zip(&alone).zip(&want[i * heads * d..]) {
                    assert!((a - b).abs() <= 1e-5, "row {i}: {a} prompt, {b} alone");
                    let bound = f64::from(vmax) / 512.0 + 1e-5;
                    assert!((f64::from(*a) - w).abs() <= bound, "row {i}: {a} vs {w}");
                }
            }
        }
    }

    /// Every f32 step of [-87, 0] a few thousand apart, and the ends: within 2 ulps of f64's
    /// `exp`, rounded; below -87 the stated `e^-87`; NaN in, NaN out.
    #[test]
    fn exp_nonpositive_is_within_two_ulps() {
        let ulps = |x: f32| {
            let (got, want) = (exp_nonpositive(x), f64::from(x).exp() as f32);
            (got.to_bits() as i64 - want.to_bits() as i64).abs()
        };
        // Negative f32s ascend in magnitude with their bits, from -0.
        let (lo, hi) = ((-87f32).to_bits(), (-0f32).to_bits());
        let worst = (hi..=lo)
            .step_by(4099)
            .chain([lo, hi, (-1e-30f32).to_bits()])
            .map(|b| ulps(f32::from_bits(b)))
            .max()
            .unwrap();
        assert!(worst <= 2, "{worst} ulps");
        assert_eq!(exp_nonpositive(-1000.0), exp_nonpositive(-87.0));
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), exp_nonpositive(-87.0));
        assert!(exp_nonpositive(f32::NAN).is_nan());
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
