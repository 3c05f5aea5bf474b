//! Products of block-quantized weights (Q8_0, Q4_0 at any declared block size, MXFP4:
//! [`moek_ir::quant`]) with activations; Q8_0 and Q4_0 in integer dot products as llama.cpp
//! computes them, MXFP4 in f32 against the unrounded activation ([`rows_mxfp4`]).
//!
//! The activation is quantized to 8 bits per group of 32 (an f32 scale `amax / 127` and i8
//! values, rounded to nearest, ties to even), once per row ([`Weight::row`]) for every product
//! that row enters (gate and up, every route, every column block); each group's dot product is
//! then exact in 32-bit integers, scaled by its weight block's scale and its own and added in
//! f32: a block of several groups only shares its scale among them. On AVX2 a Q8_0
//! group is one `vpmaddubsw` (unsigned x signed bytes into i16 pairs; the weight's sign moved
//! onto the activation by `vpsignb`) and one `vpmaddwd` against ones; Q4_0 takes two blocks a
//! step ([`crate::avx2::dot_q4`]). On AVX-512 (and AMX) both run on VNNI's `vpdpbusd`
//! ([`crate::vnni`]). Integer dots are chosen over widening
//! the weights to f32 and using FMAs: a block is 4 instructions instead of 12 (8 widenings and 4
//! FMAs), and decode is bound by memory either way, prefill is not.
//!
//! For Q8_0 and Q4_0 the activation's rounding is the only rounding beyond f32 sums: each value moves by at most
//! half a step, `amax / 254` of its block (docs/numerics.md).

use crate::isa::{Isa, isa};
use crate::memory::{LINE, Lines};
use moek_ir::Element;
use moek_ir::quant::{BlockMxfp4, BlockQ4, BlockQ8, GROUP};
use std::cell::RefCell;
use std::ops::Range;

/// An activation vector in Q8 groups: one f32 scale per group of 32 and the values as i8, also
/// split into halves for the Q4_0 kernels (`crate::avx2::dot_q4`, `crate::vnni::dot_q4`).
///
/// What the row kernels load a step at a time starts on a cache line ([`Lines`]): at 64 bytes
/// a step, a load from a buffer that starts 16 bytes in (as the allocator's do) splits across
/// two lines three times in four, and split loads slowed the Q4_0 row kernel by a seventh
/// (docs/performance.md).
#[derive(Debug)]
pub struct QuantizedActivation {
    pub scales: Vec<f32>,
    pub values: Lines<i8>,
    /// Each block's values `0..16`, block after block: what Q4_0's low nibbles multiply, so two
    /// blocks' halves are one 32-byte load beside their two blocks' nibbles.
    pub low: Lines<i8>,
    /// Each block's values `16..32` (the high nibbles'), block after block.
    pub high: Lines<i8>,
    /// Per block, 4 lanes: 8 x the sum of values `4i..4i + 4` and `16 + 4i..16 + 4i + 4`, what
    /// Q4_0's offset of 8 adds to lane `i` of the AVX2 kernel's block sums, so it multiplies
    /// the nibbles as they are stored (0..=15) and subtracts this once.
    pub offsets: Lines<i32>,
}

impl Default for QuantizedActivation {
    fn default() -> Self {
        QuantizedActivation {
            scales: Vec::new(),
            values: Lines::new(LINE),
            low: Lines::new(LINE),
            high: Lines::new(LINE),
            offsets: Lines::new(LINE),
        }
    }
}

impl QuantizedActivation {
    /// `x` (a whole number of groups), quantized per group to 8 bits, replacing what was here.
    pub fn quantize<A: Element>(&mut self, x: &[A]) {
        assert_eq!(
            x.len() % GROUP,
            0,
            "{} activations are not whole groups of {GROUP}",
            x.len()
        );
        self.scales.clear();
        self.values.clear();
        self.low.clear();
        self.high.clear();
        self.offsets.clear();
        const HALF: usize = GROUP / 2;
        for block in x.chunks_exact(GROUP) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.to_f32().abs()));
            let (d, id) = group_scale(amax);
            self.scales.push(d);
            // |v * id| <= 127: never -128, which the AVX2 kernel's sign trick could not negate.
            let q: [i8; GROUP] = std::array::from_fn(|i| round_small(block[i].to_f32() * id) as i8);
            self.values.extend_from_slice(&q);
            self.low.extend_from_slice(&q[..HALF]);
            self.high.extend_from_slice(&q[HALF..]);
            let sum = |r: &[i8]| r.iter().map(|&v| i32::from(v)).sum::<i32>();
            let offsets: [i32; 4] = std::array::from_fn(|i| {
                8 * (sum(&q[4 * i..4 * i + 4]) + sum(&q[HALF + 4 * i..HALF + 4 * i + 4]))
            });
            self.offsets.extend_from_slice(&offsets);
        }
    }
}

/// A group's scale `d = amax / 127` and the `1 / d` its values are multiplied by (zero for an
/// all-zero group): one definition for every quantizer of activations, so they agree exactly.
#[inline]
pub(crate) fn group_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d != 0.0 { 1.0 / d } else { 0.0 })
}

