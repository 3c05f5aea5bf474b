//! GEMM over Q8_0 and Q4_0 blocks in integer dot products, for prefill: the counterpart of the
//! row products ([`crate::vnni`], [`crate::avx2`]), with the same numbers.
//!
//! Each activation row is quantized to 8 bits per group of 32 as decode does
//! ([`crate::QuantizedActivation`]): once a call, or once for many calls ([`QuantizedRows`],
//! what [`crate::quant::GemmRows`] keeps for an MoE layer's tokens). Each weight row's groups
//! are then multiplied exactly in 32-bit integers. What makes it a GEMM is the layout: a panel of weight rows (16 on AVX-512,
//! 8 on AVX2: one a 32-bit lane) is repacked so that lane `r` of step `q` holds values
//! `4q..4q + 4` of row `r`'s group, and one multiply against four activation bytes broadcast to
//! every lane adds four products to each row's sum. A group is eight such steps, and the
//! panel's eight registers serve every token in turn. The weights enter as unsigned bytes
//! (Q4_0's nibbles as stored, Q8_0's bytes plus 128 by a flipped sign bit); each group's
//! integer sum starts at minus that bias times the activation group's sum, so it ends exact.
//! It is then converted, scaled by the activation group's scale and the rows' block scales,
//! and added in f32.
//!
//! - AVX-512 VNNI: a step is one `vpdpbusd`, Q8_0 and Q4_0.
//! - AVX2: a step is one `vpmaddubsw` (unsigned by signed bytes into 16-bit pair sums, which
//!   saturate past 32767). Q4_0's nibbles stay far below that: a pair is at most 2 x 15 x 127
//!   = 3810, so a group's eight steps add in 16 bits (30480 at most) before one `vpmaddwd`
//!   widens them. Q8_0's biased bytes would not (2 x 255 x 127), so Q8_0 keeps the f32 tile.
//!
//! Beside the float tiles over dequantized panels this rounds the activation to 8 bits (as the
//! row products do), and skips dequantizing: docs/performance.md has the A/B.

use crate::element::{Kind, kind};
use crate::isa::Isa;
use crate::quant::group_scale;
use moek_ir::quant::GROUP;
use moek_ir::{BlockFormat, Element};
use std::arch::x86_64::*;
use std::cell::RefCell;
use std::ops::Range;

/// Four-byte steps in a group of 32.
const STEPS: usize = GROUP / 4;
/// Bytes of a block's f16 scale, before its groups.
const SCALE_BYTES: usize = 2;

/// How the weight bytes of one block format enter the multiply.
#[derive(Clone, Copy, Debug)]
struct Layout {
    /// Bytes of one group in a block (after the block's f16 scale).
    group_bytes: usize,
    /// What is added to a weight's step to make it unsigned: 8 for Q4_0's nibbles (stored
    /// so), 128 for Q8_0's bytes (added by flipping the sign bit).
    bias: i32,
}

/// The layout of `format`, if this GEMM multiplies it.
fn layout(format: BlockFormat) -> Option<Layout> {
    match format {
        BlockFormat::Q8_0 => Some(Layout {
            group_bytes: GROUP,
            bias: 128,
        }),
        BlockFormat::Q4_0 => Some(Layout {
            group_bytes: GROUP / 2,
            bias: 8,
        }),
        BlockFormat::Mxfp4 => None,
    }
}

/// Whether [`gemm`] multiplies `format`'s blocks at `level`.
pub(crate) fn multiplies(level: Isa, format: BlockFormat) -> bool {
    match level {
        Isa::Avx512 => layout(format).is_some(),
        Isa::Avx2 => format == BlockFormat::Q4_0,
        Isa::Amx | Isa::Portable => false,
    }
}

/// Activation rows quantized to 8 bits per group of 32, once for every integer GEMM they enter:
/// an MoE layer's tokens serve gate and up and every expert each routes to
/// ([`GemmRows`](crate::GemmRows)). Rows past the real ones (a tile's padding) are zeros.
#[derive(Debug, Default)]
pub(crate) struct QuantizedRows {
    /// Values a row (whole groups).
    k: usize,
    /// Row after row, `k` values each.
    values: Vec<i8>,
    /// Per row and group, the activation's scale.
    scales: Vec<f32>,
    /// Per row and group, the sum of its quantized values: a weight bias `b` makes the group's
    /// integer sum start at `-b` times it.
    sums: Vec<i32>,
}

