//! The AVX2 level: every primitive on AVX2 + FMA + F16C (8 f32 lanes), for the CPUs without
//! AVX-512 (every AMD before Zen 4, most Intel client chips, many cloud VMs).
//!
//! One file per level: the front modules ([`crate::dot`], [`crate::gemm`], [`crate::axpy`],
//! [`crate::activation`], [`crate::bandwidth`]) check shapes and pick the level; this file holds
//! only the arithmetic. Widening: bf16 by a 16-bit shift, f16 by F16C's `vcvtph2ps`, exact both.
//! Sums follow the same plan as the AVX-512 level at half its width (docs/numerics.md).

use crate::element::{Kind, kind};
use crate::quant::QuantizedActivation;
use moek_ir::Element;
use std::arch::x86_64::*;

/// f32 lanes per vector.
const LANES: usize = 8;

/// Element kinds as const parameters (a kernel is compiled once per pair of kinds).
pub(crate) const F32: u8 = 0;
pub(crate) const F16: u8 = 1;
pub(crate) const BF16: u8 = 2;

const fn size_of_kind(k: u8) -> usize {
    if k == F32 { 4 } else { 2 }
}

fn kind_code<W: Element>() -> u8 {
    match kind::<W>() {
        Kind::F32 => F32,
        Kind::F16 => F16,
        Kind::Bf16 => BF16,
    }
}

/// Whether this CPU has everything this level uses.
pub fn detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Loads 8 elements of kind `K` at `p` as 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const K: u8>(p: *const u8) -> __m256 {
    // SAFETY: the caller guarantees 8 readable elements at `p`.
    unsafe {
        match K {
            F32 => _mm256_loadu_ps(p.cast::<f32>()),
            F16 => _mm256_cvtph_ps(_mm_loadu_si128(p.cast::<__m128i>())),
            _ => {
                let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast::<__m128i>()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
            }
        }
    }
}

/// Loads `n` (< 8) elements of kind `K` at `p`, zero beyond `n`, reading nothing past them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_part<const K: u8>(p: *const u8, n: usize) -> __m256 {
    let mut buf = [0u8; 32];
    // SAFETY: `n` elements are readable at `p`; `buf` holds 8 of any kind.
    unsafe {
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n * size_of_kind(K));
        load8::<K>(buf.as_ptr())
    }
}

/// Loads `n` (<= 8) elements, zero beyond `n`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_n<const K: u8>(p: *const u8, n: usize) -> __m256 {
    // SAFETY: forwarded from the caller.
    unsafe {
        if n >= LANES {
            load8::<K>(p)
        } else {
            load_part::<K>(p, n)
        }
    }
}

/// The 8 lanes summed by a fixed pairwise tree: lane i + lane i+4, then i + i+2, then the two.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce(v: __m256) -> f32 {
    let s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps::<1>(s2, s2)))
}

/// Accumulator chains per row, as on AVX-512: consecutive 8-lane steps go to chains 0..3 in
/// turn, added (0 + 1) + (2 + 3) before the lanes are reduced.
const CHAINS: usize = 4;

/// `NR` dot products over ordered segments (see [`crate::dot::dotn_segments`]).
pub(crate) fn dotn<A: Element, B: Element, const NR: usize>(
    a: &[A],
    rows: [&[B]; NR],
    segs: &[(usize, usize)],
    next: Option<[&[B]; NR]>,
) -> [f32; NR] {
    let rp = rows.map(|s: &[B]| s.as_ptr().cast::<u8>());
    let np = next.map(|n| n.map(|s: &[B]| s.as_ptr().cast::<u8>()));
    let ap = a.as_ptr().cast::<u8>();
    // SAFETY: `isa()` checked the CPU features; rows and segments are in bounds (checked by the
    // caller).
    unsafe {
        match (kind::<A>(), kind::<B>()) {
            (Kind::Bf16, Kind::Bf16) => bf16_dotn::<NR>(ap, rp, segs, np),
            (Kind::F16, Kind::F16) => fma_dotn::<F16, F16, NR>(ap, rp, segs, np),
            (Kind::F32, Kind::F32) => fma_dotn::<F32, F32, NR>(ap, rp, segs, np),
            (Kind::F32, Kind::F16) => fma_dotn::<F32, F16, NR>(ap, rp, segs, np),
            (Kind::F32, Kind::Bf16) => fma_dotn::<F32, BF16, NR>(ap, rp, segs, np),
            _ => crate::dot::portable::dotn(a, rows, segs),
        }
    }
}

