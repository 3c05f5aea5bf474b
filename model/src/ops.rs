//! The CPU-side pieces of the forward pass (until they become DSL ops): RMSNorm, RoPE, linear
//! layers over `[out, in]` weights, attention, softmax.

use crate::config::{Config, Layer, Rope};
use moek_kernels::Elem;
use rayon::prelude::*;

/// A storage dtype the model computes on: a kernel dtype the CPU primitives also take.
pub trait Float: Elem + moek_cpu::Element {}
impl<T: Elem + moek_cpu::Element> Float for T {}

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
pub fn to_w<W: Elem>(x: &[f32]) -> Vec<W> {
    x.iter().map(|&v| <W as Elem>::from_f32(v)).collect()
}

/// `y[t, o] = x[t, :] . w[o, :]` for `rows` rows of `x` (`[rows, inp]`, rounded to `W`) and
/// `w` `[out, inp]`. Output rows are cut across threads; each dot is one f32 sum.
pub fn linear<W: Float>(x: &[f32], rows: usize, w: &[W], out: usize, inp: usize) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * inp);
    debug_assert_eq!(w.len(), out * inp);
    let a = to_w::<W>(x);
    let mut y = vec![0f32; rows * out];
    // Column blocks of the output, each a GEMM over all rows: a few per thread, so a GEMM packs
    // its rows of activations a few times per call, not once per 64 columns.
    let cols = out
        .div_ceil(4 * rayon::current_num_threads())
        .next_multiple_of(64);
    let mut blocks: Vec<(usize, Vec<f32>)> = (0..out.div_ceil(cols))
        .into_par_iter()
        .map(|b| {
            let (c0, c1) = (b * cols, ((b + 1) * cols).min(out));
            let mut c = vec![0f32; rows * (c1 - c0)];
            moek_cpu::gemm_nt(
                &a,
                inp,
                &w[c0 * inp..c1 * inp],
                inp,
                &mut c,
                c1 - c0,
                rows,
                c1 - c0,
                inp,
            );
            (c0, c)
        })
        .collect();
    for (c0, c) in blocks.drain(..) {
        let n = c.len() / rows;
        for t in 0..rows {
            y[t * out + c0..t * out + c0 + n].copy_from_slice(&c[t * n..(t + 1) * n]);
        }
    }
    y
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
/// values (`[n, kv, d]`, positions `kpos`), score scale 1, softmax in f32; a sliding layer sees
/// keys with `0 <= q - k < window`. Returns `[s, heads * d]`.
///
/// Per head, in blocks of query rows: scores for every key as one GEMM, masked to `-inf` where
/// invisible (their probability is exactly 0), softmax per row, then probabilities times values
/// as a GEMM against the values transposed once per call (a sum of scaled value rows when the
/// rows are too few to pay for the transpose, as in decode).
pub fn attention(
    cfg: &Config,
    layer: &Layer,
    q: &[f32],
    qpos: &[usize],
    k: &[f32],
    v: &[f32],
    kpos: &[usize],
) -> Vec<f32> {
    /// Query rows per block: bounds the scores to `QB x n` per head in flight.
    const QB: usize = 128;
    let (d, kv, heads) = (layer.head_dim, layer.kv_heads, cfg.heads);
    let (s, n) = (qpos.len(), kpos.len());
    let group = heads / kv;
    let sliding = layer.attention == crate::config::Attention::Sliding;
    let visible = |p: usize, kp: usize| kp <= p && (!sliding || p - kp < cfg.window);
    // `vt[g]` is value head g transposed, `[d, n]`.
    let vt: Option<Vec<f32>> = (s >= moek_cpu::gemm::STREAM_ROWS).then(|| {
        let mut t = vec![0f32; kv * d * n];
        t.par_chunks_mut(d * n).enumerate().for_each(|(g, tg)| {
            for j in 0..n {
                let row = &v[(j * kv + g) * d..][..d];
                for (dd, &x) in row.iter().enumerate() {
                    tg[dd * n + j] = x;
                }
            }
        });
        t
    });
    let per_head: Vec<Vec<f32>> = (0..heads)
        .into_par_iter()
        .map(|h| {
            let g = h / group;
            let mut o = vec![0f32; s * d];
            for q0 in (0..s).step_by(QB) {
                let qs = QB.min(s - q0);
                let mut sc = vec![0f32; qs * n];
                let qh = &q[(q0 * heads + h) * d..];
                moek_cpu::gemm_nt(qh, heads * d, &k[g * d..], kv * d, &mut sc, n, qs, n, d);
                for (i, row) in sc.chunks_mut(n).enumerate() {
                    for (x, &kp) in row.iter_mut().zip(kpos) {
                        if !visible(qpos[q0 + i], kp) {
                            *x = f32::NEG_INFINITY;
                        }
                    }
                    softmax_in_place(row);
                }
                let oq = &mut o[q0 * d..(q0 + qs) * d];
                match &vt {
                    Some(vt) => moek_cpu::gemm_nt(&sc, n, &vt[g * d * n..], n, oq, d, qs, d, n),
                    None => {
                        for (orow, probs) in oq.chunks_mut(d).zip(sc.chunks(n)) {
                            for (j, &p) in probs.iter().enumerate().filter(|(_, p)| **p > 0.0) {
                                let vh = &v[(j * kv + g) * d..][..d];
                                orow.iter_mut().zip(vh).for_each(|(o, v)| *o += p * v);
                            }
                        }
                    }
                }
            }
            o
        })
        .collect();
    let mut out = vec![0f32; s * heads * d];
    for (h, o) in per_head.iter().enumerate() {
        for (i, row) in o.chunks(d).enumerate() {
            out[(i * heads + h) * d..][..d].copy_from_slice(row);
        }
    }
    out
}

/// Softmax in f32 (max subtracted first).
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let mut e = x.to_vec();
    softmax_in_place(&mut e);
    e
}

/// [`softmax`] over `x` itself; `-inf` entries get probability 0 (at least one must be finite).
///
/// Probabilities below `f32::MIN_POSITIVE` (1.2e-38) are flushed to 0: subnormal operands cost
/// the FMA units a microcode assist each (measured: a 512-key attention ran 25x slower on
/// peaked scores), and against a largest probability of at least `1/n` they change no sum.
pub fn softmax_in_place(x: &mut [f32]) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    x.iter_mut().for_each(|v| *v = (*v - m).exp());
    let sum: f32 = x.iter().sum();
    x.iter_mut().for_each(|v| {
        *v /= sum;
        if *v < f32::MIN_POSITIVE {
            *v = 0.0;
        }
    });
}
