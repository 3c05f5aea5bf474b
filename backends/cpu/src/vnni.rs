//! Row products of Q8_0 and Q4_0 blocks on AVX-512 VNNI (`vpdpbusd`: unsigned x signed bytes,
//! four products a 32-bit lane, added into it), against an activation quantized per group of 32
//! ([`QuantizedActivation`]); the AVX-512 level's counterpart of [`crate::avx2::dot_q8`] and
//! [`crate::avx2::dot_q4`], computing the same exact integer group sums with fewer instructions:
//! one `vpdpbusd` where AVX2 needs `vpmaddubsw` then `vpmaddwd`, two or four groups a 512-bit
//! step, and the scales of eight groups converted at once. Only the f32 additions' order
//! differs from the AVX2 kernels' (fixed by the code: chains, then a fixed tree).

use crate::dot::avx512::{CHAINS, reduce_chains};
use crate::quant::QuantizedActivation;
use moek_ir::quant::{BlockQ4, BlockQ8, GROUP};
use std::arch::x86_64::*;

/// The 8 lanes of `v` added by a fixed tree.
#[inline]
#[target_feature(enable = "avx2")]
fn reduce8(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// Both scales (the weight block's times the activation group's) of groups `b..b + 8`, the
/// weight's as f16 bits from `d(i)`: one conversion for eight.
#[inline(always)]
unsafe fn scales8(d: impl Fn(usize) -> u16, xd: &[f32], b: usize) -> __m256 {
    let bits: [u16; 8] = std::array::from_fn(|i| d(b + i));
    // SAFETY: `b + 8 <= xd.len()` (the callers' loop bounds); F16C is enabled by the caller.
    unsafe {
        let bits = _mm_loadu_si128(bits.as_ptr().cast());
        _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_loadu_ps(xd.as_ptr().add(b)))
    }
}

/// [`scales8`] for the `N` (at most 4) groups from `b`, in the low lanes.
#[inline(always)]
unsafe fn scales_n<const N: usize>(d: impl Fn(usize) -> u16, xd: &[f32], b: usize) -> __m256 {
    let bits: [u16; 8] = std::array::from_fn(|i| if i < N { d(b + i) } else { 0 });
    let mut xs = [0f32; 4];
    // SAFETY: `b + N <= xd.len()` (the callers' loop bounds); F16C is enabled by the caller.
    unsafe {
        xs[..N].copy_from_slice(xd.get_unchecked(b..b + N));
        let d = _mm_mul_ps(
            _mm_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast())),
            _mm_loadu_ps(xs.as_ptr()),
        );
        _mm256_castps128_ps256(d)
    }
}

/// A group's scale, one lane of [`scales8`]'s, for the last groups one at a time.
#[inline(always)]
unsafe fn scale1(d: u16, xd: &[f32], b: usize) -> f32 {
    // SAFETY: `b < xd.len()` (the callers' loop bounds); F16C is enabled by the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d)))) * *xd.get_unchecked(b) }
}

