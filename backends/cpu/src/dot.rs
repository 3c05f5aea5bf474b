//! Dot products with f32 accumulation: one row, four rows against one shared vector, or the rows
//! of a matrix streamed one after another ([`dot_rows`]).
//!
//! Summation order is fixed by the code (lanes, then a fixed tree), so a result depends only on
//! the inputs and the ISA in use, never on threads or timing.

use crate::element::{Kind, bits16, kind};
use crate::isa::{Isa, isa};
use moek_ir::Element;

/// `sum_i a[i] * b[i]` in f32. Panics when the lengths differ.
pub fn dot<W: Element>(a: &[W], b: &[W]) -> f32 {
    dotn::<W, W, 1>(a, [b])[0]
}

/// The dot products of `x` with four rows at once (x is read once for all four).
pub fn dot4<W: Element>(x: &[W], rows: [&[W]; 4]) -> [f32; 4] {
    dotn::<W, W, 4>(x, rows)
}

/// `sum_i a[i] * w[i]` for f32 activations against stored weights.
pub fn dot_f32_w<W: Element>(a: &[f32], w: &[W]) -> f32 {
    dotn::<f32, W, 1>(a, [w])[0]
}

/// How far ahead of the row being read [`dot_rows`] prefetches, in bytes. A hardware prefetcher
/// alone keeps too few lines in flight for one core's stream (a product read one row at a time
/// without it reaches about half the read bandwidth); 8-16 KiB ahead measured best on the
/// project's machines, and any distance gives the same sums.
pub const PREFETCH_AHEAD: usize = 16 << 10;

/// How far ahead the row products of quantized blocks prefetch, in bytes: each step prefetches
/// every line of its span ([`crate::memory::prefetch_span`]), and with every line covered a
/// shorter distance streams better (Q4_0 rows of the LM head on an Intel Xeon: 2 KiB 70-77% of
/// the probe, 1 KiB 72-73%, 4 KiB 54-72%, 16 KiB less again; docs/performance.md).
pub const BLOCKS_AHEAD: usize = 2 << 10;

/// For each row `j` of `rows`, `store(j, sum over segs (in order) of x[seg] . mat[j*ld + seg])`.
///
/// Rows are read one at a time in address order, the stream prefetched [`PREFETCH_AHEAD`] bytes
/// ahead: the memory sees one sequential read per core, which streams faster than several rows
/// read side by side (on the AMD Zen 5 machines, 48 against 38 GB/s). The prefetch runs on past
/// `rows` to the end of `mat`, so a caller that passes the whole matrix and then reads the rows
/// after `rows` (gate then up, one column block then the next) finds them on their way. Each
/// row's sum is the one [`dot4`] gives for it, bit for bit.
pub fn dot_rows<A: Element, W: Element>(
    x: &[A],
    mat: &[W],
    ld: usize,
    rows: std::ops::Range<usize>,
    segs: &[(usize, usize)],
    mut store: impl FnMut(usize, f32),
) {
    let k = x.len();
    let ahead = PREFETCH_AHEAD / std::mem::size_of::<W>();
    // The last place a row of `k` elements fits: prefetches stop there, inside `mat`.
    let last = mat.len().saturating_sub(k);
    for j in rows {
        let at = j * ld;
        let next = (at + ahead).min(last);
        let sum =
            dotn_segments::<A, W, 1>(x, [&mat[at..at + k]], segs, Some([&mat[next..next + k]]));
        store(j, sum[0]);
    }
}

/// `NR` dot products of `a` with `rows`, on the ISA in use.
pub(crate) fn dotn<A: Element, B: Element, const NR: usize>(
    a: &[A],
    rows: [&[B]; NR],
) -> [f32; NR] {
    dotn_segments(a, rows, &[(0, a.len())], None)
}