/// `v` rounded to the nearest whole number, ties to even, for `|v| < 2^22`: adding and taking
/// away `1.5 x 2^23` leaves no fraction bits (f32 addition rounds to nearest even), in two
/// additions the compiler vectorizes, where `f32::round` is a call to libm per value.
#[inline]
fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// The products of a stored element ([`Element`]: a plain value, or a quantized block of
/// [`Element::VALUES`] values) the generated CPU variants read.
pub trait Weight: Element {
    /// An activation row as this element's products read it, made once ([`Weight::row`]) and
    /// shared by every product of that row (gate and up, every expert it routes to, every
    /// column block): the row itself beside plain weights, its 8-bit groups beside Q8_0 and
    /// Q4_0, its f32 values beside MXFP4.
    type Row<'a, A: Element>: Send + Sync;

    /// `x` made ready for this element's products.
    fn row<A: Element>(x: &[A]) -> Self::Row<'_, A>;

    /// What a GEMM skeleton keeps the gated activation in between its two products, beside
    /// activations in `A`: `A` itself for plain weights (their GEMM multiplies one type) and for
    /// MXFP4 (exact in bf16: beside bf16 both products run on the bf16 tiles), f32 for Q8_0 and
    /// Q4_0 (their GEMM widens or quantizes its operand anyway).
    type Gated<A: Element>: Element;

    /// `out[j - rows.start] = sum over segs (in order) of x[seg] . mat[j*ld + seg]` for `j` in
    /// `rows`, `x` a [`Weight::row`]; `ld` and the segments count values.
    fn matvec_row<A: Element>(
        x: &Self::Row<'_, A>,
        mat: &[Self],
        ld: usize,
        rows: Range<usize>,
        segs: &[(usize, usize)],
        out: &mut [f32],
    );

    /// `c[i*ldc + j] += sum_{p<k} a[i*lda + p] * b(j, p)` for `i < m`, `j < n`, row `j` of `b`
    /// starting `j * ldb` values in (`ldb` and `k` count values): the GEMM skeletons' product.
    /// Blocks are multiplied as [`gemm_blocks`] does, beside either activation; plain weights
    /// as [`crate::gemm_nt`] does, beside activations of their own type.
    #[allow(clippy::too_many_arguments)]
    fn gemm_nt<A: Element>(
        a: &[A],
        lda: usize,
        b: &[Self],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
    ) {
        gemm_blocks(a, lda, b, ldb, c, ldc, m, n, k);
    }

    /// [`Weight::matvec_row`] of `x` as it is (made ready for this one product).
    fn matvec_segments<A: Element>(
        x: &[A],
        mat: &[Self],
        ld: usize,
        rows: Range<usize>,
        segs: &[(usize, usize)],
        out: &mut [f32],
    ) {
        Self::matvec_row(&Self::row(x), mat, ld, rows, segs, out);
    }
}

/// The plain elements: [`crate::dot::dot_rows`] on the row as it is.
macro_rules! plain_weight {
    ($($ty:ty),*) => {$(
        impl Weight for $ty {
            type Row<'a, A: Element> = &'a [A];
            type Gated<A: Element> = A;

            fn row<A: Element>(x: &[A]) -> &[A] {
                x
            }

            fn matvec_row<A: Element>(
                x: &&[A],
                mat: &[$ty],
                ld: usize,
                rows: Range<usize>,
                segs: &[(usize, usize)],
                out: &mut [f32],
            ) {
                let start = rows.start;
                crate::dot::dot_rows(x, mat, ld, rows, segs, |j, v| out[j - start] = v);
            }

            fn gemm_nt<A: Element>(
                a: &[A],
                lda: usize,
                b: &[$ty],
                ldb: usize,
                c: &mut [f32],
                ldc: usize,
                m: usize,
                n: usize,
                k: usize,
            ) {
                assert_eq!(
                    A::KIND,
                    <$ty>::KIND,
                    "a GEMM multiplies plain weights by activations of their own type"
                );
                let a: &[$ty] = bytemuck::cast_slice(a);
                crate::gemm_nt(a, lda, b, ldb, c, ldc, m, n, k);
            }
        }
    )*};
}

plain_weight!(half::f16, half::bf16, f32);

/// The row products of one block type: an integer dot of a row's groups with a quantized
/// activation, portable and on AVX2, which [`rows_q`] picks between by level.
/// A row's dot over segments (in values) with a quantized activation, prefetching `ahead`.
#[cfg(target_arch = "x86_64")]
pub type SegmentDots<Q> = unsafe fn(&[Q], &QuantizedActivation, &[(usize, usize)], usize) -> f32;

#[derive(Clone, Copy, Debug)]
pub struct Dots<Q> {
    /// `sum_g scale(block of g) * x.scales[g] * (w[g] . xq[g])` over the groups `groups`, in
    /// order, in plain integer loops.
    pub portable: fn(&[Q], &QuantizedActivation, Range<usize>) -> f32,
    /// On AVX2, `sum over segs (in order) of row[seg] . x[seg]`, the segments in groups, each
    /// reduced to one number (8 lanes by a fixed tree) before it is added; prefetches `ahead`
    /// bytes on. Unsafe: the level must be checked.
    #[cfg(target_arch = "x86_64")]
    pub avx2: SegmentDots<Q>,
    /// The same on AVX-512 VNNI ([`crate::vnni`]).
    #[cfg(target_arch = "x86_64")]
    pub avx512: SegmentDots<Q>,
}

