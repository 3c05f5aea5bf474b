//! GEMM tiles: `c += a . b^T` with both operands row-major along the reduction (the checkpoint's
//! own expert layout: weights `[out, in]`, activations `[token, in]`).
//!
//! Work is cut into 4 x 4 register tiles; each tile's partial over `k` is computed from zero and
//! then added to `c`, so a caller that passes reduction blocks one at a time gets exactly "partials
//! added in declared order". Parallelism belongs to the caller (the generated schedule).

use crate::dot::dotn;
use crate::element::{Element, Kind, bits16, kind};
use crate::isa::{Isa, isa};

/// Rows of `a` and of `b` per register tile.
pub const TILE: usize = 4;

/// `c[i*ldc + j] += sum_{p<k} a[i*lda + p] * b[j*ldb + p]` for `i < m`, `j < n`.
///
/// Panics when a slice is too short for its shape.
pub fn gemm_nt<W: Element>(
    a: &[W],
    lda: usize,
    b: &[W],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        k <= lda && k <= ldb && n <= ldc,
        "gemm_nt: leading dims shorter than k or n"
    );
    assert!(a.len() >= (m - 1) * lda + k, "gemm_nt: a is too short");
    assert!(b.len() >= (n - 1) * ldb + k, "gemm_nt: b is too short");
    assert!(c.len() >= (m - 1) * ldc + n, "gemm_nt: c is too short");
    let row = |ld: usize, i: usize, count: usize| -> [usize; TILE] {
        // Edge tiles repeat their last row; the repeated results are not stored.
        std::array::from_fn(|t| (i + t.min(count - 1)) * ld)
    };
    for j0 in (0..n).step_by(TILE) {
        let nj = TILE.min(n - j0);
        let boff = row(ldb, j0, nj);
        // While the first tile of this panel runs, the next panel of `b` (the weights, streamed
        // from memory once) is prefetched, one cache line per row per k-step.
        let next = (j0 + TILE < n).then(|| row(ldb, j0 + TILE, TILE.min(n - j0 - TILE)));
        for i0 in (0..m).step_by(TILE) {
            let mi = TILE.min(m - i0);
            let aoff = row(lda, i0, mi);
            let prefetch = if i0 == 0 { next } else { None };
            let tile = tile4x4(a, aoff, b, boff, prefetch, k);
            for ti in 0..mi {
                let crow = &mut c[(i0 + ti) * ldc + j0..][..nj];
                for tj in 0..nj {
                    crow[tj] += tile[ti][tj];
                }
            }
        }
    }
}

/// One 4 x 4 tile of dot products of length `k`.
fn tile4x4<W: Element>(
    a: &[W],
    aoff: [usize; TILE],
    b: &[W],
    boff: [usize; TILE],
    prefetch: Option<[usize; TILE]>,
    k: usize,
) -> [[f32; TILE]; TILE] {
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16 => {
            // SAFETY: the features were detected; offsets + k are in bounds (asserted by the caller).
            unsafe {
                match kind::<W>() {
                    Kind::Bf16 => {
                        let (a, b) = (bits16(a), bits16(b));
                        avx512::bf16_tile(
                            aoff.map(|o| a[o..].as_ptr()),
                            boff.map(|o| b[o..].as_ptr()),
                            prefetch.map(|p| p.map(|o| b[o..].as_ptr())),
                            k,
                        )
                    }
                    Kind::F16 => avx512::fma_tile::<{ crate::dot::avx512::F16 }>(
                        aoff.map(|o| a[o..].as_ptr().cast()),
                        boff.map(|o| b[o..].as_ptr().cast()),
                        prefetch.map(|p| p.map(|o| b[o..].as_ptr().cast())),
                        k,
                    ),
                    Kind::F32 => avx512::fma_tile::<{ crate::dot::avx512::F32 }>(
                        aoff.map(|o| a[o..].as_ptr().cast()),
                        boff.map(|o| b[o..].as_ptr().cast()),
                        prefetch.map(|p| p.map(|o| b[o..].as_ptr().cast())),
                        k,
                    ),
                }
            }
        }
        _ => aoff.map(|ao| dotn::<W, W, TILE>(&a[ao..ao + k], boff.map(|bo| &b[bo..bo + k]))),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::TILE;
    use crate::dot::avx512::{load16, size_of_kind};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn bf16_tile(
        a: [*const u16; TILE],
        b: [*const u16; TILE],
        prefetch: Option<[*const u16; TILE]>,
        k: usize,
    ) -> [[f32; TILE]; TILE] {
        let mut acc = [[_mm512_setzero_ps(); TILE]; TILE];
        let mut p = 0;
        while p < k {
            let len = 32.min(k - p);
            let m: __mmask32 = if len >= 32 {
                u32::MAX
            } else {
                (1u32 << len) - 1
            };
            // SAFETY: `len` elements remain in every row from `p` (prefetched rows too).
            unsafe {
                if let Some(next) = prefetch {
                    for r in next {
                        _mm_prefetch::<_MM_HINT_T0>(r.add(p).cast::<i8>());
                    }
                }
                let bv: [__m512bh; TILE] = b.map(|r| {
                    std::mem::transmute(_mm512_maskz_loadu_epi16(m, r.add(p).cast::<i16>()))
                });
                for i in 0..TILE {
                    let av: __m512bh =
                        std::mem::transmute(_mm512_maskz_loadu_epi16(m, a[i].add(p).cast::<i16>()));
                    for j in 0..TILE {
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
                    }
                }
            }
            p += len;
        }
        acc.map(|r| r.map(|v| _mm512_reduce_add_ps(v)))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub unsafe fn fma_tile<const K: u8>(
        a: [*const u8; TILE],
        b: [*const u8; TILE],
        prefetch: Option<[*const u8; TILE]>,
        k: usize,
    ) -> [[f32; TILE]; TILE] {
        let s = size_of_kind(K);
        let mut acc = [[_mm512_setzero_ps(); TILE]; TILE];
        let mut p = 0;
        while p < k {
            let len = 16.min(k - p);
            // SAFETY: `len` elements remain in every row from `p`.
            unsafe {
                if let Some(next) = prefetch {
                    for r in next {
                        _mm_prefetch::<_MM_HINT_T0>(r.add(p * s).cast::<i8>());
                    }
                }
                let bv: [__m512; TILE] = b.map(|r| load16::<K>(r.add(p * s), len));
                for i in 0..TILE {
                    let av = load16::<K>(a[i].add(p * s), len);
                    for j in 0..TILE {
                        acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
                    }
                }
            }
            p += len;
        }
        acc.map(|r| r.map(|v| _mm512_reduce_add_ps(v)))
    }
}