/// For each row, `sum over segs (in order) of a[seg] . row[seg]`: each segment's dot product is
/// complete (reduced to one number) before it is added to the running sum, in one call.
///
/// `next`, when given, are what the caller reads later: they are prefetched alongside, one cache
/// line per row per step, so a matrix streamed from memory arrives before it is needed.
pub fn dotn_segments<A: Element, B: Element, const NR: usize>(
    a: &[A],
    rows: [&[B]; NR],
    segs: &[(usize, usize)],
    next: Option<[&[B]; NR]>,
) -> [f32; NR] {
    for r in &rows {
        assert_eq!(
            r.len(),
            a.len(),
            "dot product of slices of different lengths"
        );
    }
    for &(s, e) in segs {
        assert!(
            s <= e && e <= a.len(),
            "segment {s}..{e} outside 0..{}",
            a.len()
        );
    }
    for r in next.iter().flatten() {
        assert!(
            r.len() >= a.len(),
            "prefetched rows shorter than the vector"
        );
    }
    match isa() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => avx512::dotn(a, rows, segs, next),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::avx2::dotn(a, rows, segs, next),
        _ => portable::dotn(a, rows, segs),
    }
}

pub(crate) mod portable {
    use super::*;

    const LANES: usize = 16;

    /// Plain Rust the compiler vectorises: 16 lanes per row, then a fixed pairwise tree.
    pub fn dotn<A: Element, B: Element, const NR: usize>(
        a: &[A],
        rows: [&[B]; NR],
        segs: &[(usize, usize)],
    ) -> [f32; NR] {
        let mut sum = [0f32; NR];
        for &(s, e) in segs {
            let mut acc = [[0f32; LANES]; NR];
            let mut start = s;
            while start < e {
                let len = LANES.min(e - start);
                let mut xa = [0f32; LANES];
                for i in 0..len {
                    xa[i] = a[start + i].to_f32();
                }
                for r in 0..NR {
                    let row = &rows[r][start..start + len];
                    for i in 0..len {
                        acc[r][i] += xa[i] * row[i].to_f32();
                    }
                }
                start += len;
            }
            for r in 0..NR {
                sum[r] += tree_sum(acc[r]);
            }
        }
        sum
    }

    /// Pairwise sum of 16 lanes in a fixed order.
    fn tree_sum(mut v: [f32; LANES]) -> f32 {
        let mut width = LANES / 2;
        while width > 0 {
            for i in 0..width {
                v[i] += v[i + width];
            }
            width /= 2;
        }
        v[0]
    }
}

