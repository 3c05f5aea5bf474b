//! `y += a * x` over f32 rows: the scaled sums of value rows in attention's decode, where one
//! query row is too few to pay for transposing the values into a GEMM.

use crate::isa::{Isa, isa};

/// `y[i] += a * x[i]` for every `i`. Panics when the lengths differ.
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy of slices of different lengths");
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` checked the AVX-512 features; the lengths are equal (asserted).
        Isa::Avx512 | Isa::Amx => unsafe { avx512(a, x, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` checked the AVX2 and FMA features; the lengths are equal (asserted).
        Isa::Avx2 => unsafe { crate::avx2::axpy(a, x, y) },
        _ => y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x),
    }
}

/// Sixteen lanes per fused multiply-add; only the tail is masked. (A masked store does not
/// forward to the next load of the same row, so a caller summing many rows into one `y` would
/// wait on every store: full-width stores keep the row in flight.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn avx512(a: f32, x: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let av = _mm512_set1_ps(a);
    let full = x.len() / 16 * 16;
    let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
    // SAFETY: `i + 16 <= full <= len` in the loop; the tail's lanes past the end are masked off.
    unsafe {
        for i in (0..full).step_by(16) {
            let v = _mm512_fmadd_ps(av, _mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), v);
        }
        if full < x.len() {
            let m = crate::dot::avx512::mask16(x.len() - full);
            let xv = _mm512_maskz_loadu_ps(m, xp.add(full));
            let yv = _mm512_maskz_loadu_ps(m, yp.add(full));
            _mm512_mask_storeu_ps(yp.add(full), m, _mm512_fmadd_ps(av, xv, yv));
        }
    }
}