impl QuantizedRows {
    /// Rows `0..m` of `a` (`lda` apart, `k` values each) quantized at `level`, one of those
    /// [`multiplies`] names, rows in parallel.
    pub(crate) fn new<A: Element>(level: Isa, a: &[A], lda: usize, m: usize, k: usize) -> Self {
        use rayon::prelude::*;
        assert!(
            m == 0 || a.len() >= (m - 1) * lda + k,
            "{m} rows of {k} values"
        );
        let mut rows = Self::default();
        // Padded to whole tiles of every level, so a product over all of them reads them as
        // they are.
        let groups = rows.resize(m, k, Avx512::TOKENS.max(Avx2::TOKENS));
        let each = rows.values.par_chunks_mut(k.max(1));
        let each = each.zip(rows.scales.par_chunks_mut(groups.max(1)));
        let each = each.zip(rows.sums.par_chunks_mut(groups.max(1)));
        each.take(m)
            .enumerate()
            .for_each(|(i, ((values, scales), sums))| {
                let row = &a[i * lda..][..k];
                // SAFETY: `level` is this process's (the caller's check); the slices are one row's.
                unsafe {
                    match level {
                        Isa::Avx512 => quantize_row::<Avx512, A>(row, values, scales, sums),
                        Isa::Avx2 => quantize_row::<Avx2, A>(row, values, scales, sums),
                        other => unreachable!("no integer GEMM on {}", other.name()),
                    }
                }
            });
        rows
    }

    /// Rows `0..m` of `a` quantized into `self`, padded with zero rows to a multiple of `pad`.
    ///
    /// # Safety
    /// The level's features are present; `a` holds the rows.
    unsafe fn quantize<L: Level, A: Element>(
        &mut self,
        a: &[A],
        lda: usize,
        m: usize,
        k: usize,
        pad: usize,
    ) {
        let groups = self.resize(m, k, pad);
        let each = self.values.chunks_exact_mut(k.max(1));
        let each = each.zip(self.scales.chunks_exact_mut(groups.max(1)));
        let each = each.zip(self.sums.chunks_exact_mut(groups.max(1)));
        for (i, ((values, scales), sums)) in each.take(m).enumerate() {
            // SAFETY: forwarded.
            unsafe { quantize_row::<L, A>(&a[i * lda..][..k], values, scales, sums) };
        }
    }

    /// Groups `groups` of rows `ids` of `from` copied into `self`, in that order, padded as
    /// [`Self::quantize`]: a segment's values packed, as [`Self::quantize`] would have made
    /// them from the segment alone (the tile reads each token's groups close together).
    fn gather(&mut self, from: &QuantizedRows, ids: &[usize], groups: Range<usize>, pad: usize) {
        let (k, n) = (groups.len() * GROUP, groups.len());
        let (ng, at) = (from.k / GROUP, groups.start);
        self.resize(ids.len(), k, pad);
        for (i, &r) in ids.iter().enumerate() {
            let values = &from.values[r * from.k + at * GROUP..][..k];
            self.values[i * k..][..k].copy_from_slice(values);
            self.scales[i * n..][..n].copy_from_slice(&from.scales[r * ng + at..][..n]);
            self.sums[i * n..][..n].copy_from_slice(&from.sums[r * ng + at..][..n]);
        }
    }

    /// Room for `m` rows of `k` values, padded with zero rows to a multiple of `pad` (the real
    /// rows are the caller's to write); returns groups a row.
    fn resize(&mut self, m: usize, k: usize, pad: usize) -> usize {
        let (rows, groups) = (m.next_multiple_of(pad), k / GROUP);
        self.k = k;
        self.values.resize(rows * k, 0);
        self.scales.resize(rows * groups, 0.0);
        self.sums.resize(rows * groups, 0);
        self.values[m * k..rows * k].fill(0);
        self.scales[m * groups..rows * groups].fill(0.0);
        self.sums[m * groups..rows * groups].fill(0);
        groups
    }
}