/// For one row, `sum over segs (in order)` of each segment's vector (`segment(s, e)`: its
/// chains added) reduced to a number (`reduce`), as [`dotn_segments`] sums plain rows. Four
/// segments' vectors are made before any is reduced: a reduction is a chain of dependent adds,
/// and made one after another they overlap instead of each holding up the next segment's loads.
/// Inlined into each level's kernels, which give the vector type and its reduction.
#[inline(always)]
pub(crate) fn sum_segment_vectors<V: Copy>(
    segs: &[(usize, usize)],
    zero: V,
    mut segment: impl FnMut(usize, usize) -> V,
    reduce: impl Fn(V) -> f32,
) -> f32 {
    let mut sum = 0f32;
    for batch in segs.chunks(4) {
        let mut v = [zero; 4];
        for (v, &(s, e)) in v.iter_mut().zip(batch) {
            *v = segment(s, e);
        }
        for &v in &v[..batch.len()] {
            sum += reduce(v);
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    pub(crate) const F32: u8 = 0;
    pub(crate) const F16: u8 = 1;
    pub(crate) const BF16: u8 = 2;

    /// Dispatches on the element kinds to a kernel compiled for AVX-512.
    pub fn dotn<A: Element, B: Element, const NR: usize>(
        a: &[A],
        rows: [&[B]; NR],
        segs: &[(usize, usize)],
        next: Option<[&[B]; NR]>,
    ) -> [f32; NR] {
        let rp = rows.map(|s: &[B]| s.as_ptr().cast::<u8>());
        let np = next.map(|n| n.map(|s: &[B]| s.as_ptr().cast::<u8>()));
        let ap = a.as_ptr().cast::<u8>();
        // SAFETY: `isa()` checked the CPU features; rows and segments are in bounds (checked by
        // the caller).
        unsafe {
            match (kind::<A>(), kind::<B>()) {
                (Kind::Bf16, Kind::Bf16) if crate::isa::has_avx512_bf16() => bf16_dotn::<NR>(
                    bits16(a).as_ptr(),
                    rows.map(|r| bits16(r).as_ptr()),
                    segs,
                    np,
                ),
                (Kind::F16, Kind::F16) => fma_dotn::<F16, F16, NR>(ap, rp, segs, np),
                (Kind::F32, Kind::F32) => fma_dotn::<F32, F32, NR>(ap, rp, segs, np),
                (Kind::F32, Kind::F16) => fma_dotn::<F32, F16, NR>(ap, rp, segs, np),
                (Kind::F32, Kind::Bf16) => fma_dotn::<F32, BF16, NR>(ap, rp, segs, np),
                (Kind::Bf16, Kind::Bf16) => fma_dotn::<BF16, BF16, NR>(ap, rp, segs, np),
                _ => portable::dotn(a, rows, segs),
            }
        }
    }

    /// A mask of the first `n` (<= 16) lanes.
    #[inline]
    pub(crate) fn mask16(n: usize) -> __mmask16 {
        if n >= 16 {
            0xFFFF
        } else {
            ((1u32 << n) - 1) as u16
        }
    }

    /// Loads `n` (<= 16) elements of kind `K` as 16 f32 lanes, zero beyond `n`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) unsafe fn load16<const K: u8>(p: *const u8, n: usize) -> __m512 {
        let m = mask16(n);
        // SAFETY: the caller guarantees `n` readable elements at `p`; masked lanes are not read.
        unsafe {
            match K {
                F32 => _mm512_maskz_loadu_ps(m, p.cast::<f32>()),
                F16 => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast::<i16>())),
                _ => {
                    let w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p.cast::<i16>()));
                    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
                }
            }
        }
    }

    pub(crate) const fn size_of_kind(k: u8) -> usize {
        if k == F32 { 4 } else { 2 }
    }

    /// The value of a block's 32 that lane `i` of [`dot_mxfp4`]'s low (`i < 16`) or high
    /// (`i >= 16`) half holds: byte `4 (i % 4) + i / 4`'s nibble.
    const fn mxfp4_lane_value(i: usize) -> usize {
        (i / 16) * 16 + 4 * (i % 4) + (i % 16) / 4
    }

    /// `x` (whole blocks of 32) reordered into [`dot_mxfp4`]'s lanes, into `lanes`: once per
    /// product, shared by every row. A block's 32 values fill two cache lines (the buffer
    /// starts on one: a load that splits two lines costs two). One permute a half block.
    #[target_feature(enable = "avx512f")]
    pub(crate) fn mxfp4_lane_order(x: &[f32], lanes: &mut crate::memory::Lines<f32>) {
        const AT: [i32; 16] = {
            let mut at = [0; 16];
            let mut i = 0;
            while i < 16 {
                at[i] = mxfp4_lane_value(i) as i32;
                i += 1;
            }
            at
        };
        // SAFETY: `AT` is 16 i32s.
        let at = unsafe { _mm512_loadu_si512(AT.as_ptr().cast()) };
        let whole = x.len() / 32 * 32;
        lanes.clear();
        lanes.resize(whole, 0.0);
        for (half, to) in x[..whole].chunks_exact(16).zip(lanes.chunks_exact_mut(16)) {
            // SAFETY: both halves are 16 f32s.
            unsafe {
                let v = _mm512_loadu_ps(half.as_ptr());
                _mm512_storeu_ps(to.as_mut_ptr(), _mm512_permutexvar_ps(at, v));
            }
        }
    }

    /// [`crate::avx2::dot_mxfp4`] on AVX-512 against an activation in lane order
    /// ([`mxfp4_lane_order`]): per block, its 16 bytes broadcast to the four 128-bit lanes (a
    /// load, no shuffle) and shifted per 32-bit lane (`vpsrlvd`) so that lane `i`'s low four
    /// bits are value [`mxfp4_lane_value`]`(i)`'s nibble, which indexes the e2m1 values in one
    /// register (`vpermps` reads four index bits: exact f32s); a shift by four more gives the
    /// high half. Two FMAs against the activation make the block's sum, scaled by its
    /// `2^(e - 127)` (a broadcast from [`moek_ir::quant::E8M0_POWERS`]) into one of [`CHAINS`]
    /// accumulators in turn; added (0 + 1) + (2 + 3), then the lanes. Two shuffles a block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(crate) unsafe fn dot_mxfp4(
        row: &[moek_ir::quant::BlockMxfp4],
        x: &crate::memory::Lines<f32>,
        segs: &[(usize, usize)],
        ahead: usize,
    ) -> f32 {
        let n = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
        assert!(row.len() >= n && x.len() >= n * 32);
        // SAFETY: the table is 16 f32s.
        let table = unsafe { _mm512_loadu_ps(moek_ir::quant::E2M1.as_ptr()) };
        let low_shift = _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24);
        let high_shift = _mm512_add_epi32(low_shift, _mm512_set1_epi32(4));
        let powers = &moek_ir::quant::E8M0_POWERS;
        let step = |acc: &mut __m512, b: usize| {
            // SAFETY: `b < n`: the slices hold block `b`'s values (asserted); AVX-512 is ours.
            unsafe {
                let blk = row.get_unchecked(b);
                let bytes = _mm512_broadcast_i32x4(_mm_loadu_si128(blk.qs.as_ptr().cast()));
                let lo = _mm512_srlv_epi32(bytes, low_shift);
                let hi = _mm512_srlv_epi32(bytes, high_shift);
                let xs = x.as_ptr().add(32 * b);
                let s = _mm512_mul_ps(_mm512_permutexvar_ps(lo, table), _mm512_load_ps(xs));
                let s = _mm512_fmadd_ps(
                    _mm512_permutexvar_ps(hi, table),
                    _mm512_load_ps(xs.add(16)),
                    s,
                );
                let power = *powers.get_unchecked(usize::from(blk.e));
                *acc = _mm512_fmadd_ps(_mm512_set1_ps(power), s, *acc);
            }
        };
        sum_segment_vectors(segs, |s, e| {
            let mut acc = [_mm512_setzero_ps(); CHAINS];
            let [a0, a1, a2, a3] = &mut acc;
            let full = s + (e - s) / CHAINS * CHAINS;
            for b in (s..full).step_by(CHAINS) {
                // The four blocks' 68 bytes, a prefetch a line rather than one a block.
                crate::memory::prefetch_span(
                    row.as_ptr()
                        .wrapping_add(b)
                        .cast::<u8>()
                        .wrapping_add(ahead),
                    CHAINS * size_of::<moek_ir::quant::BlockMxfp4>(),
                );
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

    /// Accumulator chains per row: consecutive steps go to chains 0, 1, 2, 3 in turn, so a row
    /// read alone is not held to one multiply-add's latency per step (which is slower than the
    /// memory delivers it). The chains are added (0 + 1) + (2 + 3), then the lanes by a fixed tree.
    pub(crate) const CHAINS: usize = 4;

    /// The chains of one row reduced to a number, in the fixed order of [`CHAINS`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn reduce_chains(c: [__m512; CHAINS]) -> f32 {
        reduce_lanes(add_chains(c))
    }

    /// [`super::sum_segment_vectors`] for 512-bit vectors.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn sum_segment_vectors(
        segs: &[(usize, usize)],
        segment: impl FnMut(usize, usize) -> __m512,
    ) -> f32 {
        super::sum_segment_vectors(segs, _mm512_setzero_ps(), segment, |v| reduce_lanes(v))
    }

    /// The 16 lanes added by a fixed tree.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn reduce_lanes(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// A row's chains added, (0 + 1) + (2 + 3).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) fn add_chains(c: [__m512; CHAINS]) -> __m512 {
        _mm512_add_ps(_mm512_add_ps(c[0], c[1]), _mm512_add_ps(c[2], c[3]))
    }

    /// Runs `$step(start, len, chain)` over `s..e` in steps of `$w` elements: whole rounds of
    /// [`CHAINS`] steps, then one round of partial steps (empty ones skipped).
    macro_rules! chained_steps {
        ($s:expr, $e:expr, $w:expr, $step:ident) => {{
            let (mut i, e) = ($s, $e);
            while i + $w * CHAINS <= e {
                for c in 0..CHAINS {
                    $step!(i + $w * c, $w, c);
                }
                i += $w * CHAINS;
            }
            for c in 0..CHAINS {
                let start = i + $w * c;
                if start < e {
                    $step!(start, $w.min(e - start), c);
                }
            }
        }};
    }

    /// Convert-and-FMA kernel, 16 lanes per step.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn fma_dotn<const KA: u8, const KB: u8, const NR: usize>(
        a: *const u8,
        rows: [*const u8; NR],
        segs: &[(usize, usize)],
        next: Option<[*const u8; NR]>,
    ) -> [f32; NR] {
        let (sa, sb) = (size_of_kind(KA), size_of_kind(KB));
        let mut sum = [0f32; NR];
        for &(s, e) in segs {
            let mut acc = [[_mm512_setzero_ps(); CHAINS]; NR];
            macro_rules! step {
                ($i:expr, $len:expr, $c:expr) => {
                    // SAFETY: `len` elements remain in `a` and every row from element `i`.
                    unsafe {
                        let (i, len) = ($i, $len);
                        if let Some(next) = next {
                            for r in next {
                                _mm_prefetch::<_MM_HINT_T0>(r.add(i * sb).cast::<i8>());
                            }
                        }
                        let x = load16::<KA>(a.add(i * sa), len);
                        for r in 0..NR {
                            let w = load16::<KB>(rows[r].add(i * sb), len);
                            acc[r][$c] = _mm512_fmadd_ps(x, w, acc[r][$c]);
                        }
                    }
                };
            }
            chained_steps!(s, e, 16, step);
            for r in 0..NR {
                sum[r] += reduce_chains(acc[r]);
            }
        }
        sum
    }

    /// BF16 kernel: `vdpbf16ps` multiplies 32 bf16 pairs into 16 f32 lanes per instruction.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn bf16_dotn<const NR: usize>(
        a: *const u16,
        rows: [*const u16; NR],
        segs: &[(usize, usize)],
        next: Option<[*const u8; NR]>,
    ) -> [f32; NR] {
        let mut sum = [0f32; NR];
        for &(s, e) in segs {
            let mut acc = [[_mm512_setzero_ps(); CHAINS]; NR];
            macro_rules! step {
                ($i:expr, $len:expr, $c:expr) => {
                    // SAFETY: `len` elements remain from `i`; masked lanes are not read.
                    unsafe {
                        let (i, len): (usize, usize) = ($i, $len);
                        let m: __mmask32 = if len >= 32 {
                            u32::MAX
                        } else {
                            (1u32 << len) - 1
                        };
                        if let Some(next) = next {
                            for r in next {
                                _mm_prefetch::<_MM_HINT_T0>(r.add(2 * i).cast::<i8>());
                            }
                        }
                        let x: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(
                            m,
                            a.add(i).cast::<i16>(),
                        ));
                        for r in 0..NR {
                            let w: __m512bh = std::mem::transmute(_mm512_maskz_loadu_epi16(
                                m,
                                rows[r].add(i).cast::<i16>(),
                            ));
                            acc[r][$c] = _mm512_dpbf16_ps(acc[r][$c], x, w);
                        }
                    }
                };
            }
            chained_steps!(s, e, 32usize, step);
            for r in 0..NR {
                sum[r] += reduce_chains(acc[r]);
            }
        }
        sum
    }
}
