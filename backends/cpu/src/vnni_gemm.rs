//! GEMM over Q8_0 and Q4_0 blocks in integer dot products on AVX-512 VNNI: the prefill
//! counterpart of the row products ([`crate::vnni`]), with the same numbers.
//!
//! Each activation row is quantized to 8 bits per group of 32 once per call, as decode does
//! ([`crate::QuantizedActivation`]), and each weight row's groups are multiplied
//! exactly in 32-bit integers. What makes it a GEMM is the layout: sixteen weight rows at a
//! time are repacked into a panel where 32-bit lane `r` of step `q` holds values `4q..4q + 4` of
//! row `r`'s group, so one `vpdpbusd` against four activation bytes broadcast to every lane
//! adds four products to each of the sixteen rows' sums. A group is eight of them, and the
//! panel's eight registers serve every token in turn. The weights enter `vpdpbusd` as unsigned
//! bytes (Q4_0's nibbles as stored, Q8_0's bytes plus 128); what that bias adds, `bias x` the
//! activation group's sum, starts each group's integer sum negated. The sum is then converted,
//! scaled by the activation group's scale and the sixteen rows' block scales, and added in f32.
//!
//! Beside the `vdpbf16ps` tile over dequantized panels, this rounds the activation to 8 bits
//! (as the row products do) instead of rounding both operands to bf16, and multiplies 512
//! pairs in 12 instructions where the bf16 tile needs 16 (docs/performance.md has the A/B).

use crate::dot::avx512::{BF16, F16, F32, load16, mask16};
use crate::element::{Kind, kind};
use moek_ir::quant::GROUP;
use moek_ir::{BlockFormat, Element};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows a panel holds: one per 32-bit lane.
const ROWS: usize = 16;
/// Tokens a register tile holds (eight f32 accumulators beside the panel's eight steps).
const TOKENS: usize = 8;
/// Four-byte steps in a group of 32.
const STEPS: usize = GROUP / 4;

/// How the weight bytes of one block format enter `vpdpbusd`.
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

/// Per-thread operands: the activation rows quantized, their groups' bias sums, the panel.
#[derive(Default)]
struct Scratch {
    /// Row after row (padded to whole tiles with zeros), each `k` values.
    values: Vec<i8>,
    /// Per row and group, the activation's scale.
    scales: Vec<f32>,
    /// Per row and group, `-bias x` the sum of its values: where the group's integer sum starts.
    starts: Vec<i32>,
    /// Per group, [`STEPS`] registers of repacked weights.
    panel: Vec<__m512i>,
    /// Per group, the sixteen rows' block scales.
    panel_scales: Vec<__m512>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// `c[i*ldc + j] += sum_p a[i*lda + p] * b(j, p)` for `b` in Q8_0 or Q4_0 blocks: `ldb` and
/// `k` count values, whole groups.
///
/// # Safety
/// AVX-512 F/BW/VL and VNNI are present; the shapes were asserted by the caller.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
pub(crate) unsafe fn gemm<A: Element, Q: Element>(
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
    let layout = layout(Q::FORMAT).expect("Q8_0 or Q4_0 blocks (the caller's check)");
    let groups = k / GROUP;
    let block_groups = Q::VALUES / GROUP;
    let row_bytes = ldb / Q::VALUES * std::mem::size_of::<Q>();
    assert!(
        ROWS * row_bytes < i32::MAX as usize,
        "rows of {row_bytes} bytes are too far apart to gather"
    );
    SCRATCH.with_borrow_mut(|s| {
        quantize_rows(a, lda, m, k, layout.bias, s);
        s.panel.resize(groups * STEPS, _mm512_setzero_si512());
        s.panel_scales.resize(groups, _mm512_setzero_ps());
        let base = b.as_ptr().cast::<u8>();
        for j0 in (0..n).step_by(ROWS) {
            let nj = ROWS.min(n - j0);
            // Rows past the edge gather the last real row again (their sums are not stored).
            let offsets: [i32; ROWS] =
                std::array::from_fn(|r| ((j0 + r.min(nj - 1)) * row_bytes) as i32);
            // SAFETY: sixteen i32s.
            let offsets = unsafe { _mm512_loadu_si512(offsets.as_ptr().cast()) };
            for g in 0..groups {
                let block = (g / block_groups) * std::mem::size_of::<Q>();
                let group = block + 2 + (g % block_groups) * layout.group_bytes;
                // SAFETY: every offset is a real row's start; the block and its group lie
                // inside the row's `k` values (whole blocks: asserted by the caller).
                unsafe {
                    let scales = _mm512_i32gather_epi32::<1>(offsets, base.add(block).cast());
                    s.panel_scales[g] = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(scales));
                    let steps = &mut s.panel[g * STEPS..(g + 1) * STEPS];
                    repack(layout, base.add(group), offsets, steps);
                }
            }
            let mut row = 0;
            while row < m {
                // SAFETY: the scratch holds whole tiles of rows; the panel all `groups`.
                let acc = unsafe { tile(s, row, groups, k) };
                for (t, acc) in acc.iter().enumerate().take(m - row) {
                    let out = &mut c[(row + t) * ldc + j0..][..nj];
                    let mask = mask16(nj);
                    // SAFETY: `out` holds the `nj` lanes the mask keeps.
                    unsafe {
                        let was = _mm512_maskz_loadu_ps(mask, out.as_ptr());
                        _mm512_mask_storeu_ps(out.as_mut_ptr(), mask, _mm512_add_ps(was, *acc));
                    }
                }
                row += TOKENS;
            }
        }
    });
}