/// Convert-and-FMA dot products, 8 lanes per step, [`CHAINS`] chains per row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fma_dotn<const KA: u8, const KB: u8, const NR: usize>(
    a: *const u8,
    rows: [*const u8; NR],
    segs: &[(usize, usize)],
    next: Option<[*const u8; NR]>,
) -> [f32; NR] {
    let (sa, sb) = (size_of_kind(KA), size_of_kind(KB));
    // One round is CHAINS steps; it spans this many bytes of a row, prefetched a line at a time.
    let round = LANES * CHAINS;
    let lines = (round * sb).div_ceil(64);
    let mut sum = [0f32; NR];
    for &(s, e) in segs {
        let mut acc = [[_mm256_setzero_ps(); CHAINS]; NR];
        let mut i = s;
        // SAFETY (both loops): elements `i..e` remain in `a` and in every row; `next` rows hold
        // as many (checked by the caller); partial steps read only what remains.
        unsafe {
            while i + round <= e {
                if let Some(next) = next {
                    for r in next {
                        for l in 0..lines {
                            _mm_prefetch::<_MM_HINT_T0>(r.add(i * sb + 64 * l).cast::<i8>());
                        }
                    }
                }
                for c in 0..CHAINS {
                    let at = i + LANES * c;
                    let x = load8::<KA>(a.add(at * sa));
                    for r in 0..NR {
                        let w = load8::<KB>(rows[r].add(at * sb));
                        acc[r][c] = _mm256_fmadd_ps(x, w, acc[r][c]);
                    }
                }
                i += round;
            }
            for c in 0..CHAINS {
                let at = i + LANES * c;
                if at < e {
                    let n = LANES.min(e - at);
                    let x = load_n::<KA>(a.add(at * sa), n);
                    for r in 0..NR {
                        let w = load_n::<KB>(rows[r].add(at * sb), n);
                        acc[r][c] = _mm256_fmadd_ps(x, w, acc[r][c]);
                    }
                }
            }
        }
        for r in 0..NR {
            sum[r] += reduce_chains(acc[r]);
        }
    }
    sum
}

/// bf16 dot products, 16 elements per step: a 256-bit load holds eight pairs, widened without a
/// shuffle (the even element by a 16-bit shift, the odd one by masking off the low half), each
/// half to its own chain: half the instructions of widening 8 elements at a time, which bounds a
/// row in cache. A round is two steps: chains (0, 1) take the first step's even and odd
/// elements, (2, 3) the second's; the chains are added (0 + 1) + (2 + 3), then the lanes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bf16_dotn<const NR: usize>(
    a: *const u8,
    rows: [*const u8; NR],
    segs: &[(usize, usize)],
    next: Option<[*const u8; NR]>,
) -> [f32; NR] {
    const STEP: usize = 16;
    let round = STEP * 2;
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let split = |v: __m256i| {
        (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)),
            _mm256_castsi256_ps(_mm256_and_si256(v, high)),
        )
    };
    let mut sum = [0f32; NR];
    for &(s, e) in segs {
        let mut acc = [[_mm256_setzero_ps(); CHAINS]; NR];
        let mut i = s;
        // SAFETY (both loops): elements `i..e` remain in `a` and in every row; `next` rows hold
        // as many (checked by the caller); partial steps read only what remains.
        unsafe {
            while i + round <= e {
                if let Some(next) = next {
                    for r in next {
                        _mm_prefetch::<_MM_HINT_T0>(r.add(2 * i).cast::<i8>());
                    }
                }
                for half in 0..2 {
                    let at = i + STEP * half;
                    let (xe, xo) = split(_mm256_loadu_si256(a.add(2 * at).cast()));
                    for r in 0..NR {
                        let (we, wo) = split(_mm256_loadu_si256(rows[r].add(2 * at).cast()));
                        acc[r][2 * half] = _mm256_fmadd_ps(xe, we, acc[r][2 * half]);
                        acc[r][2 * half + 1] = _mm256_fmadd_ps(xo, wo, acc[r][2 * half + 1]);
                    }
                }
                i += round;
            }
            for half in 0..2 {
                let at = i + STEP * half;
                if at < e {
                    let n = STEP.min(e - at);
                    let load = |p: *const u8| {
                        let mut buf = [0u8; 32];
                        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), 2 * n);
                        _mm256_loadu_si256(buf.as_ptr().cast())
                    };
                    let (xe, xo) = split(load(a.add(2 * at)));
                    for r in 0..NR {
                        let (we, wo) = split(load(rows[r].add(2 * at)));
                        acc[r][2 * half] = _mm256_fmadd_ps(xe, we, acc[r][2 * half]);
                        acc[r][2 * half + 1] = _mm256_fmadd_ps(xo, wo, acc[r][2 * half + 1]);
                    }
                }
            }
        }
        for r in 0..NR {
            sum[r] += reduce_chains(acc[r]);
        }
    }
    sum
}