/// The portable group dots of a block type with inherent `scale` and `step`.
macro_rules! dots {
    ($name:ident, $ty:ident, $avx2:path, $avx512:path) => {
        /// The row products of this block type at `G` groups a block.
        pub fn $name<const G: usize>() -> Dots<$ty<G>> {
            Dots {
                portable: |row, x, groups| {
                    let mut sum = 0f32;
                    for g in groups {
                        let b = &row[g / G];
                        let q = &x.values[g * GROUP..(g + 1) * GROUP];
                        let dot: i32 = q
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| b.step(g % G, i) * i32::from(v))
                            .sum();
                        sum += b.scale() * x.scales[g] * dot as f32;
                    }
                    sum
                },
                #[cfg(target_arch = "x86_64")]
                avx2: $avx2,
                #[cfg(target_arch = "x86_64")]
                avx512: $avx512,
            }
        }
    };
}

dots!(dots_q8, BlockQ8, crate::avx2::dot_q8, crate::vnni::dot_q8);
dots!(dots_q4, BlockQ4, crate::avx2::dot_q4, crate::vnni::dot_q4);

thread_local! {
    /// Each thread's quantized activation, reused from one product to the next.
    static ACTIVATION: RefCell<QuantizedActivation> = RefCell::default();
}

/// The quantized blocks: the activation quantized (once per row, or per product into a
/// thread's own buffer), then [`rows_q`].
macro_rules! quantized_weight {
    ($([$($generics:tt)*] $ty:ty: $dots:expr),*) => {$(
        impl<$($generics)*> Weight for $ty {
            type Row<'a, A: Element> = QuantizedActivation;
            type Gated<A: Element> = f32;

            fn row<A: Element>(x: &[A]) -> QuantizedActivation {
                let mut q = QuantizedActivation::default();
                q.quantize(x);
                q
            }

            fn matvec_row<A: Element>(
                x: &QuantizedActivation,
                mat: &[$ty],
                ld: usize,
                rows: Range<usize>,
                segs: &[(usize, usize)],
                out: &mut [f32],
            ) {
                rows_q(x, mat, ld, rows, segs, out, $dots);
            }

            fn matvec_segments<A: Element>(
                x: &[A],
                mat: &[$ty],
                ld: usize,
                rows: Range<usize>,
                segs: &[(usize, usize)],
                out: &mut [f32],
            ) {
                ACTIVATION.with_borrow_mut(|xq| {
                    xq.quantize(x);
                    rows_q(xq, mat, ld, rows, segs, out, $dots);
                });
            }
        }
    )*};
}

quantized_weight!(
    [const G: usize] BlockQ8<G>: dots_q8::<G>(),
    [const G: usize] BlockQ4<G>: dots_q4::<G>()
);

thread_local! {
    /// Each thread's activation widened to f32, reused from one MXFP4 product to the next.
    static WIDE: RefCell<Vec<f32>> = RefCell::default();
    /// Each thread's f32 activation in the AVX-512 MXFP4 kernel's lane order.
    #[cfg(target_arch = "x86_64")]
    static LANES: RefCell<Lines<f32>> = RefCell::new(Lines::new(LINE));
}

/// MXFP4 blocks against the activation in f32, not quantized: the weights' exact values times
/// the activation's, in f32 sums ([`rows_mxfp4`]). A format shipped with a model is held to the
/// model's own numbers (its logits within f32 rounding of the dequantized weights'), and
/// decode, which it serves, is bound by the weights' bytes either way. A GEMM keeps the gated
/// activation in the activation's own type, as a plain GEMM does: beside bf16 activations both
/// products then run on the bf16 tiles exactly (an MXFP4 value is exact in bf16).
impl Weight for BlockMxfp4 {
    type Row<'a, A: Element> = Vec<f32>;
    type Gated<A: Element> = A;

    fn row<A: Element>(x: &[A]) -> Vec<f32> {
        x.iter().map(|v| v.to_f32()).collect()
    }

    fn matvec_row<A: Element>(
        x: &Vec<f32>,
        mat: &[BlockMxfp4],
        ld: usize,
        rows: Range<usize>,
        segs: &[(usize, usize)],
        out: &mut [f32],
    ) {
        rows_mxfp4(x, mat, ld, rows, segs, out);
    }

    fn matvec_segments<A: Element>(
        x: &[A],
        mat: &[BlockMxfp4],
        ld: usize,
        rows: Range<usize>,
        segs: &[(usize, usize)],
        out: &mut [f32],
    ) {
        WIDE.with_borrow_mut(|xf| {
            xf.clear();
            xf.extend(x.iter().map(|v| v.to_f32()));
            rows_mxfp4(xf, mat, ld, rows, segs, out);
        });
    }
}

