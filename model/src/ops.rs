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
    const COLS: usize = 64;
    // Column blocks of the output, each a GEMM over all rows.
    let mut blocks: Vec<(usize, Vec<f32>)> = (0..out.div_ceil(COLS))
        .into_par_iter()
        .map(|b| {
            let (c0, c1) = (b * COLS, ((b + 1) * COLS).min(out));
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
pub fn attention(
    cfg: &Config,
    layer: &Layer,
    q: &[f32],
    qpos: &[usize],
    k: &[f32],
    v: &[f32],
    kpos: &[usize],
) -> Vec<f32> {
    let (d, kv, heads) = (layer.head_dim, layer.kv_heads, cfg.heads);
    let group = heads / kv;
    let sliding = layer.attention == crate::config::Attention::Sliding;
    let mut out = vec![0f32; qpos.len() * heads * d];
    out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
        let (s, h) = (i / heads, i % heads);
        let p = qpos[s];
        let qh = &q[(s * heads + h) * d..][..d];
        let g = h / group;
        let visible: Vec<usize> = (0..kpos.len())
            .filter(|&j| kpos[j] <= p && (!sliding || p - kpos[j] < cfg.window))
            .collect();
        let scores: Vec<f32> = visible
            .iter()
            .map(|&j| {
                let kh = &k[(j * kv + g) * d..][..d];
                qh.iter().zip(kh).map(|(a, b)| a * b).sum()
            })
            .collect();
        let probs = softmax(&scores);
        for (&j, p) in visible.iter().zip(probs) {
            let vh = &v[(j * kv + g) * d..][..d];
            o.iter_mut().zip(vh).for_each(|(o, v)| *o += p * v);
        }
    });
    out
}

/// Softmax in f32 (max subtracted first).
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = x.iter().map(|v| (v - m).exp()).collect();
    let sum: f32 = e.iter().sum();
    e.iter().map(|v| v / sum).collect()
}