/// The chains of one row reduced to a number: (0 + 1) + (2 + 3), then the lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn reduce_chains(c: [__m256; CHAINS]) -> f32 {
    reduce(add_chains(c))
}

/// A row's chains added, (0 + 1) + (2 + 3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn add_chains(c: [__m256; CHAINS]) -> __m256 {
    _mm256_add_ps(_mm256_add_ps(c[0], c[1]), _mm256_add_ps(c[2], c[3]))
}

/// `y[i] += a * x[i]`, `x` (`n` elements of kind `K`, as many as `y` holds: checked by the
/// caller) widened on load; full-width stores, the tail through a buffer with the same fused
/// multiply-add.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn axpy<const K: u8>(a: f32, xp: *const u8, n: usize, y: &mut [f32]) {
    let av = _mm256_set1_ps(a);
    let (size, yp) = (size_of_kind(K), y.as_mut_ptr());
    let full = n / LANES * LANES;
    // SAFETY: the caller passes `n` elements of kind `K` at `xp` and `n` f32s in `y`; `i + 8
    // <= full <= n` in the loop, and the tail reads its `n - full` only.
    unsafe {
        for i in (0..full).step_by(LANES) {
            let x = load8::<K>(xp.add(i * size));
            let v = _mm256_fmadd_ps(av, x, _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), v);
        }
        if full < n {
            let x = load_part::<K>(xp.add(full * size), n - full);
            let yv = load_part::<F32>(yp.add(full).cast(), n - full);
            let mut buf = [0f32; LANES];
            _mm256_storeu_ps(buf.as_mut_ptr(), _mm256_fmadd_ps(av, x, yv));
            y[full..].copy_from_slice(&buf[..n - full]);
        }
    }
}

/// For one row of quantized blocks, `sum over segs (in order) of row[seg] . x[seg]`, the
/// segments in blocks ([`crate::dot::sum_segment_vectors`] for 256-bit vectors).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn sum_segments(segs: &[(usize, usize)], segment: impl FnMut(usize, usize) -> __m256) -> f32 {
    crate::dot::sum_segment_vectors(segs, _mm256_setzero_ps(), segment, |v| reduce(v))
}

/// [`sum_segments`] for Q8 blocks of `G` groups, the segments in groups: per group, `|w|` as
/// unsigned times `x` with `w`'s sign (`vpmaddubsw`; exact, as `|w| <= 128` and `x != -128`
/// keep each pair within i16), pairs of i16 added (`vpmaddwd`) into 8 lanes over values
/// `4i..4i + 4`, scaled by its block's scale and its activation group's and fused into one of
/// [`CHAINS`] accumulators in turn (group `b` into chain `b % 4`, so no one chain's FMA latency
/// bounds the loop), added (0 + 1) + (2 + 3), then the lanes by the fixed tree.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8<const G: usize>(
    row: &[moek_ir::quant::BlockQ8<G>],
    x: &QuantizedActivation,
    segs: &[(usize, usize)],
    ahead: usize,
) -> f32 {
    let n = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
    assert!(row.len() * G >= n && x.scales.len() >= n && x.values.len() >= n * 32);
    let ones = _mm256_set1_epi16(1);
    let step = |acc: &mut __m256, b: usize| {
        // SAFETY: `b < n`: the slices hold group `b`'s lanes (asserted); AVX2 is ours.
        unsafe {
            let blk = row.get_unchecked(b / G);
            let qs = blk.qs.get_unchecked(b % G);
            crate::memory::prefetch((qs as *const _ as *const u8).wrapping_add(ahead));
            let xv = _mm256_loadu_si256(x.values.as_ptr().add(b * 32).cast());
            let q = _mm256_loadu_si256(qs.as_ptr().cast());
            let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xv, q));
            let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(dot, ones));
            let d = _mm256_set1_ps(f16_bits_to_f32(blk.d) * *x.scales.get_unchecked(b));
            *acc = _mm256_fmadd_ps(d, sums, *acc);
        }
    };
    sum_segments(segs, |s, e| {
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / CHAINS * CHAINS;
        for b in (s..full).step_by(CHAINS) {
            step(a0, b);
            step(a1, b + 1);
            step(a2, b + 2);
            step(a3, b + 3);
        }
        // The last 0..=3 blocks, each into its own chain (fixed registers, no indexing).
        for (b, acc) in (full..e).zip([a0, a1, a2]) {
            step(acc, b);
        }
        add_chains(acc)
    })
}