/// [`Weight::matvec_segments`] for MXFP4 rows and an f32 activation: per row, the segments (in
/// values, whole blocks) in order, each a sum over its blocks of `2^(e - 128)` times the block's
/// steps dotted with the activation.
pub fn rows_mxfp4(
    x: &[f32],
    mat: &[BlockMxfp4],
    ld: usize,
    rows: Range<usize>,
    segs: &[(usize, usize)],
    out: &mut [f32],
) {
    let (ldb, kb, groups) = block_rows::<BlockMxfp4>(x.len(), mat.len(), ld, &rows, segs, out);
    let level = isa();
    #[cfg(target_arch = "x86_64")]
    if matches!(level, Isa::Amx | Isa::Avx512) {
        // The activation once in the kernel's lane order, then every row against it.
        return LANES.with_borrow_mut(|lanes| {
            // SAFETY: the level is checked.
            unsafe { crate::dot::avx512::mxfp4_lane_order(x, lanes) };
            for (o, j) in out.iter_mut().zip(rows) {
                let row = &mat[j * ldb..j * ldb + kb];
                // SAFETY: the level is checked; the kernel asserts the lengths.
                *o = unsafe {
                    crate::dot::avx512::dot_mxfp4(row, lanes, &groups, crate::dot::BLOCKS_AHEAD)
                };
            }
        });
    }
    for (o, j) in out.iter_mut().zip(rows) {
        let row = &mat[j * ldb..j * ldb + kb];
        *o = match level {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: as above.
                unsafe { crate::avx2::dot_mxfp4(row, x, &groups, crate::dot::BLOCKS_AHEAD) }
            }
            _ => groups.iter().fold(0f32, |sum, &(s, e)| {
                sum + row[s..e]
                    .iter()
                    .zip(x[s * GROUP..e * GROUP].chunks_exact(GROUP))
                    .fold(0f32, |acc, (b, xs)| {
                        let dot: f32 = xs
                            .iter()
                            .enumerate()
                            .map(|(i, &v)| b.step(i) as f32 * v)
                            .sum();
                        acc + b.scale() * dot
                    })
            }),
        };
    }
}

/// Rows of `b` [`gemm_blocks`] dequantizes at a time where the level has no GEMM that
/// dequantizes its own chunks (the portable level, and fewer than
/// [`crate::gemm::STREAM_ROWS`] rows of `a`): a multiple of the tiles' 4 and 6 rows.
const PANEL_ROWS: usize = 48;

thread_local! {
    /// Each thread's activations widened to f32 and its panel of dequantized rows.
    static PANELS: RefCell<(Vec<f32>, Vec<f32>)> = RefCell::default();
}

/// [`Weight::gemm_nt`] for rows in blocks of `Q`: the weights' exact values against the
/// activations as they are, in f32 sums (unlike the row products, [`rows_q`], nothing is
/// rounded to 8 bits). On AVX2 and AVX-512 the level's f32 GEMM tiles dequantize each chunk of
/// a panel of `b` in registers where they would widen a plain one, into L1, and widen `a`
/// once (the `vdpbf16ps` tile rounds both to bf16 where [`bf16_panels`] allows); on AMX a
/// panel of rows is dequantized to bf16 for the tiles (where [`bf16_panels`] allows); elsewhere
/// [`PANEL_ROWS`] rows are dequantized at a time for [`crate::gemm_nt`] on f32. With tokens to
/// share each dequantized row (prefill: an expert's tokens), a tile's multiply-adds cost far
/// less per weight than an integer dot per token.
#[allow(clippy::too_many_arguments)]
pub fn gemm_blocks<A: Element, Q: Element>(
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
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let v = Q::VALUES;
    assert!(
        ldb.is_multiple_of(v) && k.is_multiple_of(v),
        "quantized rows of {ldb} values, a reduction of {k}: not whole blocks of {v}"
    );
    let lens = [a.len(), b.len() * v, c.len()];
    crate::gemm::assert_shape("gemm_blocks", lens, [lda, ldb, ldc], [m, n, k]);
    match isa() {
        _ if m < crate::gemm::STREAM_ROWS => {}
        // SAFETY: `isa()` enabled AMX for the process; the shapes were asserted above.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        Isa::Amx if bf16_panels::<A, Q>() => {
            return unsafe {
                crate::gemm::avx512::gemm_amx_blocks(a, lda, b, ldb, c, ldc, m, n, k)
            };
        }
        // SAFETY: the level's features were detected; the shapes were asserted above.
        #[cfg(target_arch = "x86_64")]
        level if integer_gemm(Q::FORMAT) => {
            return unsafe { crate::int_gemm::gemm(level, a, lda, b, ldb, c, ldc, m, n, k) };
        }
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if on_dot_tile() && bf16_panels::<A, Q>() => {
            return unsafe {
                crate::gemm::avx512::gemm_dpbf16_blocks(a, lda, b, ldb, c, ldc, m, n, k)
            };
        }
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Avx512 => {
            return unsafe { crate::gemm::avx512::gemm(a, lda, b, ldb, c, ldc, m, n, k) };
        }
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => return unsafe { crate::avx2::gemm::gemm(a, lda, b, ldb, c, ldc, m, n, k) },
        _ => {}
    }
    PANELS.with_borrow_mut(|(a32, panel)| {
        a32.clear();
        for i in 0..m {
            a32.extend(a[i * lda..i * lda + k].iter().map(|x| x.to_f32()));
        }
        for j0 in (0..n).step_by(PANEL_ROWS) {
            let nj = PANEL_ROWS.min(n - j0);
            panel.resize(nj * k, 0.0);
            for (r, row) in panel.chunks_exact_mut(k).enumerate() {
                let at = (j0 + r) * ldb / v;
                let blocks = &b[at..at + k / v];
                for (blk, o) in blocks.iter().zip(row.chunks_exact_mut(v)) {
                    blk.dequantize(o);
                }
            }
            crate::gemm_nt(a32, k, panel, k, &mut c[j0..], ldc, m, nj, k);
        }
    });
}

