//! Row products of Q8_0 and Q4_0 blocks on AVX-512 VNNI (`vpdpbusd`: unsigned x signed bytes,
//! four products a 32-bit lane, added into it), against an activation quantized per group of 32
//! ([`QuantizedActivation`]); the AVX-512 level's counterpart of [`crate::avx2::dot_q8`] and
//! [`crate::avx2::dot_q4`], computing the same exact integer group sums with fewer instructions:
//! one `vpdpbusd` where AVX2 needs `vpmaddubsw` then `vpmaddwd`, two or four groups a 512-bit
//! step (one load where they share a block), a step's scales converted at once. Only the f32
//! additions' order differs from the AVX2 kernels' (fixed by the code: chains, each segment's
//! lanes, then the segments in order: [`sum_segment_vectors`]).

use crate::dot::avx512::{CHAINS, add_chains, sum_segment_vectors};
use crate::quant::QuantizedActivation;
use moek_ir::quant::{BlockQ4, BlockQ8, GROUP};
use std::arch::x86_64::*;

/// The scales of the `N` groups from `b` (2 for a Q8_0 step, 4 for Q4_0), the weight block's
/// times the activation group's, each spread over its group's `16 / N` lanes of a step's sums.
/// A step inside one block reads one scale; one across blocks reads one a group.
#[inline(always)]
unsafe fn step_scales<const N: usize, const G: usize>(
    d: impl Fn(usize) -> u16,
    xd: &[f32],
    b: usize,
) -> __m512 {
    // SAFETY: `b + N <= xd.len()` (the callers' loop bounds); AVX-512 F and F16C are enabled by
    // the caller.
    unsafe {
        let xs = match N {
            2 => _mm_castpd_ps(_mm_load_sd(xd.as_ptr().add(b).cast())),
            _ => _mm_loadu_ps(xd.as_ptr().add(b)),
        };
        let spread = |v: __m128| {
            let at = _mm512_loadu_si512(Spread::<N>::LANES.as_ptr().cast());
            _mm512_permutexvar_ps(at, _mm512_castps128_ps512(v))
        };
        if G >= N {
            let dw = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d(b)))));
            _mm512_mul_ps(_mm512_set1_ps(dw), spread(xs))
        } else {
            let bits: [u16; 8] = std::array::from_fn(|i| if i < N { d(b + i) } else { 0 });
            let dw = _mm_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast()));
            spread(_mm_mul_ps(dw, xs))
        }
    }
}

/// Lane `i` of a step of `N` groups' sums belongs to group `LANES[i]`.
struct Spread<const N: usize>;

impl<const N: usize> Spread<N> {
    const LANES: [i32; 16] = {
        let mut at = [0; 16];
        let mut i = 0;
        while i < 16 {
            at[i] = (i / (16 / N)) as i32;
            i += 1;
        }
        at
    };
}

/// A group's scale (the weight block's times the activation group's), for the last groups one
/// at a time.
#[inline(always)]
unsafe fn scale1(d: u16, xd: &[f32], b: usize) -> f32 {
    // SAFETY: `b < xd.len()` (the callers' loop bounds); F16C is enabled by the caller.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d)))) * *xd.get_unchecked(b) }
}