/// [`sum_segments`] for MXFP4 blocks (one group each) against an f32 activation, the segments
/// in groups: each block's 16 bytes split into low (values 0..16) and high (16..32) nibbles,
/// looked up (`vpshufb`) in [`moek_ir::quant::MXFP4_STEPS`] (twice the e2m1 values, as i8),
/// widened to f32 eight at a time (exact) and multiplied into the activation by four FMAs into a
/// block sum, which is scaled by the block's `2^(e - 128)` into one of [`CHAINS`] accumulators
/// in turn; added (0 + 1) + (2 + 3), then the lanes by the fixed tree. The weights are their
/// exact values and the activation is not rounded: f32 sums only.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4(
    row: &[moek_ir::quant::BlockMxfp4],
    x: &[f32],
    segs: &[(usize, usize)],
    ahead: usize,
) -> f32 {
    let n = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
    assert!(row.len() >= n && x.len() >= n * 32);
    // SAFETY: the table is 16 bytes.
    let table = unsafe { _mm_loadu_si128(moek_ir::quant::MXFP4_STEPS.as_ptr().cast()) };
    let low = _mm_set1_epi8(0x0f);
    let step = |acc: &mut __m256, b: usize| {
        // SAFETY: `b < n`: the slices hold block `b`'s values (asserted); AVX2 is ours.
        unsafe {
            let blk = row.get_unchecked(b);
            crate::memory::prefetch((blk as *const _ as *const u8).wrapping_add(ahead));
            let qs = _mm_loadu_si128(blk.qs.as_ptr().cast());
            let lo = _mm_shuffle_epi8(table, _mm_and_si128(qs, low));
            let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(qs, 4), low));
            let w = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            let xs = x.as_ptr().add(b * 32);
            let mut s = _mm256_mul_ps(w(lo), _mm256_loadu_ps(xs));
            s = _mm256_fmadd_ps(w(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(xs.add(8)), s);
            s = _mm256_fmadd_ps(w(hi), _mm256_loadu_ps(xs.add(16)), s);
            s = _mm256_fmadd_ps(w(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(xs.add(24)), s);
            *acc = _mm256_fmadd_ps(_mm256_set1_ps(blk.scale()), s, *acc);
        }
    };
    sum_segments(segs, |s, e| {
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let full = s + (e - s) / CHAINS * CHAINS;
        for b in (s..full).step_by(CHAINS) {
            step(a0, b);
            step(a1, b + 1);
            step(a2, b + 2);
            step(a3, b + 3);
        }
        for (b, acc) in (full..e).zip([a0, a1, a2]) {
            step(acc, b);
        }
        add_chains(acc)
    })
}