/// One row `a` quantized into `values`, its groups' `scales` and `sums`
/// ([`Level::quantize_group`]).
///
/// # Safety
/// The level's features are present.
unsafe fn quantize_row<L: Level, A: Element>(
    a: &[A],
    values: &mut [i8],
    scales: &mut [f32],
    sums: &mut [i32],
) {
    assert!(
        values.len() == a.len() && scales.len() * GROUP == a.len() && sums.len() == scales.len()
    );
    for (g, (d, sum)) in scales.iter_mut().zip(sums).enumerate() {
        // SAFETY: group `g` lies in `a` and `values` (asserted); the level is the caller's.
        (*d, *sum) = unsafe {
            L::quantize_group(
                a.as_ptr().add(g * GROUP),
                values.as_mut_ptr().add(g * GROUP),
            )
        };
    }
}

/// Per-thread operands: the activation rows of one product and the weight panel.
#[derive(Default)]
struct Scratch {
    /// The product's rows, padded to whole tiles (unless they come ready).
    rows: QuantizedRows,
    panel: Panel,
}

/// The weights' side of a product, and where each row's group sums start.
#[derive(Default)]
struct Panel {
    /// Per row and group, where its integer sum starts: minus the weights' bias times the sum
    /// of its values (a load, not a multiply, in the tile).
    starts: Vec<i32>,
    /// Per group, [`STEPS`] steps of repacked weights (a level's rows of 4 bytes each), on
    /// 64-byte lines.
    steps: Vec<__m512i>,
    /// Per group, the panel rows' block scales (a level's rows of f32).
    scales: Vec<__m512>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// What a level brings: its panel's rows and tile's tokens, the repacking and the products.
trait Level {
    /// Weight rows a panel holds: one a 32-bit lane.
    const ROWS: usize;
    /// Tokens a register tile holds.
    const TOKENS: usize;

    /// One group of the panel's rows into `steps` (lane `r` of step `q`: row `r`'s values
    /// `4q..4q + 4`) and their block scales into `scales`, gathered from `group` and `scale`
    /// (the first row's) at each row's byte `offsets` from the first.
    ///
    /// # Safety
    /// The level's features are present; each row's group and scale are readable.
    unsafe fn repack(
        layout: Layout,
        group: *const u8,
        scale: *const u8,
        offsets: &[i32],
        steps: *mut u8,
        scales: *mut f32,
    );

    /// The 32 activations at `x` quantized into `out`: `d = amax / 127` and each value `v / d`
    /// rounded to nearest even (the numbers [`crate::QuantizedActivation::quantize`] gives);
    /// returns `d` and the sum of the quantized values.
    ///
    /// # Safety
    /// The level's features are present; 32 elements are readable at `x`, writable at `out`.
    unsafe fn quantize_group<A: Element>(x: *const A, out: *mut i8) -> (f32, i32);

    /// Tokens `row..row + TOKENS` of `x` against the panel `p` of `groups` groups: per token,
    /// the panel rows' sums, into `out` (`TOKENS x ROWS`).
    ///
    /// # Safety
    /// The level's features are present; `x` holds those tokens, `p` their starts and the
    /// panel.
    unsafe fn tile(x: &QuantizedRows, p: &Panel, row: usize, groups: usize, out: &mut [f32]);
}

/// `c[i*ldc + j] += sum_p a[i*lda + p] * b(j, p)` for `b` in blocks [`multiplies`] says
/// `level` multiplies: `ldb` and `k` count values, whole groups.
///
/// # Safety
/// The level's features are present; the shapes were asserted by the caller.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm<A: Element, Q: Element>(
    level: Isa,
    a: &[A],
    lda: usize,
    b: &[Q],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    // SAFETY: forwarded.
    unsafe {
        match level {
            Isa::Avx512 => SCRATCH.with_borrow_mut(|s| {
                s.rows.quantize::<Avx512, A>(a, lda, m, k, Avx512::TOKENS);
                multiply::<Avx512, Q>(&s.rows, &mut s.panel, m, Q::FORMAT, b, ldb, c, ldc, n);
            }),
            Isa::Avx2 => SCRATCH.with_borrow_mut(|s| {
                s.rows.quantize::<Avx2, A>(a, lda, m, k, Avx2::TOKENS);
                multiply::<Avx2, Q>(&s.rows, &mut s.panel, m, Q::FORMAT, b, ldb, c, ldc, n);
            }),
            other => unreachable!("no integer GEMM on {}", other.name()),
        }
    }
}