/// `sum over segs (in order) of row[seg] . x[seg]` for Q8 blocks of `G` groups, the segments in
/// groups. Two groups a step: their 32 weight bytes each in one half of a register; `|w|` as
/// unsigned times `x` with `w`'s sign (`vpdpbusd`; exact, as `|w| <= 128` and `x != -128`),
/// so each 32-bit lane holds the sum of four products, eight lanes a group; converted, scaled
/// by their group's two scales (one permute of [`scales8`]) and fused into one of [`CHAINS`]
/// accumulators in turn. After the last whole eight, pairs, then a last odd group in a 256-bit step.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8<const G: usize>(
    row: &[BlockQ8<G>],
    x: &QuantizedActivation,
    segs: &[(usize, usize)],
    ahead: usize,
) -> f32 {
    let n = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
    assert!(row.len() * G >= n && x.scales.len() >= n && x.values.len() >= n * GROUP);
    // Group `b`'s bytes and its block's scale bits. SAFETY: every caller passes `b < n`.
    let group = |b: usize| unsafe {
        let blk = row.get_unchecked(b / G);
        (blk.qs.get_unchecked(b % G).as_ptr(), blk.d)
    };
    let xv = x.values.as_ptr();
    let pair = |acc: &mut __m512, b: usize, d: __m512| {
        // SAFETY: `b + 1 < n`: both groups' bytes are in the slices (asserted); ours.
        unsafe {
            let (wa, wb) = (group(b).0, group(b + 1).0);
            crate::memory::prefetch(wa.cast::<u8>().wrapping_add(ahead));
            let w = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(wa.cast())),
                _mm256_loadu_si256(wb.cast()),
            );
            let xs = _mm512_loadu_si512(xv.add(b * GROUP).cast());
            let xs = _mm512_mask_sub_epi8(xs, _mm512_movepi8_mask(w), _mm512_setzero_si512(), xs);
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(w), xs);
            *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), *acc);
        }
    };
    let one = |acc: &mut __m256, b: usize| {
        // SAFETY: `b < n` (as above).
        unsafe {
            let (wq, d) = group(b);
            let w = _mm256_loadu_si256(wq.cast());
            let xs = _mm256_loadu_si256(xv.add(b * GROUP).cast());
            let dot = _mm256_dpbusd_epi32(
                _mm256_setzero_si256(),
                _mm256_sign_epi8(w, w),
                _mm256_sign_epi8(xs, w),
            );
            let s = _mm256_set1_ps(scale1(d, &x.scales, b));
            *acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), *acc);
        }
    };
    // Lanes 0..8 group `2k`'s scale, 8..16 group `2k + 1`'s.
    let spread = |d: __m256, k: i32| {
        let (lo, hi) = (2 * k, 2 * k + 1);
        let at = _mm512_setr_epi32(
            lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi,
        );
        _mm512_permutexvar_ps(at, _mm512_castps256_ps512(d))
    };
    segs.iter().fold(0f32, |sum, &(s, e)| {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / 8 * 8;
        for b in (s..full).step_by(8) {
            // SAFETY: `b + 8 <= n`.
            let d = unsafe { scales8(|g| group(g).1, &x.scales, b) };
            pair(a0, b, spread(d, 0));
            pair(a1, b + 2, spread(d, 1));
            pair(a2, b + 4, spread(d, 2));
            pair(a3, b + 6, spread(d, 3));
        }
        // The last 0..=3 pairs, each into its own chain (fixed registers, no indexing).
        let pairs_end = full + (e - full) / 2 * 2;
        for (b, acc) in (full..pairs_end).step_by(2).zip([a0, a1, a2]) {
            // SAFETY: `b + 2 <= n`.
            let d = unsafe { scales_n::<2>(|g| group(g).1, &x.scales, b) };
            pair(acc, b, spread(d, 0));
        }
        let mut rest = _mm256_setzero_ps();
        if pairs_end < e {
            one(&mut rest, pairs_end);
        }
        sum + (reduce_chains(acc) + reduce8(rest))
    })
}