/// [`sum_segments`] for Q4 blocks of `G` groups, the segments in groups (below, a "block" is a
/// group, scaled by the scale of the block it is in). Two blocks a step: their 16 bytes of
/// nibbles side by side in one register, so one mask gives both blocks' low nibbles (values
/// 0..16) and one shift and mask their high ones (16..32), each multiplied as stored (0..=15)
/// by the activation's matching halves ([`QuantizedActivation::low`],
/// [`QuantizedActivation::high`]: two blocks' halves are one 32-byte load) and added in i16 (at most 2 x 2 x 15 x 127). A block's 4 lanes then hold
/// its sums over values `4i..4i + 4` and `16 + 4i..16 + 4i + 4`, less the activation's
/// [`QuantizedActivation::offsets`] (what the nibbles' offset of 8 adds), scaled by both
/// blocks' scales (one conversion for the pair) and fused into one of [`CHAINS`] accumulators
/// in turn. A last odd block runs the same steps at half width. Against one block a step, about
/// half the instructions a block: no lane crossing and one scale conversion a pair.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4<const G: usize>(
    row: &[moek_ir::quant::BlockQ4<G>],
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
        (blk.qs.get_unchecked(b % G), blk.d)
    };
    let (low, high, offsets, xd) = (&x.low, &x.high, &x.offsets, &x.scales);
    let mask = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    // Blocks `b` and `b + 1` into `acc`, `d` their scales (`d_b` in lanes 0..4, `d_b+1` in 4..8).
    let pair = |acc: &mut __m256, b: usize, d: __m256| {
        // SAFETY: `b + 1 < n`: the slices hold both blocks' lanes (asserted); AVX2 is ours.
        unsafe {
            let (wa, wb) = (group(b).0, group(b + 1).0);
            crate::memory::prefetch((wa as *const _ as *const u8).wrapping_add(ahead));
            let packed = _mm256_loadu2_m128i(wb.as_ptr().cast(), wa.as_ptr().cast());
            let lo = _mm256_and_si256(packed, mask);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), mask);
            let xl = _mm256_loadu_si256(low.as_ptr().add(b * 16).cast());
            let xh = _mm256_loadu_si256(high.as_ptr().add(b * 16).cast());
            let dot = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
            let dot = _mm256_sub_epi32(
                _mm256_madd_epi16(dot, ones),
                _mm256_loadu_si256(offsets.as_ptr().add(b * 4).cast()),
            );
            *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot), *acc);
        }
    };
    // Both scales (weight's times activation's) of blocks `8k..8k + 8` from `b`: one conversion
    // for 8 scales, then one permute a pair spreads its two.
    let scales8 = |b: usize| {
        // SAFETY: `b + 8 <= n` (the callers' loop bounds).
        unsafe {
            let d = |i: usize| i32::from(group(b + i).1);
            let mut bits = _mm_cvtsi32_si128(d(0));
            bits = _mm_insert_epi16::<1>(bits, d(1));
            bits = _mm_insert_epi16::<2>(bits, d(2));
            bits = _mm_insert_epi16::<3>(bits, d(3));
            bits = _mm_insert_epi16::<4>(bits, d(4));
            bits = _mm_insert_epi16::<5>(bits, d(5));
            bits = _mm_insert_epi16::<6>(bits, d(6));
            bits = _mm_insert_epi16::<7>(bits, d(7));
            _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_loadu_ps(xd.as_ptr().add(b)))
        }
    };
    let spread = |d: __m256, first: i32| {
        let at = _mm256_setr_epi32(
            first,
            first,
            first,
            first,
            first + 1,
            first + 1,
            first + 1,
            first + 1,
        );
        _mm256_permutevar8x32_ps(d, at)
    };
    // The scales of the pair at `b` alone.
    let scales2 = |b: usize| {
        // SAFETY: `b + 1 < n` (the caller's loop bound).
        unsafe {
            let bits = i32::from(group(b).1) | (i32::from(group(b + 1).1) << 16);
            let d = _mm_mul_ps(
                _mm_cvtph_ps(_mm_cvtsi32_si128(bits)),
                _mm_castpd_ps(_mm_load_sd(xd.as_ptr().add(b).cast())),
            );
            spread(_mm256_castps128_ps256(d), 0)
        }
    };
    // Block `b` alone.
    let single = |b: usize| {
        // SAFETY: `b < n` (as above).
        unsafe {
            let (qs, d) = group(b);
            let packed = _mm_loadu_si128(qs.as_ptr().cast());
            let mask = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(packed, mask);
            let hi = _mm_and_si128(_mm_srli_epi16::<4>(packed), mask);
            let xl = _mm_loadu_si128(low.as_ptr().add(b * 16).cast());
            let xh = _mm_loadu_si128(high.as_ptr().add(b * 16).cast());
            let dot = _mm_add_epi16(_mm_maddubs_epi16(lo, xl), _mm_maddubs_epi16(hi, xh));
            let dot = _mm_sub_epi32(
                _mm_madd_epi16(dot, _mm_set1_epi16(1)),
                _mm_loadu_si128(offsets.as_ptr().add(b * 4).cast()),
            );
            let lanes = _mm_cvtepi32_ps(dot);
            let lanes = _mm_add_ps(lanes, _mm_movehl_ps(lanes, lanes));
            let lanes = _mm_add_ss(lanes, _mm_movehdup_ps(lanes));
            f16_bits_to_f32(d) * *xd.get_unchecked(b) * _mm_cvtss_f32(lanes)
        }
    };
    sum_segments(segs, |s, e| {
        let mut acc = [_mm256_setzero_ps(); CHAINS];
        let [a0, a1, a2, a3] = &mut acc;
        let step = 2 * CHAINS;
        let full = s + (e - s) / step * step;
        for b in (s..full).step_by(step) {
            let d = scales8(b);
            pair(a0, b, spread(d, 0));
            pair(a1, b + 2, spread(d, 2));
            pair(a2, b + 4, spread(d, 4));
            pair(a3, b + 6, spread(d, 6));
        }
        // The last 0..=3 pairs, each into its own chain (fixed registers, no indexing).
        let pairs_end = full + (e - full) / 2 * 2;
        for (b, acc) in (full..pairs_end).step_by(2).zip([a0, a1, a2]) {
            pair(acc, b, scales2(b));
        }
        let sum = add_chains(acc);
        if pairs_end < e {
            _mm256_add_ps(
                sum,
                _mm256_setr_ps(single(pairs_end), 0., 0., 0., 0., 0., 0., 0.),
            )
        } else {
            sum
        }
    })
}