/// The rows of `a` quantized into `s` (values, scales and each group's starting sum), padded with
/// zero rows to whole tiles of [`TOKENS`]: per group of 32, `d = amax / 127` and each value
/// `v / d` rounded to nearest even, the numbers [`QuantizedActivation::quantize`] gives.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
fn quantize_rows<A: Element>(a: &[A], lda: usize, m: usize, k: usize, bias: i32, s: &mut Scratch) {
    let rows = m.next_multiple_of(TOKENS);
    let groups = k / GROUP;
    s.values.resize(rows * k, 0);
    s.scales.resize(rows * groups, 0.0);
    s.starts.resize(rows * groups, 0);
    let size = std::mem::size_of::<A>();
    for i in 0..rows {
        for g in 0..groups {
            let at = i * groups + g;
            if i >= m {
                s.values[i * k + g * GROUP..][..GROUP].fill(0);
                (s.scales[at], s.starts[at]) = (0.0, 0);
                continue;
            }
            // SAFETY: row `i` of `a` holds `k` elements (asserted by the caller), so the group's
            // 32 are readable; the scratch holds `rows * k` values.
            unsafe {
                let p = a.as_ptr().add(i * lda + g * GROUP).cast::<u8>();
                let load = |at: usize| match kind::<A>() {
                    Kind::Bf16 => load16::<BF16>(p.add(at * size), 16),
                    Kind::F16 => load16::<F16>(p.add(at * size), 16),
                    Kind::F32 => load16::<F32>(p.add(at * size), 16),
                };
                let (lo, hi) = (load(0), load(16));
                let amax =
                    _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
                let d = amax / 127.0;
                let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
                // Rounded to nearest even (the default rounding mode).
                let (ql, qh) = (
                    _mm512_cvtps_epi32(_mm512_mul_ps(lo, id)),
                    _mm512_cvtps_epi32(_mm512_mul_ps(hi, id)),
                );
                let out = s.values.as_mut_ptr().add(i * k + g * GROUP);
                _mm_storeu_si128(out.cast(), _mm512_cvtepi32_epi8(ql));
                _mm_storeu_si128(out.add(16).cast(), _mm512_cvtepi32_epi8(qh));
                s.scales[at] = d;
                s.starts[at] = -bias * _mm512_reduce_add_epi32(_mm512_add_epi32(ql, qh));
            }
        }
    }
}

/// One group of sixteen rows, gathered from `group` (that group's bytes in the first row;
/// `offsets` each row's bytes from the first) into [`STEPS`] registers of unsigned bytes, lane
/// `r` of step `q` row `r`'s values `4q..4q + 4`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn repack(layout: Layout, group: *const u8, offsets: __m512i, steps: &mut [__m512i]) {
    // SAFETY: forwarded from the caller: each row's group is `group_bytes` from its offset.
    unsafe {
        let dword = |i: usize| _mm512_i32gather_epi32::<1>(offsets, group.add(4 * i).cast());
        if layout.bias == 8 {
            // Q4_0: byte `j` holds value `j` low and `j + 16` high.
            let low = _mm512_set1_epi8(0x0f);
            for i in 0..STEPS / 2 {
                let d = dword(i);
                steps[i] = _mm512_and_si512(d, low);
                steps[i + STEPS / 2] = _mm512_and_si512(_mm512_srli_epi16::<4>(d), low);
            }
        } else {
            let sign = _mm512_set1_epi8(i8::MIN);
            for (i, step) in steps.iter_mut().enumerate() {
                *step = _mm512_xor_si512(dword(i), sign);
            }
        }
    }
}

/// Rows `row..row + TOKENS` of the quantized activations against the whole panel: per token,
/// sixteen rows' sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile(s: &Scratch, row: usize, groups: usize, k: usize) -> [__m512; TOKENS] {
    let mut acc = [_mm512_setzero_ps(); TOKENS];
    let values = s.values.as_ptr();
    for g in 0..groups {
        let w: [__m512i; STEPS] = std::array::from_fn(|q| s.panel[g * STEPS + q]);
        let dw = s.panel_scales[g];
        for (t, acc) in acc.iter_mut().enumerate() {
            let at = (row + t) * groups + g;
            // SAFETY: the scratch holds rows `row..row + TOKENS` (padded), `k` values each.
            unsafe {
                let x = values.add((row + t) * k + g * GROUP).cast::<i32>();
                let mut sum = _mm512_set1_epi32(*s.starts.get_unchecked(at));
                for (q, &w) in w.iter().enumerate() {
                    let xq = _mm512_set1_epi32(x.add(q).read_unaligned());
                    sum = _mm512_dpbusd_epi32(sum, w, xq);
                }
                let scaled = _mm512_mul_ps(
                    _mm512_cvtepi32_ps(sum),
                    _mm512_set1_ps(*s.scales.get_unchecked(at)),
                );
                *acc = _mm512_fmadd_ps(scaled, dw, *acc);
            }
        }
    }
    acc
}