/// `sum over segs (in order) of row[seg] . x[seg]` for Q4 blocks of `G` groups, the segments
/// in groups. Four groups a step: their 16 bytes of nibbles in the four 128-bit lanes, one mask
/// giving the low nibbles (values 0..16) and a shift and mask the high ones (16..32), each
/// multiplied as stored (0..=15) by the activation's matching halves
/// ([`QuantizedActivation::low`], [`QuantizedActivation::high`]: four groups' halves are one
/// 64-byte load) in two `vpdpbusd` into the same lanes; a group's 4 lanes then hold its sums
/// over values `4i..4i + 4` and `16 + 4i..16 + 4i + 4`, less [`QuantizedActivation::offsets`]
/// (what the nibbles' offset of 8 adds: one load for four groups), converted, scaled and fused
/// into one of [`CHAINS`] accumulators in turn. After the last whole sixteen, fours, then the
/// last groups in a 128-bit step each.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4<const G: usize>(
    row: &[BlockQ4<G>],
    x: &QuantizedActivation,
    segs: &[(usize, usize)],
    ahead: usize,
) -> f32 {
    let n = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
    assert!(row.len() * G >= n && x.scales.len() >= n && x.offsets.len() >= n * 4);
    assert!(x.low.len() >= n * 16 && x.high.len() >= n * 16);
    // Group `b`'s nibbles and its block's scale bits. SAFETY: every caller passes `b < n`.
    let group = |b: usize| unsafe {
        let blk = row.get_unchecked(b / G);
        (blk.qs.get_unchecked(b % G).as_ptr(), blk.d)
    };
    let (low, high, offsets) = (x.low.as_ptr(), x.high.as_ptr(), x.offsets.as_ptr());
    let mask = _mm512_set1_epi8(0x0f);
    let quad = |acc: &mut __m512, b: usize, d: __m512| {
        // SAFETY: `b + 3 < n`: the four groups' lanes are in the slices (asserted); ours.
        unsafe {
            let q = |i: usize| _mm_loadu_si128(group(b + i).0.cast());
            crate::memory::prefetch(group(b).0.cast::<u8>().wrapping_add(ahead));
            let w = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(q(0)), q(1));
            let w = _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(w, q(2)), q(3));
            let lo = _mm512_and_si512(w, mask);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask);
            let xl = _mm512_loadu_si512(low.add(b * 16).cast());
            let xh = _mm512_loadu_si512(high.add(b * 16).cast());
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl);
            let dot = _mm512_dpbusd_epi32(dot, hi, xh);
            let dot = _mm512_sub_epi32(dot, _mm512_loadu_si512(offsets.add(b * 4).cast()));
            *acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot), *acc);
        }
    };
    let one = |acc: &mut __m128, b: usize| {
        // SAFETY: `b < n` (as above).
        unsafe {
            let (wq, d) = group(b);
            let w = _mm_loadu_si128(wq.cast());
            let m = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(w, m);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(w), m);
            let dot = _mm_dpbusd_epi32(
                _mm_setzero_si128(),
                lo,
                _mm_loadu_si128(low.add(b * 16).cast()),
            );
            let dot = _mm_dpbusd_epi32(dot, hi, _mm_loadu_si128(high.add(b * 16).cast()));
            let dot = _mm_sub_epi32(dot, _mm_loadu_si128(offsets.add(b * 4).cast()));
            let s = _mm_set1_ps(scale1(d, &x.scales, b));
            *acc = _mm_fmadd_ps(s, _mm_cvtepi32_ps(dot), *acc);
        }
    };
    // Lane `i` holds the scale of group `4k + i / 4`.
    let spread = |d: __m256, k: i32| {
        let g = |i: i32| 4 * k + i;
        let at = _mm512_setr_epi32(
            g(0),
            g(0),
            g(0),
            g(0),
            g(1),
            g(1),
            g(1),
            g(1),
            g(2),
            g(2),
            g(2),
            g(2),
            g(3),
            g(3),
            g(3),
            g(3),
        );
        _mm512_permutexvar_ps(at, _mm512_castps256_ps512(d))
    };
    segs.iter().fold(0f32, |sum, &(s, e)| {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / 16 * 16;
        for b in (s..full).step_by(16) {
            // SAFETY: `b + 16 <= n`.
            let (d0, d1) = unsafe {
                (
                    scales8(|g| group(g).1, &x.scales, b),
                    scales8(|g| group(g).1, &x.scales, b + 8),
                )
            };
            quad(a0, b, spread(d0, 0));
            quad(a1, b + 4, spread(d0, 1));
            quad(a2, b + 8, spread(d1, 0));
            quad(a3, b + 12, spread(d1, 1));
        }
        // The last 0..=3 fours, each into its own chain, then 0..=3 single groups.
        let quads_end = full + (e - full) / 4 * 4;
        for (b, acc) in (full..quads_end).step_by(4).zip([a0, a1, a2]) {
            // SAFETY: `b + 4 <= n`.
            let d = unsafe { scales_n::<4>(|g| group(g).1, &x.scales, b) };
            quad(acc, b, spread(d, 0));
        }
        let mut rest = _mm_setzero_ps();
        for b in quads_end..e {
            one(&mut rest, b);
        }
        let rest = _mm_add_ps(rest, _mm_movehl_ps(rest, rest));
        let rest = _mm_cvtss_f32(_mm_add_ss(rest, _mm_movehdup_ps(rest)));
        sum + (reduce_chains(acc) + rest)
    })
}