/// An f16's bits as f32 (F16C).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_bits_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// Values `at..at + dst.len()` of `b` (whole blocks), exactly, into `dst`. A block's scale is
/// broadcast once and its integers or e2m1 codes widened 8 at a time (an e2m1 code's magnitude
/// from a `vpermps` of the table's first half, its sign from bit 3).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequantize<W: Element>(b: &[W], at: usize, dst: &mut [f32]) {
    use moek_ir::quant::{E2M1, E8M0_POWERS, GROUP};
    use moek_ir::{BlockFormat, Kind as Stored};
    let v = W::VALUES;
    let blocks = &b[at / v..(at + dst.len()) / v];
    let bytes: &[u8] = bytemuck::cast_slice(blocks);
    let out = dst.as_mut_ptr();
    // SAFETY: `dst` holds `v` values a block, 8 at a time.
    let put = |i: usize, x: __m256| unsafe { _mm256_storeu_ps(out.add(i), x) };
    let low = _mm_set1_epi8(0x0f);
    // A group's 16 nibble bytes as its values `0..16` and `16..32`, each in two halves of 8.
    let halves = |q: __m128i| {
        let (lo, hi) = (
            _mm_and_si128(q, low),
            _mm_and_si128(_mm_srli_epi16(q, 4), low),
        );
        [lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)]
    };
    // SAFETY: E2M1 holds 16 values; its second half is the first negated.
    let magnitudes = unsafe { _mm256_loadu_ps(E2M1.as_ptr()) };
    for (i, blk) in bytes.chunks_exact(std::mem::size_of::<W>()).enumerate() {
        let (p, o) = (blk.as_ptr(), i * v);
        // SAFETY: a block of `W` is its scale then its groups' bytes (`repr(C)`,
        // moek_ir::quant), `size_of::<W>()` bytes: every load below is inside `blk`.
        unsafe {
            match W::KIND {
                Stored::Plain(d) => unreachable!("{d} is not a block format"),
                Stored::Blocks(BlockFormat::Q8_0) => {
                    let d = _mm256_set1_ps(f16_bits_to_f32(p.cast::<u16>().read_unaligned()));
                    for h in 0..v / 8 {
                        let q = _mm_loadl_epi64(p.add(2 + 8 * h).cast::<__m128i>());
                        put(
                            o + 8 * h,
                            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))),
                        );
                    }
                }
                Stored::Blocks(BlockFormat::Q4_0) => {
                    let d = _mm256_set1_ps(f16_bits_to_f32(p.cast::<u16>().read_unaligned()));
                    let eight = _mm256_set1_epi32(8);
                    for g in 0..v / GROUP {
                        let q = _mm_loadu_si128(p.add(2 + 16 * g).cast::<__m128i>());
                        for (h, n) in halves(q).into_iter().enumerate() {
                            let s = _mm256_sub_epi32(_mm256_cvtepu8_epi32(n), eight);
                            put(
                                o + GROUP * g + 8 * h,
                                _mm256_mul_ps(d, _mm256_cvtepi32_ps(s)),
                            );
                        }
                    }
                }
                Stored::Blocks(BlockFormat::Mxfp4) => {
                    let d = _mm256_set1_ps(E8M0_POWERS[usize::from(*p)]);
                    let q = _mm_loadu_si128(p.add(1).cast::<__m128i>());
                    for (h, n) in halves(q).into_iter().enumerate() {
                        let code = _mm256_cvtepu8_epi32(n);
                        let sign =
                            _mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(8)), 28);
                        let x = _mm256_permutevar8x32_ps(magnitudes, code);
                        put(
                            o + 8 * h,
                            _mm256_mul_ps(d, _mm256_xor_ps(x, _mm256_castsi256_ps(sign))),
                        );
                    }
                }
            }
        }
    }
}

