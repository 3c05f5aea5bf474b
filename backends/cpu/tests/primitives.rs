//! Every primitive on every element type against an f64 sum, on the ISA in use (CI runs this file
//! with `MOEK_CPU_ISA=portable` too). Lengths cover SIMD tails.

use half::{bf16, f16};
use moek_cpu::{Element, axpy, dot, dot_f32_w, dot4, gemm_nt, matvec_segments};
use proptest::prelude::*;

/// f32 accumulation of n products of values in [-1, 1]: error grows like sqrt(n) * 2^-24 per term
/// magnitude; 1e-5 relative to the sum of |products| is far above that and far below a wrong term.
const REL: f64 = 1e-5;

fn vals<W: Element>(v: &[f32]) -> Vec<W> {
    v.iter().map(|&x| W::from_f32(x)).collect()
}

fn exact<A: Element, B: Element>(a: &[A], b: &[B]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (x, y)| {
        let p = f64::from(x.to_f32()) * f64::from(y.to_f32());
        (s + p, m + p.abs())
    })
}

fn check<W: Element>(a: &[f32], b: &[f32]) {
    let (a, b) = (vals::<W>(a), vals::<W>(b));
    let (want, scale) = exact(&a, &b);
    let got = f64::from(dot(&a, &b));
    assert!(
        (got - want).abs() <= REL * scale.max(1e-30),
        "{}: dot {got} vs {want}",
        W::DTYPE.name()
    );
    let rows = [&b[..], &a[..], &b[..], &a[..]];
    let four = dot4(&a, rows);
    for (r, g) in rows.iter().zip(four) {
        let (w, s) = exact(&a, r);
        assert!(
            (f64::from(g) - w).abs() <= REL * s.max(1e-30),
            "{}: dot4 {g} vs {w}",
            W::DTYPE.name()
        );
    }
    let af: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
    let (w, s) = exact(&af, &b);
    let g = f64::from(dot_f32_w(&af, &b));
    assert!(
        (g - w).abs() <= REL * s.max(1e-30),
        "{}: dot_f32_w {g} vs {w}",
        W::DTYPE.name()
    );
}

fn check_gemm<W: Element>(m: usize, n: usize, k: usize, seed: u64) {
    let fill = |len: usize, salt: u64| -> Vec<W> {
        (0..len)
            .map(|i| {
                let h = (i as u64 ^ salt)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .rotate_left(17);
                W::from_f32((h % 2001) as f32 / 1000.0 - 1.0)
            })
            .collect()
    };
    let (lda, ldb, ldc) = (k + 3, k + 1, n + 2);
    let a = fill(m * lda, seed);
    let b = fill(n * ldb, seed ^ 0xABCD);
    let mut c = vec![0.5f32; m * ldc];
    gemm_nt(&a, lda, &b, ldb, &mut c, ldc, m, n, k);
    for i in 0..m {
        for j in 0..n {
            let (w, s) = exact(&a[i * lda..i * lda + k], &b[j * ldb..j * ldb + k]);
            let g = f64::from(c[i * ldc + j]) - 0.5;
            assert!(
                (g - w).abs() <= REL * s.max(1.0),
                "{} gemm ({i},{j}): {g} vs {w}",
                W::DTYPE.name()
            );
        }
        for j in n..ldc {
            assert_eq!(c[i * ldc + j], 0.5, "gemm wrote outside its columns");
        }
    }
}

proptest! {
    #[test]
    fn dots_match_f64(v in prop::collection::vec((-1f32..1.0, -1f32..1.0), 0..200)) {
        let (a, b): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        check::<f32>(&a, &b);
        check::<f16>(&a, &b);
        check::<bf16>(&a, &b);
    }

    /// One multiply-add per element, `x` in each plain type (widened exactly): at most two f32
    /// roundings (product, then sum; one where it is fused), each half a unit in the last
    /// place of at most twice the larger magnitude.
    #[test]
    fn axpy_matches_f64(a in -4f32..4.0, v in prop::collection::vec((-1f32..1.0, -1f32..1.0), 0..100)) {
        let (x, y0): (Vec<f32>, Vec<f32>) = v.into_iter().unzip();
        fn check<W: Element>(a: f32, x: &[f32], y0: &[f32]) -> Result<(), TestCaseError> {
            let xw: Vec<W> = x.iter().map(|&v| W::from_f32(v)).collect();
            let mut y = y0.to_vec();
            axpy(a, &xw, &mut y);
            for i in 0..x.len() {
                let xi = f64::from(xw[i].to_f32());
                let want = f64::from(y0[i]) + f64::from(a) * xi;
                let scale = f64::from(y0[i]).abs().max((f64::from(a) * xi).abs());
                prop_assert!((f64::from(y[i]) - want).abs() <= scale * 2f64.powi(-22) + 2f64.powi(-126),
                    "axpy of {:?} [{i}]: {} vs {want}", W::KIND, y[i]);
            }
            Ok(())
        }
        check::<f32>(a, &x, &y0)?;
        check::<f16>(a, &x, &y0)?;
        check::<bf16>(a, &x, &y0)?;
    }

    #[test]
    fn gemm_matches_f64(m in 1usize..11, n in 1usize..11, k in 1usize..150, seed: u64) {
        check_gemm::<bf16>(m, n, k, seed);
        check_gemm::<f16>(m, n, k, seed);
        check_gemm::<f32>(m, n, k, seed);
    }
}

