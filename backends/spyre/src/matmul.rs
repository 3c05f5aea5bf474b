//! The simulator's matrix product, `o += a . b` with `a` `[m, k]` and `b` `[k, n]` as they lie
//! in LX, in one order on every host: each output's partial starts from zero and adds the
//! products `a[i, p] * b[p, j]` for `p` ascending, each product rounded to f32 before its add (no
//! fused multiply-add); the partial is then added to the output. Vector width changes which
//! outputs are computed side by side, never the operations on one output, so the host's ISA
//! cannot change a simulated result (docs/spyre-program.md).

/// Rows of `a` per tile.
const MR: usize = 4;
/// Columns of `b` per tile: with four rows, eight 256-bit accumulators.
const NC: usize = 16;

/// `o[i*n + j] += sum_{p<k} a[i*k + p] * b[p*n + j]` for `i < m`, `j < n`.
///
/// Panics when a slice is shorter than its shape.
pub fn matmul(a: &[f32], b: &[f32], o: &mut [f32], m: usize, k: usize, n: usize) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && o.len() >= m * n,
        "matmul: a slice is shorter than [{m}, {k}] x [{k}, {n}]"
    );
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512 F was detected.
        let wide = unsafe { avx512::matmul(a, b, o, m, k, n) };
        // SAFETY: AVX-512 F implies AVX2.
        return unsafe { matmul_avx2(a, b, o, m, k, n, wide..n) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { matmul_avx2(a, b, o, m, k, n, 0..n) };
    }
    matmul_any(a, b, o, m, k, n, 0..n);
}

/// The same code compiled for 256-bit vectors (no FMA: the products round alone).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn matmul_avx2(
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    cols: std::ops::Range<usize>,
) {
    matmul_any(a, b, o, m, k, n, cols);
}

/// Output columns `cols` (all rows) of the product.
#[inline(always)]
fn matmul_any(
    a: &[f32],
    b: &[f32],
    o: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    cols: std::ops::Range<usize>,
) {
    if cols.is_empty() {
        return;
    }
    // One column panel of `b` at a time, copied into `k` contiguous rows of NC, so every row
    // tile streams it in order (at the right edge the columns past `n` are not stored).
    let mut panel = vec![[0f32; NC]; k];
    for j0 in cols.step_by(NC) {
        let w = NC.min(n - j0);
        for (dst, brow) in panel.iter_mut().zip(b[..k * n].chunks_exact(n)) {
            match brow[j0..].first_chunk::<NC>() {
                // A fixed-size move, inlined (not a library call per 64 bytes).
                Some(cols) => *dst = *cols,
                None => dst[..w].copy_from_slice(&brow[j0..j0 + w]),
            }
        }
        for i0 in (0..m).step_by(MR) {
            match MR.min(m - i0) {
                4 => tile::<4>(a, &panel, o, i0, j0, k, n),
                3 => tile::<3>(a, &panel, o, i0, j0, k, n),
                2 => tile::<2>(a, &panel, o, i0, j0, k, n),
                _ => tile::<1>(a, &panel, o, i0, j0, k, n),
            }
        }
    }
}

/// Rows `i0..i0 + R` against the panel of columns `j0..` (fewer than NC at the right edge).
#[inline(always)]
fn tile<const R: usize>(
    a: &[f32],
    panel: &[[f32; NC]],
    o: &mut [f32],
    i0: usize,
    j0: usize,
    k: usize,
    n: usize,
) {
    let rows: [&[f32]; R] = std::array::from_fn(|r| &a[(i0 + r) * k..][..k]);
    let mut acc = [[0f32; NC]; R];
    for (p, bv) in panel.iter().enumerate() {
        for r in 0..R {
            let av = rows[r][p];
            for j in 0..NC {
                acc[r][j] += av * bv[j];
            }
        }
    }
    let w = NC.min(n - j0);
    for (r, acc) in acc.iter().enumerate() {
        o[(i0 + r) * n + j0..][..w]
            .iter_mut()
            .zip(acc)
            .for_each(|(o, s)| *o += s);
    }
}

