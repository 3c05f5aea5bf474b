//! A/B of moek-cpu's primitives against the `gemm` and `pulp` crates, all on the calling thread.
//!
//! Each table row is the median of `REPS` timed calls after one warm-up call; the variants of a
//! row group run interleaved (one call of each per round), so machine noise hits them alike.
//! "max rel diff" is `max |out - moek| / max |moek|` over the outputs of the warm-up calls.

use std::cell::RefCell;
use std::hint::black_box;
use std::marker::PhantomData;
use std::time::Instant;

use gemm::Parallelism;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use moek_cpu::Element;
use pulp::bytemuck::{Pod, cast_slice};
use pulp::{Arch, Simd, WithSimd};

const REPS: usize = 7;

/// A 16-bit storage type: widened by `half`'s slice conversion (the `gemm` rows) or, in pairs
/// packed in a `u32` lane, by pulp's portable SIMD operations (the pulp kernel).
trait Half: Element + Pod {
    /// Vectors of `u32` lanes per step of the pulp kernel (two accumulators each).
    const UNROLL: usize;
    fn widen(src: &[Self], dst: &mut [f32]);
    /// The values in the low and high halves of each lane.
    fn split<S: Simd>(simd: S, v: S::u32s) -> (S::f32s, S::f32s);
}

impl Half for bf16 {
    const UNROLL: usize = 4;
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn split<S: Simd>(simd: S, v: S::u32s) -> (S::f32s, S::f32s) {
        let lo = simd.wrapping_dyn_shl_u32s(v, simd.splat_u32s(16));
        let hi = simd.and_u32s(v, simd.splat_u32s(0xffff_0000));
        (simd.transmute_f32s_u32s(lo), simd.transmute_f32s_u32s(hi))
    }
}

impl Half for f16 {
    // Four accumulators: eight spill next to the conversion's temporaries (16 registers).
    const UNROLL: usize = 2;
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    #[inline(always)]
    fn split<S: Simd>(simd: S, v: S::u32s) -> (S::f32s, S::f32s) {
        let lo = simd.wrapping_dyn_shl_u32s(v, simd.splat_u32s(16));
        (f16_high(simd, lo), f16_high(simd, v))
    }
}

/// The f16 in the high half of each lane as f32, exactly (pulp's `Simd` has no F16C conversion):
/// exponent and mantissa moved into place and scaled by 2^112, infinities and NaNs selected.
#[inline(always)]
fn f16_high<S: Simd>(simd: S, v: S::u32s) -> S::f32s {
    let sign = simd.and_u32s(v, simd.splat_u32s(0x8000_0000));
    let magnitude = simd.and_u32s(
        simd.wrapping_dyn_shr_u32s(v, simd.splat_u32s(3)),
        simd.splat_u32s(0x0fff_e000),
    );
    let scaled = simd.mul_f32s(
        simd.transmute_f32s_u32s(magnitude),
        simd.splat_f32s(2f32.powi(112)),
    );
    let special = simd.greater_than_or_equal_u32s(magnitude, simd.splat_u32s(0x0f80_0000));
    let bits = simd.select_u32s(
        special,
        simd.or_u32s(magnitude, simd.splat_u32s(0x7f80_0000)),
        simd.transmute_u32s_f32s(scaled),
    );
    simd.transmute_f32s_u32s(simd.or_u32s(bits, sign))
}

/// `acc[0] += low halves of v * lo`, `acc[1] += high halves * hi`. A function, not a closure:
/// a closure in `with_simd` is not inlined into the caller whose target features pulp enables,
/// and every intrinsic in it then becomes a call (f16 ran two orders of magnitude slower
/// so).
#[inline(always)]
fn fma2<T: Half, S: Simd>(simd: S, acc: &mut [S::f32s], v: S::u32s, lo: S::f32s, hi: S::f32s) {
    let (a, b) = T::split(simd, v);
    acc[0] = simd.mul_add_f32s(a, lo, acc[0]);
    acc[1] = simd.mul_add_f32s(b, hi, acc[1]);
}

/// `out[j] = x . mat[j]`, one row at a time: the rows read as `u32` lanes of two values each,
/// against `x` split the same way (even elements in `x_lo`, odd in `x_hi`).
struct RowDots<'a, T> {
    x_lo: &'a [f32],
    x_hi: &'a [f32],
    mat: &'a [u32],
    out: &'a mut [f32],
    ty: PhantomData<T>,
}

