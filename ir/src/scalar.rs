//! The elementwise functions of the op vocabulary in f32, as every run time evaluates them: the
//! CPU variants (`moek-cpu` re-exports these and vectorises the same arithmetic) and the Spyre
//! simulator, so a simulated result does not move with an edit to a CPU path.
//!
//! `tanh` is one rational function in plain arithmetic rather than a libm call: no calls, so
//! loops over slices vectorise (the LM head softcaps 262144 logits per token), and no fused
//! multiply-adds, so every ISA computes the same bits. Its error is bounded in the tests.

/// Beyond this, f32 tanh is +-1 to the last place (Eigen's clamp for the same fit).
pub const CLAMP: f32 = 7.905_311;
/// Below this, tanh(x) = x to f32 precision.
pub const TINY: f32 = 4e-4;

/// tanh in f32: the odd degree-13 over even degree-6 minimax fit Eigen's `ptanh_float` uses,
/// clamped at +-[`CLAMP`], and `x` itself below [`TINY`]. NaN stays NaN. Error against f64
/// tanh: 3.6e-7 relative at worst over the tests' sweep (three units in the last place; libm's
/// is one), bounded there by 2^-21.
#[inline]
pub fn tanh(x: f32) -> f32 {
    const ALPHA: [f32; 7] = [
        -2.760_768_5e-16,
        2.000_188e-13,
        -8.604_672e-11,
        5.122_297e-8,
        1.485_722_4e-5,
        6.372_619_3e-4,
        4.893_524_6e-3,
    ];
    const BETA: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_7e-3, 4.893_525e-3];
    if x.abs() < TINY {
        return x;
    }
    let c = x.clamp(-CLAMP, CLAMP);
    let c2 = c * c;
    let p = ALPHA[1..].iter().fold(ALPHA[0], |p, &a| p * c2 + a) * c;
    let q = BETA[1..].iter().fold(BETA[0], |q, &b| q * c2 + b);
    p / q
}

/// `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, Gemma's activation.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + tanh(C * (x + 0.044_715 * x * x * x)))
}

/// `silu(x) = x / (1 + exp(-x))`, the activation of Qwen3-MoE, Mixtral and DeepSeek experts.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// gpt-oss's clamped SwiGLU of a gated pair: `g' sigmoid(alpha g') (u' + 1)` with
/// `g' = min(g, limit)` and `u' = clamp(u, -limit, limit)`. `g' * sigmoid(alpha g')` is
/// written `g' / (1 + exp(-alpha g'))`; `exp` overflows to inf only for large negative `g'`,
/// where the quotient is -0, the limit.
#[inline]
pub fn swiglu_clamped(g: f32, u: f32, limit: f32, alpha: f32) -> f32 {
    // Not `min`, which would turn a NaN gate into `limit`; `clamp` keeps NaN.
    let g = if g > limit { limit } else { g };
    let u = u.clamp(-limit, limit);
    g / (1.0 + (-alpha * g).exp()) * (u + 1.0)
}

/// Gemma's final logit softcap: `cap * tanh(x / cap)`.
#[inline]
pub fn softcap(x: f32, cap: f32) -> f32 {
    cap * tanh(x / cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs across the fit's range, its clamp and its small-argument cut, both signs.
    fn sweep() -> impl Iterator<Item = f32> {
        let dense = (-200_000..=200_000).map(|i| i as f32 * 1e-4);
        let tiny = (0..2000).map(|i| (i as f32 - 1000.0) * 1e-6);
        let wide = [-1e30, -100.0, -CLAMP, -TINY, 0.0, TINY, CLAMP, 100.0, 1e30];
        dense.chain(tiny).chain(wide)
    }

    #[test]
    fn tanh_is_within_its_stated_bound_of_f64() {
        let mut worst = 0f64;
        for x in sweep() {
            let want = f64::from(x).tanh();
            let got = f64::from(tanh(x));
            let rel = (got - want).abs() / want.abs().max(f64::MIN_POSITIVE);
            worst = worst.max(rel);
        }
        assert!(worst <= 2f64.powi(-21), "worst relative error {worst:e}");
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(tanh(f32::INFINITY), tanh(CLAMP));
    }

    #[test]
    fn silu_is_within_a_few_ulps_of_f64() {
        let mut worst = 0f64;
        for x in sweep().filter(|x| x.abs() < 80.0) {
            let x64 = f64::from(x);
            let want = x64 / (1.0 + (-x64).exp());
            let rel = (f64::from(silu(x)) - want).abs() / want.abs().max(f64::MIN_POSITIVE);
            worst = worst.max(rel);
        }
        assert!(worst <= 2f64.powi(-21), "worst relative error {worst:e}");
        assert!(silu(f32::NAN).is_nan());
        assert_eq!(silu(-1e30), -0.0);
        assert_eq!(silu(1e30), 1e30);
    }

    #[test]
    fn swiglu_clamped_is_within_a_few_ulps_of_f64() {
        let (limit, alpha) = (7.0f32, 1.702f32);
        let want = |g: f64, u: f64| {
            let g = g.min(f64::from(limit));
            let u = u.clamp(-f64::from(limit), f64::from(limit));
            g / (1.0 + (-f64::from(alpha) * g).exp()) * (u + 1.0)
        };
        let mut worst = 0f64;
        for g in sweep().filter(|x| x.abs() < 40.0).step_by(7) {
            for u in [-9.0f32, -1.5, -1.0, -0.25, 0.0, 0.5, 3.0, 7.0, 12.0] {
                let w = want(f64::from(g), f64::from(u));
                let got = f64::from(swiglu_clamped(g, u, limit, alpha));
                // Near u = -1 the factor (u + 1) cancels; judge against the pair's scale there.
                let scale = w.abs().max(f64::from(g.abs().min(limit)) * 1e-6);
                // Rounding `alpha g` to f32 moves exp's result by |alpha g| half-ulps: the bound
                // grows with the exponent, as any f32 evaluation's must.
                let growth = 1.0 + f64::from((alpha * g.min(limit)).abs());
                worst = worst.max((got - w).abs() / scale.max(f64::MIN_POSITIVE) / growth);
            }
        }
        assert!(
            worst <= 2f64.powi(-21),
            "worst relative error / (1 + |alpha g|): {worst:e}"
        );
        assert!(swiglu_clamped(f32::NAN, 1.0, limit, alpha).is_nan());
        assert!(swiglu_clamped(1.0, f32::NAN, limit, alpha).is_nan());
        assert_eq!(
            swiglu_clamped(1e30, 1e30, limit, alpha),
            swiglu_clamped(limit, limit, limit, alpha)
        );
        assert_eq!(swiglu_clamped(-1e30, 0.0, limit, alpha), -0.0);
    }
}
