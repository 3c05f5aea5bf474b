//! The f64 reference semantics of every op: the one definition each variant is tested against.
//!
//! Functions compute one output row (one token, or a chosen set of vocabulary rows), so tests of
//! full-size kernels can check a random sample of rows. Inputs are the variant's own inputs
//! (already in the storage dtype), widened exactly to f64.

use crate::Activation;
use crate::element::Element;

/// Gemma's activation, `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

/// `x / (1 + exp(-x))`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// `1 / (1 + exp(-x))`.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// gpt-oss's clamped SwiGLU of a gated pair: `g' sigmoid(alpha g') (u' + 1)` with
/// `g' = min(g, limit)` and `u' = clamp(u, -limit, limit)`.
pub fn swiglu_clamped(g: f64, u: f64, limit: f64, alpha: f64) -> f64 {
    // Not `min`, which would turn a NaN gate into `limit`; `clamp` keeps NaN.
    let g = if g > limit { limit } else { g };
    let u = u.clamp(-limit, limit);
    g * sigmoid(alpha * g) * (u + 1.0)
}

/// The gated pair `gated(g, u)` of the activation `act` (`act(g) * u` for one-argument ones).
pub fn gated(act: Activation, g: f64, u: f64) -> f64 {
    match act {
        Activation::GeluTanh => gelu_tanh(g) * u,
        Activation::Silu => silu(g) * u,
        Activation::SwigluClamped { limit, alpha } => {
            swiglu_clamped(g, u, f64::from(limit), f64::from(alpha))
        }
    }
}

/// `cap * tanh(x / cap)`.
pub fn softcap(x: f64, cap: f64) -> f64 {
    cap * (x / cap).tanh()
}

/// A stored plain value widened exactly to f64.
fn real<T: Element>(x: T) -> f64 {
    f64::from(x.to_f32())
}

/// Values `start..start + len` of a weight tensor stored as `w`: whole elements, since a block
/// never straddles a row.
fn span<W: Element>(w: &[W], start: usize, len: usize) -> &[W] {
    assert!(
        start.is_multiple_of(W::VALUES) && len.is_multiple_of(W::VALUES),
        "a row of {len} values at {start} is not whole blocks of {}",
        W::VALUES
    );
    &w[start / W::VALUES..(start + len) / W::VALUES]
}

/// `a . b` for a plain activation row `a` and a weight row `b` (plain or blocks).
fn dot<A: Element, B: Element>(a: &[A], b: &[B]) -> f64 {
    dot_by(a.len(), |i| real(a[i]), b)
}

/// `a . b` for an f64 row `a` (the reference's own intermediates).
fn dot_f64<B: Element>(a: &[f64], b: &[B]) -> f64 {
    dot_by(a.len(), |i| a[i], b)
}

/// `sum over i < len of a(i) * (value i of b)`, in eight interleaved partial sums added by a
/// fixed tree. One running sum waits an f64 add's latency on every product, which made the
/// reference most of `moek check`'s time; the order's rounding (about 1e-16 relative) is far
/// below every tolerance.
fn dot_by<B: Element>(len: usize, a: impl Fn(usize) -> f64, b: &[B]) -> f64 {
    const LANES: usize = 8;
    assert_eq!(
        len,
        b.len() * B::VALUES,
        "dot product of rows of different lengths"
    );
    let w = |i: usize| f64::from(b[i / B::VALUES].value(i % B::VALUES));
    let mut acc = [0f64; LANES];
    let whole = len / LANES * LANES;
    for i in (0..whole).step_by(LANES) {
        for (k, acc) in acc.iter_mut().enumerate() {
            *acc += a(i + k) * w(i + k);
        }
    }
    for i in whole..len {
        acc[i - whole] += a(i) * w(i);
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = acc;
    ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))
}

/// Sizes of the problem a kernel runs on (dims an op lacks are 0 or 1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Shape {
    pub t: usize,
    pub r: usize,
    pub e: usize,
    pub h: usize,
    pub f: usize,
    pub v: usize,
}

impl Shape {
    /// The size of one named dim.
    pub fn dim(&self, d: crate::DimName) -> usize {
        use crate::DimName::*;
        match d {
            T => self.t,
            R => self.r,
            E => self.e,
            H => self.h,
            F => self.f,
            V => self.v,
        }
    }
}

/// The per-expert biases of a routed expert FFN, if it has them (the optional tensors
/// `gate_up_bias` and `down_bias`, f32 in every variant):
/// `gate_up [E, 2F]` (gate first) and `down [E, H]`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Biases<'a> {
    pub gate_up: Option<&'a [f32]>,
    pub down: Option<&'a [f32]>,
}