impl<T: Half> WithSimd for RowDots<'_, T> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let (x_lo, lo_tail) = S::as_simd_f32s(self.x_lo);
        let (x_hi, hi_tail) = S::as_simd_f32s(self.x_hi);
        for (row, out) in self.mat.chunks_exact(self.x_lo.len()).zip(self.out) {
            let (lanes, tail) = S::as_simd_u32s(row);
            // Up to eight accumulators: two FMA pipes of four cycles' latency.
            let mut acc = [simd.splat_f32s(0.0); 8];
            let (step, lo_steps, hi_steps) = (
                lanes.chunks_exact(T::UNROLL),
                x_lo.chunks_exact(T::UNROLL),
                x_hi.chunks_exact(T::UNROLL),
            );
            let done = lanes.len() - step.remainder().len();
            for ((v, lo), hi) in step.zip(lo_steps).zip(hi_steps) {
                for u in 0..T::UNROLL {
                    fma2::<T, S>(simd, &mut acc[2 * u..], v[u], lo[u], hi[u]);
                }
            }
            for i in done..lanes.len() {
                fma2::<T, S>(simd, &mut acc, lanes[i], x_lo[i], x_hi[i]);
            }
            let [a, b, c, d, e, f, g, h] = acc;
            let sum = simd.add_f32s(
                simd.add_f32s(simd.add_f32s(a, b), simd.add_f32s(c, d)),
                simd.add_f32s(simd.add_f32s(e, f), simd.add_f32s(g, h)),
            );
            let pairs: &[T] = cast_slice(tail);
            *out = simd.reduce_sum_f32s(sum)
                + (pairs.chunks_exact(2).zip(lo_tail.iter().zip(hi_tail)))
                    .map(|(p, (l, h))| p[0].to_f32() * l + p[1].to_f32() * h)
                    .sum::<f32>();
        }
    }
}

/// One row group: variants that write the same output, each into its own buffer.
type Variant<'a> = (String, Box<dyn FnMut(&mut [f32]) + 'a>);

/// Median seconds per call of each variant (`inner` calls a sample), and each output's max rel
/// diff against the first variant's.
fn bench(variants: &mut [Variant], out_len: usize, inner: usize) -> Vec<(f64, f64)> {
    let mut outs = vec![vec![0f32; out_len]; variants.len()];
    for ((_, run), out) in variants.iter_mut().zip(&mut outs) {
        run(out);
    }
    let scale = outs[0].iter().fold(0f32, |m, v| m.max(v.abs()));
    let diffs: Vec<f64> = (outs.iter())
        .map(|out| {
            let d = (out.iter().zip(&outs[0])).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            f64::from(d / scale)
        })
        .collect();
    let mut times = vec![vec![]; variants.len()];
    for _ in 0..REPS {
        for (((_, run), out), t) in variants.iter_mut().zip(&mut outs).zip(&mut times) {
            let start = Instant::now();
            for _ in 0..inner {
                run(black_box(&mut out[..]));
            }
            t.push(start.elapsed().as_secs_f64() / inner as f64);
        }
    }
    let medians = times.into_iter().map(|mut t| {
        t.sort_by(f64::total_cmp);
        t[REPS / 2]
    });
    medians.zip(diffs).collect()
}

fn print_rows(
    workload: &str,
    ty: &str,
    shape: &str,
    unit: &str,
    work: f64,
    variants: &[Variant],
    results: &[(f64, f64)],
) {
    for ((name, _), (secs, diff)) in variants.iter().zip(results) {
        println!(
            "| {workload} | {ty} | {shape} | {name} | {:.3} | {:.1} {unit} | {diff:.1e} |",
            secs * 1e3,
            work / secs / 1e9
        );
    }
}

/// Uniform values in [-1, 1) from a fixed seed.
fn data<T: Element>(len: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            T::from_f32((s >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
        })
        .collect()
}

fn moek_name() -> String {
    format!("moek ({})", moek_cpu::isa().name())
}

/// The gemm crate on this thread: `dst (+)= a . b^T` (`+=` if `accumulate`, else `=`) for
/// row-major `a` (m x k) and `dst` (m x n), `b` (n x k) read in place as the k x n rhs (row
/// stride 1, column stride k). `one` is `T`'s 1. Panics where gemm lacks `T` (bf16).
#[rustfmt::skip]
fn gemm_crate<T: Copy + 'static>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [T],
    a: &[T],
    b: &[T],
    accumulate: bool,
    one: T,
) {
    assert!(a.len() >= m * k && b.len() >= n * k && dst.len() >= m * n);
    let (k_, n_) = (k as isize, n as isize);
    // gemm computes dst := alpha * dst (if read) + beta * lhs . rhs.
    // SAFETY: the three matrices are in bounds (asserted) and `dst` overlaps neither input.
    unsafe {
        gemm::gemm(
            m, n, k, dst.as_mut_ptr(), 1, n_, accumulate, a.as_ptr(), 1, k_, b.as_ptr(), k_, 1,
            one, one, false, false, false, Parallelism::None,
        );
    }
}