/// `sum over segs (in order) of row[seg] . x[seg]` for Q8 blocks of `G` groups, the segments in
/// groups. Two groups a step: their 32 weight bytes each in one half of a register; `|w|` as
/// unsigned times `x` with `w`'s sign (`vpdpbusd`; exact, as `|w| <= 128` and `x != -128`),
/// so each 32-bit lane holds the sum of four products, eight lanes a group; converted, scaled
/// by their group's two scales ([`step_scales`]) and fused into one of [`CHAINS`]
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
    let pair = |acc: &mut __m512, b: usize| {
        // SAFETY: `b + 1 < n`: both groups' bytes are in the slices (asserted); ours.
        unsafe {
            let (wa, wb) = (group(b).0, group(b + 1).0);
            crate::memory::prefetch_span(
                wa.cast::<u8>().wrapping_add(ahead),
                2 * size_of::<BlockQ8<G>>() / G,
            );
            // Two groups of one block are one load.
            let w = if G >= 2 {
                _mm512_loadu_si512(wa.cast())
            } else {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(wa.cast())),
                    _mm256_loadu_si256(wb.cast()),
                )
            };
            let d = step_scales::<2, G>(|g| group(g).1, &x.scales, b);
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
    sum_segment_vectors(segs, |s, e| {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / 8 * 8;
        for b in (s..full).step_by(8) {
            pair(a0, b);
            pair(a1, b + 2);
            pair(a2, b + 4);
            pair(a3, b + 6);
        }
        // The last 0..=3 pairs, each into its own chain (fixed registers, no indexing).
        let pairs_end = full + (e - full) / 2 * 2;
        for (b, acc) in (full..pairs_end).step_by(2).zip([a0, a1, a2]) {
            pair(acc, b);
        }
        let mut rest = _mm256_setzero_ps();
        if pairs_end < e {
            one(&mut rest, pairs_end);
        }
        _mm512_add_ps(add_chains(acc), _mm512_zextps256_ps512(rest))
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
/// into one of [`CHAINS`] accumulators in turn. After the last whole sixteen, fours, then a
/// last pair in a 256-bit step and a last odd group in a 128-bit one.
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
    let quad = |acc: &mut __m512, b: usize| {
        // SAFETY: `b + 3 < n`: the four groups' lanes are in the slices (asserted); ours.
        unsafe {
            let q = |i: usize| _mm_loadu_si128(group(b + i).0.cast());
            crate::memory::prefetch_span(
                group(b).0.cast::<u8>().wrapping_add(ahead),
                4 * size_of::<BlockQ4<G>>() / G,
            );
            // Four groups of one block are one load.
            let w = if G >= 4 {
                _mm512_loadu_si512(group(b).0.cast())
            } else {
                let w = _mm512_inserti32x4::<1>(_mm512_castsi128_si512(q(0)), q(1));
                _mm512_inserti32x4::<3>(_mm512_inserti32x4::<2>(w, q(2)), q(3))
            };
            let d = step_scales::<4, G>(|g| group(g).1, &x.scales, b);
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
    let two = |acc: &mut __m256, b: usize| {
        // SAFETY: `b + 1 < n` (as above).
        unsafe {
            let w = _mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(group(b).0.cast())),
                _mm_loadu_si128(group(b + 1).0.cast()),
            );
            let m = _mm256_set1_epi8(0x0f);
            let lo = _mm256_and_si256(w, m);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(w), m);
            let xl = _mm256_loadu_si256(low.add(b * 16).cast());
            let xh = _mm256_loadu_si256(high.add(b * 16).cast());
            let dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, xl);
            let dot = _mm256_dpbusd_epi32(dot, hi, xh);
            let dot = _mm256_sub_epi32(dot, _mm256_loadu_si256(offsets.add(b * 4).cast()));
            let s = _mm256_setr_m128(
                _mm_set1_ps(scale1(group(b).1, &x.scales, b)),
                _mm_set1_ps(scale1(group(b + 1).1, &x.scales, b + 1)),
            );
            *acc = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(dot), *acc);
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
    sum_segment_vectors(segs, |s, e| {
        let mut acc = [_mm512_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / 16 * 16;
        for b in (s..full).step_by(16) {
            quad(a0, b);
            quad(a1, b + 4);
            quad(a2, b + 8);
            quad(a3, b + 12);
        }
        // The last 0..=3 fours, each into its own chain, then 0..=3 single groups.
        let quads_end = full + (e - full) / 4 * 4;
        for (b, acc) in (full..quads_end).step_by(4).zip([a0, a1, a2]) {
            quad(acc, b);
        }
        let (mut pair, mut last) = (_mm256_setzero_ps(), _mm_setzero_ps());
        let pair_end = quads_end + (e - quads_end) / 2 * 2;
        if pair_end > quads_end {
            two(&mut pair, quads_end);
        }
        if pair_end < e {
            one(&mut last, pair_end);
        }
        let rest = _mm256_add_ps(pair, _mm256_zextps128_ps256(last));
        _mm512_add_ps(add_chains(acc), _mm512_zextps256_ps512(rest))
    })
}