/// Activation rows made ready once for every GEMM over weights of one element type they enter
/// ([`GemmRows::gemm`]): where that GEMM multiplies in integers ([`crate::int_gemm`]), the rows
/// are quantized here, so an MoE layer's tokens are quantized once for gate and up and every
/// expert each routes to, not once a product. The numbers are those of quantizing in each
/// product: the groups are the same.
#[derive(Debug)]
pub struct GemmRows<'a, A> {
    x: &'a [A],
    k: usize,
    #[cfg(target_arch = "x86_64")]
    quantized: Option<(moek_ir::BlockFormat, crate::int_gemm::QuantizedRows)>,
}

impl<'a, A: Element> GemmRows<'a, A> {
    /// `m` rows of `k` values of `x`, for products with weights of `W`.
    pub fn new<W: Weight>(x: &'a [A], m: usize, k: usize) -> Self {
        assert!(x.len() >= m * k, "{m} rows of {k} values in {}", x.len());
        #[cfg(target_arch = "x86_64")]
        let quantized = match W::KIND {
            moek_ir::Kind::Blocks(format)
                if m >= crate::gemm::STREAM_ROWS && integer_gemm(format) =>
            {
                Some((
                    format,
                    crate::int_gemm::QuantizedRows::new(isa(), x, k, m, k),
                ))
            }
            _ => None,
        };
        GemmRows {
            x,
            k,
            #[cfg(target_arch = "x86_64")]
            quantized,
        }
    }

    /// `c[i*ldc + j] += sum over segs (in order) of x[ids[i]][seg] . b(j, seg)` for `j < n`:
    /// row `j` of `b` starts `j * ldb` values in, the segments count values, and each segment's
    /// product ([`Weight::gemm_nt`]) is added into `c` in turn.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<W: Weight>(
        &self,
        ids: &[usize],
        segs: &[(usize, usize)],
        b: &[W],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        n: usize,
    ) {
        let (m, k) = (ids.len(), self.k);
        if m == 0 || n == 0 {
            return;
        }
        let end = segs.iter().map(|&(_, e)| e).max().unwrap_or(0);
        assert!(end <= k.min(ldb) && segs.iter().all(|&(s, e)| s <= e));
        crate::gemm::assert_shape(
            "GemmRows::gemm",
            [m * k, b.len() * W::VALUES, c.len()],
            [k, ldb, ldc],
            [m, n, end],
        );
        #[cfg(target_arch = "x86_64")]
        if let Some((format, q)) = &self.quantized
            && m >= crate::gemm::STREAM_ROWS
        {
            assert_eq!(
                W::KIND,
                moek_ir::Kind::Blocks(*format),
                "rows made ready for {format:?}"
            );
            assert!(segs.iter().all(|&(s, e)| s % GROUP == 0 && e % GROUP == 0));
            // SAFETY: `new` found the level multiplies the format; the shapes are asserted.
            return unsafe {
                crate::int_gemm::gemm_quantized(isa(), *format, q, ids, segs, b, ldb, c, ldc, n)
            };
        }
        let gathered;
        // Rows in a run are read in place.
        let xs = if ids.windows(2).all(|w| w[1] == w[0] + 1) {
            &self.x[ids[0] * k..]
        } else {
            let mut rows = crate::Scratch::<A>::zeroed(m * k);
            crate::gather_rows_into(&mut rows, self.x, k, ids.iter().copied());
            gathered = rows;
            &gathered[..]
        };
        for &(s0, s1) in segs {
            let w = crate::values(b, s0..);
            W::gemm_nt(&xs[s0..], k, w, ldb, c, ldc, m, n, s1 - s0);
        }
    }
}

/// Whether [`gemm_blocks`] may round blocks of `Q` and activations in `A` to bf16 (AMX tiles
/// or the `vdpbf16ps` tile): where that loses nothing (MXFP4's values, two significant bits
/// times a power of two, beside a bf16 activation) or where the format admits the rounding.
fn bf16_panels<A: Element, Q: Element>() -> bool {
    use moek_ir::{BlockFormat, DType, Kind};
    let exact = Q::FORMAT == BlockFormat::Mxfp4 && A::KIND == Kind::Plain(DType::Bf16);
    exact || admits_bf16(Q::FORMAT)
}

/// The type of [`Weight::Gated`] for blocks of `format` beside activations in `activation`, as
/// a dtype: what a GEMM skeleton's gated activation is held to where its GEMM rounds nothing
/// else ([`GemmRounding::Nothing`]).
pub fn gated_dtype(format: moek_ir::BlockFormat, activation: moek_ir::DType) -> moek_ir::DType {
    match format {
        moek_ir::BlockFormat::Mxfp4 => activation,
        _ => moek_ir::DType::F32,
    }
}

/// What [`gemm_blocks`] rounds beyond its f32 sums, by where it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmRounding {
    /// Nothing: the weights' exact values against the activation as it is (the f32 tiles).
    Nothing,
    /// Both operands to bf16, to nearest even, at most 2^-9 of a value (AMX tiles and the
    /// `vdpbf16ps` tile, for the formats that admit it: [`admits_bf16`]).
    Bf16,
    /// The activation to 8 bits a value per group of 32, as the row products do (the integer
    /// GEMM, [`crate::int_gemm`]): within the format's own tolerance.
    Activation8,
}

/// What [`gemm_blocks`] over `format`'s blocks rounds in this process (on a GEMM's worth of
/// rows; fewer take the row products, which round as [`GemmRounding::Activation8`] for Q8_0 and
/// Q4_0 and nothing for MXFP4).
pub fn gemm_rounding(format: moek_ir::BlockFormat) -> GemmRounding {
    match isa() {
        _ if integer_gemm(format) => GemmRounding::Activation8,
        Isa::Amx | Isa::Avx512 if on_bf16_tiles() && admits_bf16(format) => GemmRounding::Bf16,
        _ => GemmRounding::Nothing,
    }
}