/// `gated(x . Wg[e] + bg[e], x . Wu[e] + bu[e])` for one token; `gate_up` is `[E, 2F, H]`, gate
/// rows first; the bias, if any, `[E, 2F]`. Here and below, activations are plain values and
/// weights plain or in blocks (read at their exact values).
pub fn expert_gate_up<A: Element, W: Element>(
    s: &Shape,
    act: Activation,
    x: &[A],
    gate_up: &[W],
    bias: Option<&[f32]>,
    e: usize,
) -> Vec<f64> {
    let row = |j: usize| span(gate_up, (e * 2 * s.f + j) * s.h, s.h);
    let b = |j: usize| bias.map_or(0.0, |b| f64::from(b[e * 2 * s.f + j]));
    (0..s.f)
        .map(|j| {
            let g = dot(x, row(j)) + b(j);
            let u = dot(x, row(s.f + j)) + b(s.f + j);
            gated(act, g, u)
        })
        .collect()
}

/// `a . Wd[e] + bd[e]` for one activation row; `down` is `[E, H, F]`; the bias, if any, `[E, H]`.
pub fn expert_down<W: Element>(
    s: &Shape,
    a: &[f64],
    down: &[W],
    bias: Option<&[f32]>,
    e: usize,
) -> Vec<f64> {
    (0..s.h)
        .map(|i| {
            dot_f64(a, span(down, (e * s.h + i) * s.f, s.f))
                + bias.map_or(0.0, |b| f64::from(b[e * s.h + i]))
        })
        .collect()
}

/// The `gate_up` op for token `t`: `[R, F]` activations of its routes.
pub fn gate_up<A: Element, W: Element>(
    s: &Shape,
    act: Activation,
    x: &[A],
    idx: &[u32],
    gate_up: &[W],
    t: usize,
) -> Vec<f64> {
    let xt = &x[t * s.h..(t + 1) * s.h];
    (0..s.r)
        .flat_map(|r| expert_gate_up(s, act, xt, gate_up, None, idx[t * s.r + r] as usize))
        .collect()
}

/// The `down` op for token `t`: `sum_r w[t,r] * (a[t,r] . Wd[idx[t,r]])`, `[H]`.
pub fn down<W: Element>(
    s: &Shape,
    act: &[f32],
    idx: &[u32],
    weights: &[f32],
    down: &[W],
    t: usize,
) -> Vec<f64> {
    let mut out = vec![0.0; s.h];
    for r in 0..s.r {
        let a: Vec<f64> = act[(t * s.r + r) * s.f..(t * s.r + r + 1) * s.f]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        let y = expert_down(s, &a, down, None, idx[t * s.r + r] as usize);
        let w = f64::from(weights[t * s.r + r]);
        out.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
    }
    out
}

/// The routed expert FFN for token `t`, `[H]`, with the experts' biases if any.
pub fn expert_ffn<A: Element, W: Element>(
    s: &Shape,
    act: Activation,
    x: &[A],
    idx: &[u32],
    weights: &[f32],
    gate_up: &[W],
    down: &[W],
    bias: Biases<'_>,
    t: usize,
) -> Vec<f64> {
    let xt = &x[t * s.h..(t + 1) * s.h];
    let mut out = vec![0.0; s.h];
    for r in 0..s.r {
        let e = idx[t * s.r + r] as usize;
        let a = expert_gate_up(s, act, xt, gate_up, bias.gate_up, e);
        let y = expert_down(s, &a, down, bias.down, e);
        let w = f64::from(weights[t * s.r + r]);
        out.iter_mut().zip(y).for_each(|(o, y)| *o += w * y);
    }
    out
}

/// The dense MLP for token `t`: `gate`/`up` are `[F, H]`, `down` is `[H, F]`; scaled by
/// `sigmoid(x . output_gate)` when it has an output gate (`[H]`).
pub fn dense_mlp<A: Element, W: Element>(
    s: &Shape,
    act: Activation,
    x: &[A],
    gate: &[W],
    up: &[W],
    down: &[W],
    output_gate: Option<&[W]>,
    t: usize,
) -> Vec<f64> {
    let xt = &x[t * s.h..(t + 1) * s.h];
    let scale = output_gate.map_or(1.0, |g| sigmoid(dot(xt, g)));
    let a: Vec<f64> = (0..s.f)
        .map(|j| {
            let g = dot(xt, span(gate, j * s.h, s.h));
            gated(act, g, dot(xt, span(up, j * s.h, s.h)))
        })
        .collect();
    (0..s.h)
        .map(|i| scale * dot_f64(&a, span(down, i * s.f, s.f)))
        .collect()
}

/// The LM head's token: the first index of the largest logit (NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// LM head logits of the final row, for the vocabulary rows `rows`: `softcap(h[T-1] . emb[v])`,
/// or the plain products without a cap.
pub fn lm_head_row<A: Element, W: Element>(
    s: &Shape,
    hidden: &[A],
    emb: &[W],
    cap: Option<f64>,
    rows: &[usize],
) -> Vec<f64> {
    let last = &hidden[(s.t - 1) * s.h..s.t * s.h];
    rows.iter()
        .map(|&v| {
            let x = dot(last, span(emb, v * s.h, s.h));
            cap.map_or(x, |cap| softcap(x, cap))
        })
        .collect()
}