/// `c[m x n] += a[m x k] . b[n x k]^T`.
fn gemm_rows<T: Half>(m: usize, n: usize, k: usize) {
    let (a, b) = (data::<T>(m * k, 1), data::<T>(n * k, 2));
    let (a32, b32) = (
        RefCell::new(vec![0f32; m * k]),
        RefCell::new(vec![0f32; n * k]),
    );
    let c16 = RefCell::new(vec![T::default(); m * n]);
    let (a_wide, b_wide): (Vec<f32>, Vec<f32>) = (
        a.iter().map(|v| v.to_f32()).collect(),
        b.iter().map(|v| v.to_f32()).collect(),
    );
    let f32_gemm = |a: &[f32], b: &[f32], c: &mut [f32]| {
        gemm_crate((m, n, k), c, a, b, true, 1.0);
    };
    let mut variants: Vec<Variant> = vec![
        (
            moek_name(),
            Box::new(|c| moek_cpu::gemm_nt(&a, k, &b, k, c, n, m, n, k)),
        ),
        (
            "gemm f32, widened per call".into(),
            Box::new(|c| {
                let (mut a32, mut b32) = (a32.borrow_mut(), b32.borrow_mut());
                T::widen(&a, &mut a32);
                T::widen(&b, &mut b32);
                f32_gemm(&a32, &b32, c);
            }),
        ),
        (
            "gemm f32, pre-widened (reference)".into(),
            Box::new(|c| f32_gemm(&a_wide, &b_wide, c)),
        ),
    ];
    if T::DTYPE.name() == "f16" {
        // gemm-f16 writes f16: dst := lhs . rhs, then added into c (an m x n widening).
        variants.push((
            "gemm f16 (gemm-f16)".into(),
            Box::new(|c| {
                let mut c16 = c16.borrow_mut();
                gemm_crate((m, n, k), &mut c16, &a, &b, false, T::from_f32(1.0));
                c.iter_mut()
                    .zip(c16.iter())
                    .for_each(|(c, v)| *c += v.to_f32());
            }),
        ));
    }
    let results = bench(&mut variants, m * n, 1);
    let shape = format!("m={m} n={n} k={k}");
    print_rows(
        "gemm_nt",
        T::DTYPE.name(),
        &shape,
        "GFLOP/s",
        2.0 * (m * n * k) as f64,
        &variants,
        &results,
    );
}

/// `out[j] = x . mat[j]` for `rows` rows of `k` (the matrix streamed once per call).
fn matvec_rows<T: Half>(rows: usize, k: usize) {
    assert!(k.is_multiple_of(2), "the pulp kernel reads pairs");
    let (x, mat) = (data::<T>(k, 3), data::<T>(rows * k, 4));
    let (mut x_lo, mut x_hi) = (vec![0f32; k / 2], vec![0f32; k / 2]);
    let x32: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let pairs: &[u32] = cast_slice(&mat);
    let mut variants: Vec<Variant> = vec![
        (
            moek_name(),
            Box::new(|out| {
                moek_cpu::dot::dot_rows(&x, &mat, k, 0..rows, &[(0, k)], |j, v| out[j] = v)
            }),
        ),
        (
            moek_name() + ", x pre-widened to f32",
            Box::new(|out| {
                moek_cpu::dot::dot_rows(&x32, &mat, k, 0..rows, &[(0, k)], |j, v| out[j] = v)
            }),
        ),
        (
            "pulp (row at a time)".into(),
            Box::new(|out| {
                for (i, p) in x.chunks_exact(2).enumerate() {
                    (x_lo[i], x_hi[i]) = (p[0].to_f32(), p[1].to_f32());
                }
                let op = RowDots::<T> {
                    x_lo: &x_lo,
                    x_hi: &x_hi,
                    mat: pairs,
                    out,
                    ty: PhantomData,
                };
                Arch::new().dispatch(op);
            }),
        ),
    ];
    let bytes = (rows * k * size_of::<T>()) as f64;
    let inner = (256 << 20) / (rows * k * size_of::<T>()) + 1;
    let results = bench(&mut variants, rows, inner);
    let shape = format!("{rows} x {k} ({:.1} MB)", bytes / 1e6);
    print_rows(
        "dot_rows",
        T::DTYPE.name(),
        &shape,
        "GB/s",
        bytes,
        &variants,
        &results,
    );
}

fn main() {
    // An argument runs only that workload (`gemm_nt` or `dot_rows`).
    let only = std::env::args().nth(1);
    let run = |workload: &str| only.as_deref().is_none_or(|w| w == workload);
    println!("| workload | type | shape | variant | ms | rate | max rel diff |");
    println!("|---|---|---|---|---|---|---|");
    for m in [32, 512].into_iter().filter(|_| run("gemm_nt")) {
        for (n, k) in [(1408, 2816), (2816, 704)] {
            gemm_rows::<bf16>(m, n, k);
            gemm_rows::<f16>(m, n, k);
        }
    }
    for rows in [8192, 256].into_iter().filter(|_| run("dot_rows")) {
        matvec_rows::<bf16>(rows, 2816);
        matvec_rows::<f16>(rows, 2816);
    }
}