/// GEMM `c += a . b^T` as f32 FMA tiles over widened operands (see [`crate::gemm`]).
pub(crate) mod gemm {
    use super::*;
    use crate::gemm::{Ahead, Fetch, MC, aligned, tile_rows};

    /// Rows of `a` per register tile.
    const MR: usize = 4;
    /// Rows of `b` per register tile: 4 x 3 = 12 accumulators and three weight vectors of the
    /// 16 registers (activation loads fold into the multiply-adds).
    const NR: usize = 3;
    /// Reduction steps per widened chunk of a weight panel (3 rows x 4 KiB stay in L1).
    const KC: usize = 1024;
    /// Panel row stride: KC plus one cache line, so the rows do not alias 4 KiB apart.
    const PANEL_LD: usize = KC + 16;

    type Acc = [[__m256; NR]; MR];

    thread_local! {
        /// Per-thread widened operands, reused across calls (no page faults per expert).
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
            const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }

    /// Shapes were checked by [`crate::gemm::gemm_nt`] (or [`crate::quant::gemm_blocks`]):
    /// `b` plain (then of `a`'s type) or in blocks, dequantized exactly as its chunks are
    /// widened ([`dequantize`]); `ldb` and `k` count values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn gemm<A: Element, W: Element>(
        a: &[A],
        lda: usize,
        b: &[W],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
    ) {
        SCRATCH.with_borrow_mut(|(a32, panel)| {
            // Blocks of MC rows of `a`, each against all of `b`: every output is still one sum
            // over the whole reduction, in the same order.
            for m0 in (0..m).step_by(MC) {
                let (a, c, m) = (&a[m0 * lda..], &mut c[m0 * ldc..], MC.min(m - m0));
                // SAFETY: forwarded from the caller, for rows m0.. of `a` and `c`.
                unsafe {
                    match kind_code::<A>() {
                        F32 => gemm_in::<F32, _, _>(a, lda, b, ldb, c, ldc, m, n, k, a32, panel),
                        F16 => gemm_in::<F16, _, _>(a, lda, b, ldb, c, ldc, m, n, k, a32, panel),
                        _ => gemm_in::<BF16, _, _>(a, lda, b, ldb, c, ldc, m, n, k, a32, panel),
                    }
                }
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn gemm_in<const K: u8, A: Element, W: Element>(
        a: &[A],
        lda: usize,
        b: &[W],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
        a32: &mut Vec<f32>,
        panel: &mut Vec<f32>,
    ) {
        let k8 = k.next_multiple_of(LANES);
        // Activations widened once, rows padded with zeros to whole steps, on a cache line.
        let a32 = aligned(a32, m * k8);
        for i in 0..m {
            let row = &mut a32[i * k8..(i + 1) * k8];
            row[k..].fill(0.0);
            // SAFETY: row i of `a` holds `k` elements (checked by the caller).
            unsafe { widen::<K>(a.as_ptr().add(i * lda).cast(), k, &mut row[..k]) };
        }
        let tiles = m.div_ceil(MR);
        let mut acc: Vec<Acc> = vec![[[_mm256_setzero_ps(); NR]; MR]; tiles];
        let panel = aligned(panel, NR * PANEL_LD);
        let size = size_of_kind(K);
        for j0 in (0..n).step_by(NR) {
            let nj = NR.min(n - j0);
            let brows = tile_rows::<NR>(ldb, j0, nj);
            let next = (j0 + NR < n).then(|| tile_rows::<NR>(ldb, j0 + NR, NR.min(n - j0 - NR)));
            acc.iter_mut()
                .for_each(|t| *t = [[_mm256_setzero_ps(); NR]; MR]);
            for kc in (0..k).step_by(KC) {
                let len = KC.min(k - kc);
                let steps = len.next_multiple_of(LANES);
                for (r, &off) in brows.iter().enumerate() {
                    let dst = &mut panel[r * PANEL_LD..r * PANEL_LD + steps];
                    dst[len..].fill(0.0);
                    if W::VALUES > 1 {
                        // SAFETY: row `j0 + r` of `b` holds `k` values from `off`.
                        unsafe { dequantize(b, off + kc, &mut dst[..len]) };
                        continue;
                    }
                    // SAFETY: row `j0 + r` of `b` (plain: of `a`'s kind `K`) holds `k` elements
                    // from `off`.
                    unsafe {
                        let base = b.as_ptr().cast::<u8>();
                        widen::<K>(base.add((off + kc) * size), len, &mut dst[..len]);
                    }
                }
                for (t, tile_acc) in acc.iter_mut().enumerate() {
                    let ahead = next.map(|nx| Ahead::share(b, nx, (kc, len), (t, tiles)));
                    let arows = tile_rows::<MR>(k8, t * MR, MR.min(m - t * MR));
                    // SAFETY: a32 rows hold k8 >= kc + steps elements; panel rows hold KC.
                    unsafe {
                        fma_tile(
                            arows.map(|o| a32.as_ptr().add(o + kc)),
                            std::array::from_fn(|r| panel.as_ptr().add(r * PANEL_LD)),
                            steps,
                            tile_acc,
                            ahead,
                        )
                    };
                }
            }
            for (t, tile_acc) in acc.iter().enumerate() {
                let (i0, mi) = (t * MR, MR.min(m - t * MR));
                for ti in 0..mi {
                    let crow = &mut c[(i0 + ti) * ldc + j0..][..nj];
                    for tj in 0..nj {
                        crow[tj] += reduce(tile_acc[ti][tj]);
                    }
                }
            }
        }
    }

    /// `dst[i] = src[i] as f32` for `len` elements of kind `K`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen<const K: u8>(src: *const u8, len: usize, dst: &mut [f32]) {
        let size = size_of_kind(K);
        let full = len / LANES * LANES;
        let d = dst.as_mut_ptr();
        // SAFETY: `len` elements remain at `src`; `dst` holds `len`.
        unsafe {
            for i in (0..full).step_by(LANES) {
                _mm256_storeu_ps(d.add(i), load8::<K>(src.add(size * i)));
            }
            if full < len {
                let v: [f32; LANES] =
                    std::mem::transmute(load_part::<K>(src.add(size * full), len - full));
                dst[full..].copy_from_slice(&v[..len - full]);
            }
        }
    }

    /// `steps` (a multiple of 8) f32 steps of a 4 x 3 tile, fetching `ahead` as it goes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_tile(
        a: [*const f32; MR],
        b: [*const f32; NR],
        steps: usize,
        acc_io: &mut Acc,
        ahead: Option<Ahead<NR>>,
    ) {
        let mut acc = *acc_io;
        let mut fetch = Fetch::new(ahead, steps / LANES);
        let mut p = 0;
        while p < steps {
            fetch.step();
            // SAFETY: every row holds `steps` elements.
            unsafe {
                let bv: [__m256; NR] = b.map(|r| _mm256_loadu_ps(r.add(p)));
                for i in 0..MR {
                    let av = _mm256_loadu_ps(a[i].add(p));
                    for j in 0..NR {
                        acc[i][j] = _mm256_fmadd_ps(av, bv[j], acc[i][j]);
                    }
                }
            }
            p += LANES;
        }
        fetch.rest();
        *acc_io = acc;
    }
}