/// 512-bit tiles of four rows by 32 columns, written in intrinsics (the compiler, left to
/// vectorise such a tile, kept its accumulators in memory): each product rounded by `vmulps`
/// and added by `vaddps`, never fused, so every output follows the same order as above.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// Columns per tile: two vectors.
    const NW: usize = 32;

    /// Output columns `0..` a multiple of [`NW`] (all rows), whose count it returns; the
    /// columns past it are left to the caller.
    #[target_feature(enable = "avx512f")]
    pub(super) fn matmul(
        a: &[f32],
        b: &[f32],
        o: &mut [f32],
        m: usize,
        k: usize,
        n: usize,
    ) -> usize {
        let wide = n / NW * NW;
        let mut panel = vec![[0f32; NW]; k];
        for j0 in (0..wide).step_by(NW) {
            for (dst, brow) in panel.iter_mut().zip(b[..k * n].chunks_exact(n)) {
                *dst = *brow[j0..].first_chunk::<NW>().expect("a whole tile");
            }
            for i0 in (0..m).step_by(4) {
                match 4.min(m - i0) {
                    4 => tile::<4>(a, &panel, o, i0, j0, k, n),
                    3 => tile::<3>(a, &panel, o, i0, j0, k, n),
                    2 => tile::<2>(a, &panel, o, i0, j0, k, n),
                    _ => tile::<1>(a, &panel, o, i0, j0, k, n),
                }
            }
        }
        wide
    }

    #[target_feature(enable = "avx512f")]
    fn tile<const R: usize>(
        a: &[f32],
        panel: &[[f32; NW]],
        o: &mut [f32],
        i0: usize,
        j0: usize,
        k: usize,
        n: usize,
    ) {
        let rows: [&[f32]; R] = std::array::from_fn(|r| &a[(i0 + r) * k..][..k]);
        let mut acc = [[_mm512_setzero_ps(); 2]; R];
        for (p, bv) in panel.iter().enumerate() {
            // SAFETY: each load reads 16 of the panel row's 32 values.
            let b = unsafe {
                [
                    _mm512_loadu_ps(bv.as_ptr()),
                    _mm512_loadu_ps(bv.as_ptr().add(16)),
                ]
            };
            for r in 0..R {
                let av = _mm512_set1_ps(rows[r][p]);
                for h in 0..2 {
                    acc[r][h] = _mm512_add_ps(acc[r][h], _mm512_mul_ps(av, b[h]));
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let out = &mut o[(i0 + r) * n + j0..][..NW];
            for (h, acc) in acc.iter().enumerate() {
                // SAFETY: `out` holds 32 values; each half reads and writes 16.
                unsafe {
                    let at = out.as_mut_ptr().add(16 * h);
                    _mm512_storeu_ps(at, _mm512_add_ps(_mm512_loadu_ps(at), *acc));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stated order, one output at a time.
    fn by_definition(a: &[f32], b: &[f32], o: &mut [f32], m: usize, k: usize, n: usize) {
        for i in 0..m {
            for j in 0..n {
                let mut s = 0f32;
                for p in 0..k {
                    s += a[i * k + p] * b[p * n + j];
                }
                o[i * n + j] += s;
            }
        }
    }

    #[test]
    fn every_output_follows_the_stated_order_bit_for_bit() {
        let data = |len: usize, seed: u32| -> Vec<f32> {
            (0..len as u32)
                .map(|i| ((i.wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
                .collect()
        };
        // Every path this host has: the one `matmul` picks (512-bit tiles where there is
        // AVX-512, the 256-bit code at the right edge), the 256-bit code alone, the portable.
        type Path = fn(&[f32], &[f32], &mut [f32], usize, usize, usize);
        let mut paths: Vec<(&str, Path)> = vec![
            ("chosen", matmul),
            ("portable", |a, b, o, m, k, n| {
                matmul_any(a, b, o, m, k, n, 0..n)
            }),
        ];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            paths.push(("avx2", |a, b, o, m, k, n| unsafe {
                matmul_avx2(a, b, o, m, k, n, 0..n)
            }));
        }
        let shapes = [
            (1, 7, 3),
            (4, 16, 16),
            (5, 33, 37),
            (9, 70, 48),
            (3, 1, 17),
            (7, 19, 32),
            (6, 40, 101),
        ];
        for (name, path) in paths {
            for (m, k, n) in shapes {
                let (a, b) = (data(m * k, 1), data(k * n, 2));
                let start = data(m * n, 3);
                let (mut got, mut want) = (start.clone(), start);
                path(&a, &b, &mut got, m, k, n);
                by_definition(&a, &b, &mut want, m, k, n);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits());
                assert!(
                    same,
                    "{name}: [{m}, {k}] x [{k}, {n}] differs from the stated order"
                );
            }
        }
    }
}
