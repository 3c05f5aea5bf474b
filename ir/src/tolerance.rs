//! The one table of numerical limits every variant is held to, per storage dtype.
//!
//! A variant's output is compared with the f64 reference computed on the same stored inputs, so
//! input rounding cancels out. What remains:
//! - f32 accumulation: each sum of n products carries about sqrt(n) * 2^-24 relative error
//!   (n <= 2816 here: ~3e-6), and blocking only reorders those sums (same bound);
//! - intermediate rounding: a variant may store the gate/up activation in the storage dtype
//!   before `down` (GEMM paths do), costing up to one unit roundoff `u` per activation, about
//!   `u / sqrt(3)` in relative L2 after the down sum over F random terms;
//! - the device's own number format (DL16 on Spyre, 9 fraction bits: u = 2^-10) once that lands.
//!
//! - beside block-quantized weights, the activation quantized to 8 bits per block of 32 (the CPU
//!   variant's integer dot products, as llama.cpp does): each value moves by at most half a step,
//!   `amax / 254` of its block, see [`tolerance`].
//!
//! Limits are 8 u for relative L2 and 32 u (of the output's largest magnitude) for max abs: a
//! wrong block, a dropped route or a missed column shifts results by O(1), orders of magnitude
//! beyond both, while honest rounding stays well inside. NaN never passes.

use crate::DType;
use std::fmt;

/// Limits for one dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Limit on `||got - want||_2 / ||want||_2`.
    pub rel_l2: f64,
    /// Limit on `max |got - want| / max |want|`.
    pub max_abs: f64,
}

/// Unit roundoff of each storage dtype.
pub fn unit_roundoff(d: DType) -> f64 {
    match d {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::Bf16 => 2f64.powi(-8),
        // Beside quantized weights, an activation quantized to i8 per block: half a step is
        // 1/254 of the block's largest magnitude.
        // bf16 activations are exact in f32, so they round no further.
        DType::Q8_0 | DType::Q4_0 | DType::Q8_0Bf16 | DType::Q4_0Bf16 => 1.0 / 254.0,
        // The weights' exact values beside an unrounded activation.
        DType::Mxfp4 | DType::Mxfp4Bf16 => 2f64.powi(-24),
    }
}

/// The written tolerance of `dtype` (see the module doc for the justification).
pub fn tolerance(dtype: DType) -> Tolerance {
    match dtype {
        // f32 has no activation rounding to hide behind: bound the accumulation error alone,
        // 4e-6 relative for n = 2816, with a 2.5x margin.
        DType::F32 => Tolerance {
            rel_l2: 1e-5,
            max_abs: 4e-5,
        },
        // The reference dequantizes the weights exactly, so what remains is the activation's
        // rounding to 8 bits per block of 32 (twice in an expert FFN: `x`, then the gated
        // activation before `down`). Each value moves by at most `u = amax / 254` of its block,
        // uniformly, so by about `u / sqrt(3)` relative to the block's largest value, and a sum of
        // such errors over random weights stays in that proportion to the output: about 2 u for
        // blocks whose largest value is 2-3x their RMS, in each of the two phases (measured:
        // docs/numerics.md). Limits 4 u in relative L2 and 16 u of the largest output in max
        // abs; a wrong block's scale or a swapped nibble moves outputs by O(1) of their scale.
        // The same for f32 and bf16 activations: the reference reads the same values (a bf16
        // is exact in f32) and the variants keep their intermediates in f32.
        // MXFP4's variants round no activation (the CPU multiplies the exact weights into the
        // f32 activation, wgpu likewise): f32's accumulation bound.
        DType::Mxfp4 | DType::Mxfp4Bf16 => tolerance(DType::F32),
        d if d.is_quantized() => Tolerance {
            rel_l2: 4.0 * unit_roundoff(dtype),
            max_abs: 16.0 * unit_roundoff(dtype),
        },
        d => Tolerance {
            rel_l2: 8.0 * unit_roundoff(d),
            max_abs: 32.0 * unit_roundoff(d),
        },
    }
}

/// Unit roundoff of Spyre's DL16 (9 fraction bits).
pub const DL16_UNIT_ROUNDOFF: f64 = 1.0 / 1024.0;

/// The limit for a variant that computes in DL16 (the Spyre simulator in DL16 mode): the looser of
/// the dtype's limit and DL16's own (8 u and 32 u with u = 2^-10). Host f16 keeps 10 fraction bits,
/// so its inputs round once more on the way to the device and no longer cancel against the
/// reference; bf16 (7 bits) converts exactly and is bounded by its own, looser limit.
pub fn tolerance_dl16(dtype: DType) -> Tolerance {
    let t = tolerance(dtype);
    let u = DL16_UNIT_ROUNDOFF;
    Tolerance {
        rel_l2: t.rel_l2.max(8.0 * u),
        max_abs: t.max_abs.max(32.0 * u),
    }
}

/// How far a variant's output is from the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Deviation {
    /// `max |got - want|`.
    pub max_abs: f64,
    /// `max |want|`, the scale max_abs is judged against.
    pub scale: f64,
    pub rel_l2: f64,
    /// Elements of `got` that are NaN or infinite (an unwritten, poisoned element is NaN).
    pub non_finite: usize,
    pub count: usize,
}

impl Deviation {
    /// Compares `got` with `want` element by element.
    pub fn measure(got: &[f32], want: &[f64]) -> Deviation {
        assert_eq!(
            got.len(),
            want.len(),
            "comparing outputs of different lengths"
        );
        let mut d = Deviation {
            max_abs: 0.0,
            scale: 0.0,
            rel_l2: 0.0,
            non_finite: 0,
            count: got.len(),
        };
        let (mut diff2, mut ref2) = (0.0, 0.0);
        for (&g, &w) in got.iter().zip(want) {
            if !g.is_finite() {
                d.non_finite += 1;
                continue;
            }
            let e = (f64::from(g) - w).abs();
            d.max_abs = d.max_abs.max(e);
            d.scale = d.scale.max(w.abs());
            diff2 += e * e;
            ref2 += w * w;
        }
        d.rel_l2 = if ref2 > 0.0 {
            (diff2 / ref2).sqrt()
        } else {
            diff2.sqrt()
        };
        d
    }

    /// `max_abs` relative to the output's scale.
    pub fn max_abs_rel(&self) -> f64 {
        if self.scale > 0.0 {
            self.max_abs / self.scale
        } else {
            self.max_abs
        }
    }

    /// Whether every element is finite and both errors are within `tol`.
    pub fn within(&self, tol: Tolerance) -> bool {
        self.non_finite == 0 && self.rel_l2 <= tol.rel_l2 && self.max_abs_rel() <= tol.max_abs
    }
}

impl fmt::Display for Deviation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "max abs {:.3e} (rel {:.3e}), rel L2 {:.3e}, {} non-finite of {}",
            self.max_abs,
            self.max_abs_rel(),
            self.rel_l2,
            self.non_finite,
            self.count
        )
    }
}
