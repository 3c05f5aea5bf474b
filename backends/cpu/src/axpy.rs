//! `y += a * x` into f32 rows, `x` in any plain type (widened exactly on load): the scaled sums
//! of value rows in attention's decode, where one query row is too few to pay for transposing
//! the values into a GEMM, and the values stay in the model's type in its KV cache.

use crate::element::{Kind, kind};
use crate::isa::{Isa, isa};
use moek_ir::Element;

/// `y[i] += a * x[i]` for every `i`. Panics when the lengths differ.
pub fn axpy<W: Element>(a: f32, x: &[W], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy of slices of different lengths");
    #[cfg(target_arch = "x86_64")]
    {
        use crate::avx2 as v2;
        use crate::dot::avx512::{BF16, F16, F32};
        let (xp, n) = (x.as_ptr().cast::<u8>(), x.len());
        // SAFETY: `isa()` checked the level's features; `x` holds `n` elements of its kind and
        // `y` as many f32s (asserted).
        unsafe {
            match (isa(), kind::<W>()) {
                (Isa::Avx512 | Isa::Amx, Kind::F32) => return avx512::<F32>(a, xp, y),
                (Isa::Avx512 | Isa::Amx, Kind::F16) => return avx512::<F16>(a, xp, y),
                (Isa::Avx512 | Isa::Amx, Kind::Bf16) => return avx512::<BF16>(a, xp, y),
                (Isa::Avx2, Kind::F32) => return v2::axpy::<{ v2::F32 }>(a, xp, n, y),
                (Isa::Avx2, Kind::F16) => return v2::axpy::<{ v2::F16 }>(a, xp, n, y),
                (Isa::Avx2, Kind::Bf16) => return v2::axpy::<{ v2::BF16 }>(a, xp, n, y),
                _ => {}
            }
        }
    }
    y.iter_mut().zip(x).for_each(|(y, x)| *y += a * x.to_f32());
}

/// Sixteen lanes per fused multiply-add; only the tail is masked. (A masked store does not
/// forward to the next load of the same row, so a caller summing many rows into one `y` would
/// wait on every store: full-width stores keep the row in flight.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn avx512<const K: u8>(a: f32, xp: *const u8, y: &mut [f32]) {
    use crate::dot::avx512::{load16, mask16, size_of_kind};
    use std::arch::x86_64::*;
    let av = _mm512_set1_ps(a);
    let (n, size) = (y.len(), size_of_kind(K));
    let full = n / 16 * 16;
    let yp = y.as_mut_ptr();
    // SAFETY: `i + 16 <= full <= n` in the loop; the tail's lanes past the end are masked off
    // (`load16` reads only its `n - full`).
    unsafe {
        for i in (0..full).step_by(16) {
            let xv = load16::<K>(xp.add(i * size), 16);
            let v = _mm512_fmadd_ps(av, xv, _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), v);
        }
        if full < n {
            let m = mask16(n - full);
            let xv = load16::<K>(xp.add(full * size), n - full);
            let yv = _mm512_maskz_loadu_ps(m, yp.add(full));
            _mm512_mask_storeu_ps(yp.add(full), m, _mm512_fmadd_ps(av, xv, yv));
        }
    }
}