/// Reductions longer than one cache chunk of the AVX-512 path, at the 26B-A4B widths, with tails;
/// row counts across the AMX path's 32-row blocks and the f32 tiles' 64-row blocks, column counts
/// across the AMX path's 128-column panels.
#[test]
fn gemm_matches_f64_over_long_reductions() {
    for (m, n, k) in [
        (5, 7, 2816),
        (9, 13, 2111),
        (1, 6, 704),
        (3, 9, 2816),
        (37, 150, 97),
        (64, 130, 2816),
        (70, 13, 1100),
    ] {
        check_gemm::<bf16>(m, n, k, 42);
        check_gemm::<f16>(m, n, k, 43);
        check_gemm::<f32>(m, n, k, 44);
    }
}

#[test]
fn results_do_not_depend_on_the_row_grouping() {
    let a: Vec<bf16> = vals(
        &(0..2816)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 7.0)
            .collect::<Vec<_>>(),
    );
    let b: Vec<bf16> = vals(
        &(0..2816)
            .map(|i| ((i * 5 % 11) as f32 - 5.0) / 3.0)
            .collect::<Vec<_>>(),
    );
    let single = dot(&a, &b);
    let four = dot4(&a, [&b, &b, &b, &b]);
    assert!(four.iter().all(|&x| x.to_bits() == single.to_bits()));
}

/// The matrix-vector product reads rows one at a time with the stream prefetched ahead: each
/// output is the row's segment sums added in order, bit for bit what one dot product per segment
/// gives, for any row range (the prefetch runs on to the end of the matrix and stops there, even
/// in a matrix far shorter than the prefetch distance) and rows with gaps between them (`ld > k`).
#[test]
fn matvec_rows_are_segment_sums_in_order() {
    let (k, ld, n) = (2816, 2821, 40);
    let fill = |len: usize, m: usize| -> Vec<bf16> {
        (0..len)
            .map(|i| bf16::from_f32(((i * m % 29) as f32 - 14.0) / 9.0))
            .collect()
    };
    let (x, mat) = (fill(k, 7), fill((n - 1) * ld + k, 11));
    let segs = [(0, 704), (704, 1408), (1408, 2112), (2112, 2816)];
    for rows in [0..n, 3..17, n - 1..n, 5..5] {
        let mut out = vec![f32::NAN; rows.len()];
        matvec_segments(&x, &mat, ld, rows.clone(), &segs, &mut out);
        for (j, got) in rows.zip(out) {
            let row = &mat[j * ld..j * ld + k];
            let want = segs
                .iter()
                .fold(0f32, |s, &(a, b)| s + dot(&x[a..b], &row[a..b]));
            assert_eq!(got.to_bits(), want.to_bits(), "row {j}: {got} vs {want}");
        }
    }
}

/// `scripts/test` forces each level through `MOEK_CPU_ISA`: the level in use must be the one
/// asked for (else a run would cover another path), and unset or `auto` the best this CPU has.
#[test]
fn the_level_in_use_is_the_one_asked_for() {
    let asked = std::env::var("MOEK_CPU_ISA").unwrap_or_default();
    let want = match asked.as_str() {
        "" | "auto" => moek_cpu::isa::best().switch(),
        level => level,
    };
    assert_eq!(moek_cpu::isa().switch(), want, "MOEK_CPU_ISA={asked:?}");
}

/// The bf16 GEMM tile in use is the one `MOEK_CPU_BF16_GEMM` forces (CI runs this file under
/// each), and `vdpbf16ps` only where the level has it.
#[test]
fn the_bf16_gemm_tile_is_the_forced_one() {
    use moek_cpu::gemm::{Bf16Tile, bf16_tile};
    let tile = bf16_tile();
    match std::env::var("MOEK_CPU_BF16_GEMM").as_deref() {
        Ok("dot") => assert_eq!(tile, Bf16Tile::Dot),
        Ok("fma") => assert_eq!(tile, Bf16Tile::Fma),
        _ => {}
    }
    if !matches!(moek_cpu::isa(), moek_cpu::Isa::Avx512 | moek_cpu::Isa::Amx) {
        assert_eq!(tile, Bf16Tile::Fma, "{}", moek_cpu::isa().name());
    }
}