/// [`gemm`] over rows `ids` of `x`, already quantized, and `segs` (in values, whole groups),
/// each segment's sums added into `c` in turn; row `j` of `b` (in `format`'s blocks) starts
/// `j * ldb` values in.
///
/// # Safety
/// The level's features are present; `b` holds `n` rows and `c` `ids.len()` of `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_quantized<Q: Element>(
    level: Isa,
    format: BlockFormat,
    x: &QuantizedRows,
    ids: &[usize],
    segs: &[(usize, usize)],
    b: &[Q],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    n: usize,
) {
    // SAFETY: forwarded.
    unsafe {
        match level {
            Isa::Avx512 => quantized_on::<Avx512, Q>(format, x, ids, segs, b, ldb, c, ldc, n),
            Isa::Avx2 => quantized_on::<Avx2, Q>(format, x, ids, segs, b, ldb, c, ldc, n),
            other => unreachable!("no integer GEMM on {}", other.name()),
        }
    }
}

/// [`gemm_quantized`] at level `L`: all of `x`'s rows over their whole length as they are,
/// else each segment's groups of rows `ids` gathered first.
#[allow(clippy::too_many_arguments)]
unsafe fn quantized_on<L: Level, Q: Element>(
    format: BlockFormat,
    x: &QuantizedRows,
    ids: &[usize],
    segs: &[(usize, usize)],
    b: &[Q],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    n: usize,
) {
    let m = ids.len();
    let whole = segs == [(0, x.k)] && ids.iter().enumerate().all(|(i, &r)| i == r);
    SCRATCH.with_borrow_mut(|s| {
        if whole && x.sums.len() >= m.next_multiple_of(L::TOKENS) * (x.k / GROUP) {
            // SAFETY: forwarded; `x` is padded to whole tiles (checked).
            return unsafe { multiply::<L, Q>(x, &mut s.panel, m, format, b, ldb, c, ldc, n) };
        }
        for &(s0, s1) in segs {
            assert!(
                s0.is_multiple_of(Q::VALUES),
                "segment {s0}..{s1}: not whole blocks"
            );
            s.rows.gather(x, ids, s0 / GROUP..s1 / GROUP, L::TOKENS);
            let b = &b[s0 / Q::VALUES..];
            // SAFETY: forwarded.
            unsafe { multiply::<L, Q>(&s.rows, &mut s.panel, m, format, b, ldb, c, ldc, n) };
        }
    });
}