/// Whether this process's GEMM over blocks runs on bf16 tiles (AMX, or `vdpbf16ps` where
/// [`crate::gemm::bf16_tile`] picked it).
fn on_bf16_tiles() -> bool {
    isa() == Isa::Amx || on_dot_tile()
}

/// Whether `format`'s tolerance already admits rounding the activation to 8 bits (Q8_0, Q4_0:
/// half a step is 1/254 of a group's largest value, twice bf16's worst).
fn admits_bf16(format: moek_ir::BlockFormat) -> bool {
    use moek_ir::{DType, tolerance::unit_roundoff};
    DType::quantized(format, DType::F32).is_some_and(|d| unit_roundoff(d) >= 2f64.powi(-9))
}

/// Whether [`gemm_blocks`] over `format`'s blocks multiplies in integers at this process's level
/// ([`crate::int_gemm`]: Q8_0 and Q4_0 on AVX-512, Q4_0 on AVX2), unless
/// `MOEK_CPU_QUANT_GEMM=float` keeps them on the float tiles (for the A/B in
/// docs/performance.md).
fn integer_gemm(format: moek_ir::BlockFormat) -> bool {
    static INTEGER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    let level = crate::int_gemm::multiplies(isa(), format);
    #[cfg(not(target_arch = "x86_64"))]
    let level = false;
    level
        && *INTEGER.get_or_init(|| match std::env::var("MOEK_CPU_QUANT_GEMM").as_deref() {
            Ok("float") => false,
            Ok("int" | "auto" | "") | Err(_) => true,
            Ok(other) => panic!("MOEK_CPU_QUANT_GEMM={other}: expected `int`, `float` or `auto`"),
        })
}

/// Whether this process's bf16 GEMM tile is `vdpbf16ps`.
fn on_dot_tile() -> bool {
    crate::gemm::bf16_tile() == crate::gemm::Bf16Tile::Dot
}

/// Fetches `count` blocks of `b` from value `ahead` on (the next panel's chunk of a row, while
/// this one is dequantized).
#[inline(always)]
pub(crate) fn prefetch_blocks<Q: Element>(b: &[Q], ahead: usize, count: usize) {
    crate::memory::prefetch_span(
        b[ahead / Q::VALUES..].as_ptr(),
        count * std::mem::size_of::<Q>(),
    );
}

/// Checks a product of rows in blocks of `Q` (`mat`, `blocks` of them, `ld` values a row)
/// with `k` activation values: whole blocks, segments of whole blocks within `0..k`, rows within
/// the matrix, one output a row. Returns blocks a row, blocks the activation spans, and the
/// segments in groups.
fn block_rows<Q: Element>(
    k: usize,
    blocks: usize,
    ld: usize,
    rows: &Range<usize>,
    segs: &[(usize, usize)],
    out: &[f32],
) -> (usize, usize, Vec<(usize, usize)>) {
    assert_eq!(out.len(), rows.len(), "matvec output length");
    let block = Q::VALUES;
    assert!(
        ld.is_multiple_of(block) && k.is_multiple_of(block),
        "quantized rows of {ld} values, {k} activations: not whole blocks of {block}"
    );
    for &(s, e) in segs {
        assert!(
            s <= e && e <= k && s % block == 0 && e % block == 0,
            "segment {s}..{e} of quantized rows is not whole blocks of {block} in 0..{k}"
        );
    }
    let (ldb, kb) = (ld / block, k / block);
    if let Some(last) = rows.clone().last() {
        assert!(
            last * ldb + kb <= blocks,
            "row {last} outside a matrix of {blocks} blocks"
        );
    }
    let groups = segs.iter().map(|&(s, e)| (s / GROUP, e / GROUP)).collect();
    (ldb, kb, groups)
}

/// [`Weight::matvec_segments`] for quantized rows and an activation already quantized.
pub fn rows_q<Q: Element>(
    x: &QuantizedActivation,
    mat: &[Q],
    ld: usize,
    rows: Range<usize>,
    segs: &[(usize, usize)],
    out: &mut [f32],
    dots: Dots<Q>,
) {
    let k = x.values.len();
    let (ldb, kb, groups) = block_rows::<Q>(k, mat.len(), ld, &rows, segs, out);
    let level = isa();
    let ahead = crate::dot::BLOCKS_AHEAD;
    for (o, j) in out.iter_mut().zip(rows) {
        let row = &mat[j * ldb..j * ldb + kb];
        *o = match level {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx | Isa::Avx512 => {
                // SAFETY: the level is checked; the kernel asserts the lengths.
                unsafe { (dots.avx512)(row, x, &groups, ahead) }
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                // SAFETY: as above.
                unsafe { (dots.avx2)(row, x, &groups, ahead) }
            }
            _ => groups
                .iter()
                .fold(0f32, |sum, &(s, e)| sum + (dots.portable)(row, x, s..e)),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use moek_ir::quant::{dequantize, quantize};

    #[test]
    fn gated_dtype_names_each_weights_gated_type() {
        use half::bf16;
        use moek_ir::quant::{BlockMxfp4, BlockQ4, BlockQ8};
        use moek_ir::{DType, Kind};
        fn check<Q: Weight>() {
            for (a, kind) in [
                (DType::F32, <Q::Gated<f32> as Element>::KIND),
                (DType::Bf16, <Q::Gated<bf16> as Element>::KIND),
            ] {
                assert_eq!(
                    Kind::Plain(gated_dtype(Q::FORMAT, a)),
                    kind,
                    "{:?}",
                    Q::FORMAT
                );
            }
        }
        check::<BlockQ8<1>>();
        check::<BlockQ8<4>>();
        check::<BlockQ4<1>>();
        check::<BlockQ4<8>>();
        check::<BlockMxfp4>();
    }

    #[test]
    fn an_activation_s_step_buffers_start_on_a_cache_line() {
        let mut xq = QuantizedActivation::default();
        for n in [GROUP, 3 * GROUP, 88 * GROUP] {
            xq.quantize(&values(n, 3));
            let starts = [
                xq.values.as_ptr().addr(),
                xq.low.as_ptr().addr(),
                xq.high.as_ptr().addr(),
                xq.offsets.as_ptr().addr(),
            ];
            assert!(
                starts.iter().all(|p| p % LINE == 0),
                "{n} values: {starts:x?}"
            );
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Against f64 sums of the dequantized weights and activations: the integer path computes
    /// those exactly up to f32 sums of the block products.
    fn matches_dequantized<Q: Element>(dots: Dots<Q>) {
        // Segments of 3 and 16 blocks (the second starting on an odd block), then one of each
        // length from 1 to 17 and one of 31: every kernel's whole steps (2, 8, 4, 16 groups),
        // each count of the steps after them and a last odd group; steps span blocks of
        // several groups.
        let block = Q::VALUES;
        let mut lens = vec![3, 16];
        lens.extend((1..=17).chain([31]));
        let (rows, k) = (5, lens.iter().sum::<usize>() * block);
        let w: Vec<Q> = quantize(&values(rows * k, 1));
        let x = values(k, 2);
        let mut xq = QuantizedActivation::default();
        xq.quantize(&x);
        let xd: Vec<f64> = xq
            .values
            .iter()
            .enumerate()
            .map(|(i, &q)| f64::from(xq.scales[i / GROUP]) * f64::from(q))
            .collect();
        let wd = dequantize(&w);
        let segs: Vec<(usize, usize)> = lens
            .iter()
            .scan(0, |at, len| {
                *at += len * block;
                Some((*at - len * block, *at))
            })
            .collect();
        let mut got = vec![0f32; rows];
        rows_q(&xq, &w, k, 0..rows, &segs, &mut got, dots);
        for (j, g) in got.iter().enumerate() {
            let want: f64 = (0..k).map(|i| f64::from(wd[j * k + i]) * xd[i]).sum();
            assert!(
                (f64::from(*g) - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{}: row {j}: {g} vs {want}",
                isa().name()
            );
        }
    }

    /// The kernels read a block's groups together, so a segment starting inside a block is
    /// refused on every level, not summed wrongly on some.
    #[test]
    #[should_panic(expected = "not whole blocks of 64")]
    fn segments_inside_a_block_are_refused() {
        let w: Vec<BlockQ4<2>> = quantize(&values(4 * GROUP, 1));
        let mut xq = QuantizedActivation::default();
        xq.quantize(&values(4 * GROUP, 2));
        let segs = [(0, GROUP), (GROUP, 4 * GROUP)];
        rows_q(&xq, &w, 4 * GROUP, 0..1, &segs, &mut [0.0], dots_q4::<2>());
    }

    #[test]
    fn q8_0_rows_match_the_dequantized_sums() {
        matches_dequantized(dots_q8::<1>());
    }

    #[test]
    fn q4_0_rows_match_the_dequantized_sums() {
        matches_dequantized(dots_q4::<1>());
    }

    #[test]
    fn rows_of_larger_blocks_match_the_dequantized_sums() {
        matches_dequantized(dots_q8::<2>());
        matches_dequantized(dots_q8::<4>());
        matches_dequantized(dots_q8::<8>());
        matches_dequantized(dots_q4::<2>());
        matches_dequantized(dots_q4::<4>());
        matches_dequantized(dots_q4::<8>());
    }

    /// MXFP4 against f64 sums of the dequantized weights and the unrounded activation: f32
    /// sums apart, nothing is rounded.
    #[test]
    fn mxfp4_rows_match_the_dequantized_sums() {
        let (rows, k) = (5, 19 * GROUP);
        let w: Vec<BlockMxfp4> = quantize(&values(rows * k, 1));
        let x = values(k, 2);
        let wd = dequantize(&w);
        let segs = [(0, 3 * GROUP), (3 * GROUP, k)];
        let mut got = vec![0f32; rows];
        rows_mxfp4(&x, &w, k, 0..rows, &segs, &mut got);
        for (j, g) in got.iter().enumerate() {
            let want: f64 = (0..k)
                .map(|i| f64::from(wd[j * k + i]) * f64::from(x[i]))
                .sum();
            assert!(
                (f64::from(*g) - want).abs() <= 1e-5 * want.abs().max(1.0),
                "{}: row {j}: {g} vs {want}",
                isa().name()
            );
        }
    }

    /// The GEMM over blocks against f64 sums of the dequantized weights and the activations:
    /// nothing is rounded but the f32 sums, held to the classical bound of `k` f32 additions
    /// (`k u` times the sum of the products' magnitudes), except where bf16 tiles run (AMX or
    /// `vdpbf16ps`, for `bf16_panels`): there the reference rounds both operands to bf16 first,
    /// as the tiles do; and where the integer GEMM runs (Q8_0 and Q4_0 on AVX-512, Q4_0 on
    /// AVX2), whose activation is the row products' 8-bit one. One row (the panel path), 5 and
    /// 70 rows (the level's tiles, an edge tile, more than one block of rows on AVX2 and AMX), 150 columns (more than one AMX
    /// panel, an edge block), a reduction over more than one chunk of the tiles, rows longer
    /// than the reduction, bf16 and f16 activations.
    #[test]
    fn gemm_over_blocks_matches_the_dequantized_sums() {
        fn check<Q: Element, A: Element>(m: usize, n: usize) {
            let (k, ldb) = (40 * Q::VALUES, 41 * Q::VALUES);
            let w: Vec<Q> = quantize(&values(n * ldb, 3));
            let a: Vec<A> = values(m * k, 4).into_iter().map(A::from_f32).collect();
            let wd = dequantize(&w);
            let mut c = vec![1f32; m * n];
            gemm_blocks(&a, k, &w, ldb, &mut c, n, m, n, k);
            let tiles = m >= crate::gemm::STREAM_ROWS;
            let rounding = gemm_rounding(Q::FORMAT);
            let integer = tiles && rounding == GemmRounding::Activation8;
            let panels = tiles && !integer && on_bf16_tiles() && bf16_panels::<A, Q>();
            let r = |v: f32| match panels {
                true => f64::from(half::bf16::from_f32(v)),
                false => f64::from(v),
            };
            // The activation as the integer GEMM multiplies it: 8 bits a value, per group.
            let mut xq = QuantizedActivation::default();
            for i in 0..m {
                xq.quantize(&a[i * k..(i + 1) * k]);
                let x = |p: usize| match integer {
                    true => f64::from(xq.scales[p / GROUP]) * f64::from(xq.values[p]),
                    false => r(a[i * k + p].to_f32()),
                };
                for j in 0..n {
                    let terms = (0..k).map(|p| x(p) * r(wd[j * ldb + p]));
                    let want: f64 = 1.0 + terms.clone().sum::<f64>();
                    let bound =
                        (k + 1) as f64 * 2f64.powi(-24) * (1.0 + terms.map(f64::abs).sum::<f64>());
                    let got = f64::from(c[i * n + j]);
                    assert!(
                        (got - want).abs() <= bound,
                        "{} {m} rows: ({i}, {j}): {got} vs {want}",
                        isa().name()
                    );
                }
            }
        }
        for (m, n) in [(1, 13), (5, 13), (70, 13), (40, 150)] {
            check::<BlockQ8<1>, f32>(m, n);
            check::<BlockQ4<1>, half::bf16>(m, n);
            check::<BlockQ4<8>, f32>(m, n);
            check::<BlockQ8<4>, half::bf16>(m, n);
            check::<BlockQ4<2>, half::f16>(m, n);
            check::<BlockMxfp4, half::bf16>(m, n);
        }
    }

    /// Rows made ready once ([`GemmRows`]) give exactly what each product gives from its own
    /// gathered rows, segment by segment: the same groups quantized, the same sums.
    #[test]
    fn rows_made_ready_once_match_each_product() {
        fn check<Q: Weight, A: Element>(ids: &[usize]) {
            let (rows, k, n) = (9, 8 * Q::VALUES, 21);
            let segs = [(0, 3 * Q::VALUES), (3 * Q::VALUES, k)];
            let w: Vec<Q> = quantize(&values(n * k, 5));
            let x: Vec<A> = values(rows * k, 6).into_iter().map(A::from_f32).collect();
            let mut got = vec![0.5f32; ids.len() * n];
            GemmRows::new::<Q>(&x, rows, k).gemm(ids, &segs, &w, k, &mut got, n, n);
            let mut gathered = vec![A::from_f32(0.0); ids.len() * k];
            crate::gather_rows_into(&mut gathered, &x, k, ids.iter().copied());
            let mut want = vec![0.5f32; ids.len() * n];
            for (s0, s1) in segs {
                let b = crate::values(&w, s0..);
                Q::gemm_nt(
                    &gathered[s0..],
                    k,
                    b,
                    k,
                    &mut want,
                    n,
                    ids.len(),
                    n,
                    s1 - s0,
                );
            }
            assert_eq!(got, want, "{} rows {ids:?}", isa().name());
        }
        for ids in [&[4, 0, 8, 4, 2][..], &[1, 2], &[0, 1, 2, 3, 4, 5, 6, 7, 8]] {
            check::<BlockQ8<1>, f32>(ids);
            check::<BlockQ4<1>, half::bf16>(ids);
            check::<BlockQ4<2>, half::f16>(ids);
            check::<BlockMxfp4, half::bf16>(ids);
            check::<half::bf16, half::bf16>(ids);
        }
    }

    #[test]
    fn activation_rounding_is_within_half_a_step() {
        let x = values(3 * GROUP, 7);
        let mut xq = QuantizedActivation::default();
        xq.quantize(&x);
        for (i, &v) in x.iter().enumerate() {
            let d = xq.scales[i / GROUP];
            let got = d * f32::from(xq.values[i]);
            assert!((got - v).abs() <= d * 0.5 + 1e-7, "{v} became {got}");
        }
    }
}