/// `m` rows of `x` (padded to whole tiles) against `n` rows of `b` (`format`'s blocks), the
/// sums added into `c`: panels of [`Level::ROWS`] weight rows repacked into `p`, then every
/// tile of tokens.
#[allow(clippy::too_many_arguments)]
unsafe fn multiply<L: Level, Q: Element>(
    x: &QuantizedRows,
    p: &mut Panel,
    m: usize,
    format: BlockFormat,
    b: &[Q],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    n: usize,
) {
    let layout = layout(format).expect("Q8_0 or Q4_0 blocks (the caller's check)");
    let block_groups = Q::VALUES / GROUP;
    let row_bytes = ldb / Q::VALUES * std::mem::size_of::<Q>();
    assert!(
        L::ROWS * row_bytes < i32::MAX as usize,
        "rows of {row_bytes} bytes are too far apart to gather"
    );
    let (k, groups) = (x.k, x.k / GROUP);
    assert!(
        x.sums.len() >= m.next_multiple_of(L::TOKENS) * groups,
        "rows not padded to tiles"
    );
    assert!(k <= ldb, "{k} values a row beyond rows of {ldb}");
    let step_bytes = L::ROWS * 4;
    p.steps
        .resize((groups * STEPS * step_bytes).div_ceil(64), unsafe {
            // SAFETY: all-zero bits are a valid vector.
            std::mem::zeroed()
        });
    p.scales.resize((groups * L::ROWS).div_ceil(16), unsafe {
        // SAFETY: as above.
        std::mem::zeroed()
    });
    p.starts.clear();
    p.starts
        .extend(x.sums.iter().map(|&sum| -layout.bias * sum));
    let mut out = vec![0f32; L::TOKENS * L::ROWS];
    let mut offsets = vec![0i32; L::ROWS];
    let base = b.as_ptr().cast::<u8>();
    for j0 in (0..n).step_by(L::ROWS) {
        let nj = L::ROWS.min(n - j0);
        // Rows past the edge gather the last real row again (their sums are not stored).
        for (r, o) in offsets.iter_mut().enumerate() {
            *o = ((j0 + r.min(nj - 1)) * row_bytes) as i32;
        }
        let steps = p.steps.as_mut_ptr().cast::<u8>();
        let scales = p.scales.as_mut_ptr().cast::<f32>();
        for g in 0..groups {
            let block = (g / block_groups) * std::mem::size_of::<Q>();
            let group = block + SCALE_BYTES + (g % block_groups) * layout.group_bytes;
            // SAFETY: every offset is a real row's start; the block and its group lie inside
            // the row's `k` values (whole blocks: asserted by the caller); the panel holds
            // `groups` groups.
            unsafe {
                L::repack(
                    layout,
                    base.add(group),
                    base.add(block),
                    &offsets,
                    steps.add(g * STEPS * step_bytes),
                    scales.add(g * L::ROWS),
                )
            };
        }
        for row in (0..m).step_by(L::TOKENS) {
            // SAFETY: the scratch holds whole tiles of tokens and the panel all `groups`.
            unsafe { L::tile(x, p, row, groups, &mut out) };
            for (t, sums) in out.chunks_exact(L::ROWS).enumerate().take(m - row) {
                let dst = &mut c[(row + t) * ldc + j0..][..nj];
                dst.iter_mut().zip(sums).for_each(|(d, v)| *d += v);
            }
        }
    }
}

/// The AVX-512 VNNI level: 16 rows a panel, 8 tokens a tile, a step one `vpdpbusd`.
struct Avx512;

impl Level for Avx512 {
    const ROWS: usize = 16;
    const TOKENS: usize = 8;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn quantize_group<A: Element>(x: *const A, out: *mut i8) -> (f32, i32) {
        use crate::dot::avx512::{BF16, F16, F32, load16};
        let p = x.cast::<u8>();
        let size = std::mem::size_of::<A>();
        // SAFETY: 32 elements at `x`, 32 bytes at `out` (the caller's contract).
        unsafe {
            let load = |at: usize| match kind::<A>() {
                Kind::Bf16 => load16::<BF16>(p.add(at * size), 16),
                Kind::F16 => load16::<F16>(p.add(at * size), 16),
                Kind::F32 => load16::<F32>(p.add(at * size), 16),
            };
            let (lo, hi) = (load(0), load(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            let (d, id) = group_scale(amax);
            let id = _mm512_set1_ps(id);
            // Rounded to nearest even (the default rounding mode).
            let ql = _mm512_cvtps_epi32(_mm512_mul_ps(lo, id));
            let qh = _mm512_cvtps_epi32(_mm512_mul_ps(hi, id));
            _mm_storeu_si128(out.cast(), _mm512_cvtepi32_epi8(ql));
            _mm_storeu_si128(out.add(16).cast(), _mm512_cvtepi32_epi8(qh));
            (d, _mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh)))
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn repack(
        layout: Layout,
        group: *const u8,
        scale: *const u8,
        offsets: &[i32],
        steps: *mut u8,
        scales: *mut f32,
    ) {
        // SAFETY: forwarded from the caller: each row's group is `group_bytes` from its
        // offset, its scale's two bytes (and the two after them, in the block) at `scale`'s.
        unsafe {
            let offsets = _mm512_loadu_si512(offsets.as_ptr().cast());
            let dword = |at: *const u8| _mm512_i32gather_epi32::<1>(offsets, at.cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dword(scale)));
            _mm512_storeu_ps(scales, d);
            let steps = steps.cast::<__m512i>();
            if layout.bias == 8 {
                // Q4_0: byte `j` holds value `j` low and `j + 16` high.
                let low = _mm512_set1_epi8(0x0f);
                for i in 0..STEPS / 2 {
                    let d = dword(group.add(4 * i));
                    _mm512_store_si512(steps.add(i), _mm512_and_si512(d, low));
                    let high = _mm512_and_si512(_mm512_srli_epi16::<4>(d), low);
                    _mm512_store_si512(steps.add(i + STEPS / 2), high);
                }
            } else {
                let sign = _mm512_set1_epi8(i8::MIN);
                for i in 0..STEPS {
                    let d = dword(group.add(4 * i));
                    _mm512_store_si512(steps.add(i), _mm512_xor_si512(d, sign));
                }
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn tile(x: &QuantizedRows, p: &Panel, row: usize, groups: usize, out: &mut [f32]) {
        let mut acc = [_mm512_setzero_ps(); Self::TOKENS];
        let k = x.k;
        let values = x.values.as_ptr();
        let panel = p.steps.as_ptr();
        let scales = p.scales.as_ptr();
        for g in 0..groups {
            // SAFETY: the panel holds the groups' STEPS registers and their scales; the rows
            // hold tokens `row..row + TOKENS` (padded), `k` values each.
            unsafe {
                let w: [__m512i; STEPS] = std::array::from_fn(|q| *panel.add(g * STEPS + q));
                let dw = *scales.add(g);
                for (t, acc) in acc.iter_mut().enumerate() {
                    let at = (row + t) * groups + g;
                    let xq = values.add((row + t) * k + g * GROUP).cast::<i32>();
                    let mut sum = _mm512_set1_epi32(*p.starts.get_unchecked(at));
                    for (q, &w) in w.iter().enumerate() {
                        let xq = _mm512_set1_epi32(xq.add(q).read_unaligned());
                        sum = _mm512_dpbusd_epi32(sum, w, xq);
                    }
                    let scaled = _mm512_mul_ps(
                        _mm512_cvtepi32_ps(sum),
                        _mm512_set1_ps(*x.scales.get_unchecked(at)),
                    );
                    *acc = _mm512_fmadd_ps(scaled, dw, *acc);
                }
            }
        }
        for (o, acc) in out.chunks_exact_mut(Self::ROWS).zip(acc) {
            // SAFETY: `o` holds 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), acc) };
        }
    }
}

/// The AVX2 level: 8 rows a panel, 4 tokens a tile (16 registers), a step one `vpmaddubsw`.
struct Avx2;

impl Level for Avx2 {
    const ROWS: usize = 8;
    const TOKENS: usize = 4;

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn quantize_group<A: Element>(x: *const A, out: *mut i8) -> (f32, i32) {
        // SAFETY: 32 elements at `x`, 32 bytes at `out` (the caller's contract).
        unsafe {
            let load = |at: usize| match kind::<A>() {
                Kind::Bf16 => {
                    let bits = _mm_loadu_si128(x.cast::<u16>().add(at).cast());
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
                }
                Kind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(x.cast::<u16>().add(at).cast())),
                Kind::F32 => _mm256_loadu_ps(x.cast::<f32>().add(at)),
            };
            let v = [load(0), load(8), load(16), load(24)];
            let abs = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
            let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| {
                _mm256_max_ps(m, _mm256_and_ps(v, abs))
            });
            let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
            let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            let m = _mm_max_ss(m, _mm_movehdup_ps(m));
            let (d, id) = group_scale(_mm_cvtss_f32(m));
            let id = _mm256_set1_ps(id);
            // Rounded to nearest even (the default rounding mode).
            let q = v.map(|v| _mm256_cvtps_epi32(_mm256_mul_ps(v, id)));
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let sum = _mm_add_epi32(
                _mm256_castsi256_si128(sum),
                _mm256_extracti128_si256::<1>(sum),
            );
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01_00_11_10>(sum));
            let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b10_11_00_01>(sum));
            // Packing interleaves the 128-bit lanes; one permutation puts the values in order.
            let bytes = _mm256_packs_epi16(
                _mm256_packs_epi32(q[0], q[1]),
                _mm256_packs_epi32(q[2], q[3]),
            );
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            _mm256_storeu_si256(out.cast(), _mm256_permutevar8x32_epi32(bytes, order));
            (d, _mm_cvtsi128_si32(sum))
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn repack(
        layout: Layout,
        group: *const u8,
        scale: *const u8,
        offsets: &[i32],
        steps: *mut u8,
        scales: *mut f32,
    ) {
        debug_assert_eq!(layout.bias, 8, "AVX2 multiplies Q4_0 alone");
        // SAFETY: as for AVX-512.
        unsafe {
            let offsets = _mm256_loadu_si256(offsets.as_ptr().cast());
            let dword = |at: *const u8| _mm256_i32gather_epi32::<1>(at.cast(), offsets);
            // The low 16 bits of each lane, packed into the low 128 bits, then widened.
            let halves = _mm256_shuffle_epi8(
                dword(scale),
                _mm256_setr_epi8(
                    0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12,
                    13, -1, -1, -1, -1, -1, -1, -1, -1,
                ),
            );
            let halves = _mm256_permute4x64_epi64::<0b1000>(halves);
            _mm256_storeu_ps(scales, _mm256_cvtph_ps(_mm256_castsi256_si128(halves)));
            let steps = steps.cast::<__m256i>();
            let low = _mm256_set1_epi8(0x0f);
            for i in 0..STEPS / 2 {
                let d = dword(group.add(4 * i));
                _mm256_store_si256(steps.add(i), _mm256_and_si256(d, low));
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(d), low);
                _mm256_store_si256(steps.add(i + STEPS / 2), high);
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile(x: &QuantizedRows, p: &Panel, row: usize, groups: usize, out: &mut [f32]) {
        let mut acc = [_mm256_setzero_ps(); Self::TOKENS];
        let k = x.k;
        let values = x.values.as_ptr();
        let panel = p.steps.as_ptr().cast::<__m256i>();
        let scales = p.scales.as_ptr().cast::<f32>();
        let ones = _mm256_set1_epi16(1);
        for g in 0..groups {
            // SAFETY: as for AVX-512, 8 rows a step.
            unsafe {
                let dw = _mm256_loadu_ps(scales.add(g * Self::ROWS));
                for (t, acc) in acc.iter_mut().enumerate() {
                    let at = (row + t) * groups + g;
                    let xq = values.add((row + t) * k + g * GROUP).cast::<i32>();
                    // Eight steps' pair sums add in 16 bits (at most 30480: no saturation).
                    let mut pairs = _mm256_setzero_si256();
                    for q in 0..STEPS {
                        let w = _mm256_load_si256(panel.add(g * STEPS + q));
                        let xq = _mm256_set1_epi32(xq.add(q).read_unaligned());
                        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w, xq));
                    }
                    let sum = _mm256_add_epi32(
                        _mm256_madd_epi16(pairs, ones),
                        _mm256_set1_epi32(*p.starts.get_unchecked(at)),
                    );
                    let scaled = _mm256_mul_ps(
                        _mm256_cvtepi32_ps(sum),
                        _mm256_set1_ps(*x.scales.get_unchecked(at)),
                    );
                    *acc = _mm256_fmadd_ps(scaled, dw, *acc);
                }
            }
        }
        for (o, acc) in out.chunks_exact_mut(Self::ROWS).zip(acc) {
            // SAFETY: `o` holds 8 f32.
            unsafe { _mm256_storeu_ps(o.as_mut_ptr(), acc) };
        }
    }
}
