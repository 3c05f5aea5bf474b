//! GEMM: `c += a . b^T` with both operands row-major along the reduction (the checkpoint's own
//! expert layout: weights `[out, in]`, activations `[token, in]`).
//!
//! Each output's partial over `k` is computed from zero and then added to `c`, so a caller that
//! passes reduction blocks one at a time gets exactly "partials added in declared order".
//! Parallelism belongs to the caller (the generated schedule). Which path runs depends on the ISA
//! and the rows of `a`: bf16 on AMX runs tiles ([`crate::amx`]); otherwise AVX-512 runs 4 x 6 f32
//! FMA tiles over widened operands; fewer than [`STREAM_ROWS`] rows, and the portable path, run
//! dot products (one activation row: weight rows one at a time, [`dot_rows`]; else four at a
//! time). Paths differ in summation order only (each is one f32 sum per output; the primitive
//! tests bound every path against an f64 sum).

use crate::dot::{dot_rows, dotn_segments};
use crate::element::{Kind, bits16, kind};
use crate::isa::{Isa, isa};
use moek_ir::Element;

/// Rows of `b` per step of the dot-product path.
pub const TILE: usize = 4;

/// Below this many rows of `a` the product streams `b` through dot products (see [`by_dots`]).
pub const STREAM_ROWS: usize = 4;

/// `c[i*ldc + j] += sum_{p<k} a[i*lda + p] * b[j*ldb + p]` for `i < m`, `j < n`.
///
/// Panics when a slice is too short for its shape.
pub fn gemm_nt<W: Element>(
    a: &[W],
    lda: usize,
    b: &[W],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let lens = [a.len(), b.len(), c.len()];
    assert_shape("gemm_nt", lens, [lda, ldb, ldc], [m, n, k]);
    match isa() {
        _ if m < STREAM_ROWS => by_dots(a, lda, b, ldb, c, ldc, m, n, k),
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        // SAFETY: `isa()` enabled AMX for the process; the shapes were asserted above.
        Isa::Amx if kind::<W>() == Kind::Bf16 => unsafe {
            crate::amx::gemm(bits16(a), lda, bits16(b), ldb, c, ldc, m, n, k)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected; every row the tiles touch is in bounds (asserted).
        Isa::Avx512 | Isa::Amx if kind::<W>() == Kind::Bf16 && bf16_tile() == Bf16Tile::Dot => unsafe {
            avx512::gemm_dpbf16(bits16(a), lda, bits16(b), ldb, c, ldc, m, n, k)
        },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected; every row the tiles touch is in bounds (asserted).
        Isa::Avx512 | Isa::Amx => unsafe { avx512::gemm(a, lda, b, ldb, c, ldc, m, n, k) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the features were detected; every row the tiles touch is in bounds (asserted).
        Isa::Avx2 => unsafe { crate::avx2::gemm::gemm(a, lda, b, ldb, c, ldc, m, n, k) },
        _ => by_dots(a, lda, b, ldb, c, ldc, m, n, k),
    }
}

/// Panics unless operands of `lens` values (`a`, `b`, `c`) hold a product of `m` rows of `a`
/// by `n` rows of `b` over `k`, their rows `lds` values apart (`m` and `n` not zero).
pub(crate) fn assert_shape(
    what: &str,
    [a, b, c]: [usize; 3],
    [lda, ldb, ldc]: [usize; 3],
    [m, n, k]: [usize; 3],
) {
    assert!(
        k <= lda && k <= ldb && n <= ldc,
        "{what}: leading dims shorter than k or n"
    );
    assert!(a >= (m - 1) * lda + k, "{what}: a is too short");
    assert!(b >= (n - 1) * ldb + k, "{what}: b is too short");
    assert!(c >= (m - 1) * ldc + n, "{what}: c is too short");
}

/// The tile a bf16 GEMM runs on the AVX-512 level (without AMX): f32 FMAs over operands
/// widened once, or `vdpbf16ps` on the bf16 operands as stored (two products per f32 lane per
/// instruction). Which multiplies faster differs between cores (one core measured FMAs ahead
/// four to one, a Zen 5 core `vdpbf16ps` ahead two to one: docs/performance.md), so it is
/// measured once per process ([`bf16_tile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Tile {
    Fma,
    Dot,
}

/// The bf16 tile of this process: `MOEK_CPU_BF16_GEMM=fma|dot` forces one (a forced `dot` on a
/// CPU without AVX-512 BF16 panics naming it); unset, the two are timed on operands in L1 at the
/// first bf16 GEMM and the faster kept. `Fma` below the AVX-512 level (it is what AVX2 runs) and
/// on AVX-512 cores without BF16 (Cascade Lake, Ice Lake).
pub fn bf16_tile() -> Bf16Tile {
    static TILE: std::sync::OnceLock<Bf16Tile> = std::sync::OnceLock::new();
    *TILE.get_or_init(|| {
        let avx512 = matches!(isa(), Isa::Avx512 | Isa::Amx) && crate::isa::has_avx512_bf16();
        match std::env::var("MOEK_CPU_BF16_GEMM").as_deref() {
            Ok("fma") => Bf16Tile::Fma,
            Ok("dot") => {
                assert!(
                    avx512,
                    "MOEK_CPU_BF16_GEMM=dot needs AVX-512 BF16, and the level in use is {}",
                    isa().name()
                );
                Bf16Tile::Dot
            }
            Ok(other) if !other.is_empty() && other != "auto" => {
                panic!("MOEK_CPU_BF16_GEMM={other}: expected `fma`, `dot` or `auto`")
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the AVX-512 BF16 level was detected.
            _ if avx512 => unsafe { avx512::faster_tile() },
            _ => Bf16Tile::Fma,
        }
    })
}

/// Element offsets of the `tile` rows starting at row `i` (`count` of them real): edge tiles
/// repeat their last row, and the repeated results are not stored.
pub(crate) fn tile_rows<const N: usize>(ld: usize, i: usize, count: usize) -> [usize; N] {
    std::array::from_fn(|t| (i + t.min(count - 1)) * ld)
}

/// The register tiles' fetch of the next panel: while the tiles multiply a chunk of one panel
/// of weight rows, they fetch the same chunk of the next panel into L2, each tile its share of
/// every row's lines, one line every few steps. Fetched in one burst as a chunk widened, the
/// misses filled the line buffers and the widening waited on them (AVX-512 prefill 212 -> 264
/// GFLOP/s, docs/performance.md).
#[derive(Clone, Copy)]
pub(crate) struct Ahead<const NR: usize> {
    rows: [*const u8; NR],
    lines: usize,
}

impl<const NR: usize> Ahead<NR> {
    /// Tile `t` of `tiles`' share of values `kc..kc + len` of the rows of `b` at values `next`
    /// (whole blocks).
    pub(crate) fn share<W: Element>(
        b: &[W],
        next: [usize; NR],
        (kc, len): (usize, usize),
        (t, tiles): (usize, usize),
    ) -> Self {
        let row_lines = (len / W::VALUES * size_of::<W>()).div_ceil(64);
        let (l0, l1) = (row_lines * t / tiles, row_lines * (t + 1) / tiles);
        Ahead {
            rows: next.map(|o| {
                let row = b.as_ptr().wrapping_add((o + kc) / W::VALUES);
                row.cast::<u8>().wrapping_add(64 * l0)
            }),
            lines: l1 - l0,
        }
    }
}

/// An [`Ahead`]'s lines issued over a tile's `steps` steps, one every `every`.
pub(crate) struct Fetch<const NR: usize> {
    ahead: Ahead<NR>,
    every: usize,
    issued: usize,
    countdown: usize,
}

impl<const NR: usize> Fetch<NR> {
    pub(crate) fn new(ahead: Option<Ahead<NR>>, steps: usize) -> Self {
        let ahead = ahead.unwrap_or(Ahead {
            rows: [std::ptr::null(); NR],
            lines: 0,
        });
        let every = (steps / (NR * ahead.lines).max(1)).max(1);
        Fetch {
            ahead,
            every,
            issued: 0,
            countdown: 0,
        }
    }

    fn issue(&mut self) {
        let (r, l) = (self.issued % NR, self.issued / NR);
        crate::memory::prefetch_l2(self.ahead.rows[r].wrapping_add(64 * l));
        self.issued += 1;
    }

    /// Called once a step: a line when its turn comes.
    #[inline(always)]
    pub(crate) fn step(&mut self) {
        if self.issued < NR * self.ahead.lines {
            if self.countdown == 0 {
                self.issue();
                self.countdown = self.every;
            }
            self.countdown -= 1;
        }
    }

    /// The lines the steps left (when there were fewer steps than lines).
    pub(crate) fn rest(&mut self) {
        while self.issued < NR * self.ahead.lines {
            self.issue();
        }
    }
}

/// Rows of `a` per block of the f32 register-tile GEMMs (AVX-512 and AVX2): a block's widened
/// chunk (MC x 1024 f32, 256 KiB) stays in L2 while every weight panel passes; a whole
/// 512-token prompt (5.8 MB widened) would be read from L3 once per panel. On AVX-512 the
/// blocks took 2-layer 26B-A4B bf16 prefill from 339 to 503 tokens/s (docs/performance.md).
pub(crate) const MC: usize = 64;

/// `len` elements of `buf` starting on a 64-byte boundary (scratch for widened operands: a
/// 64-byte load that straddles two cache lines costs two).
pub(crate) fn aligned(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len + 16, 0.0);
    let skip = buf.as_ptr().align_offset(64);
    &mut buf[skip..skip + len]
}

/// Dot products, four rows of `b` at a time against each row of `a`, the next four prefetched
/// (one row of `a`: [`dot_rows`], one row of `b` at a time):
/// the portable path, and the streaming one for fewer than [`STREAM_ROWS`] rows (decode), where
/// each weight is used too few times to pay for widening or packing it.
#[allow(clippy::too_many_arguments)]
fn by_dots<W: Element>(
    a: &[W],
    lda: usize,
    b: &[W],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    if m == 1 {
        // One activation row shares nothing between weight rows: stream them one at a time.
        return dot_rows(&a[..k], b, ldb, 0..n, &[(0, k)], |j, v| c[j] += v);
    }
    for j0 in (0..n).step_by(TILE) {
        let nj = TILE.min(n - j0);
        let boff = tile_rows::<TILE>(ldb, j0, nj);
        let next = (j0 + TILE < n).then(|| {
            tile_rows::<TILE>(ldb, j0 + TILE, TILE.min(n - j0 - TILE)).map(|bo| &b[bo..bo + k])
        });
        for i0 in 0..m {
            let ao = i0 * lda;
            let rows = boff.map(|bo| &b[bo..bo + k]);
            let d = dotn_segments::<W, W, TILE>(&a[ao..ao + k], rows, &[(0, k)], next);
            let crow = &mut c[i0 * ldc + j0..][..nj];
            for tj in 0..nj {
                crow[tj] += d[tj];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    //! f32 FMA tiles over operands widened once: activations (`a`, few rows, reused by every
    //! panel) are widened for the whole call, weights (`b`, streamed once) one panel chunk at a
    //! time. On the core this was first measured on, two 16-lane FMAs per cycle outran
    //! `vdpbf16ps` by about four to one, so the GEMM widens bf16 instead of using BF16 dot
    //! products. That does not hold everywhere: on a Zen 5 core `vdpbf16ps` gave about twice
    //! the FMAs' rate (docs/performance.md), so the choice belongs to a per-machine measurement.

    use super::*;
    use crate::dot::avx512::{BF16, F16, F32, load16, size_of_kind};
    use std::arch::x86_64::*;

    /// Rows of `a` per register tile.
    const MR: usize = 4;
    /// Rows of `b` per register tile (4 x 6 = 24 accumulators of the 32 registers).
    const NR: usize = 6;
    /// Reduction steps per chunk: a widened chunk of a 6-row panel (24 KiB) stays in L1 while
    /// every tile of `a` passes. Accumulators persist across chunks (never reduced early), so the
    /// sums are those of one unchunked pass.
    const KC: usize = 1024;
    /// Panel row stride: KC plus one cache line, so the six rows do not alias 4 KiB apart.
    const PANEL_LD: usize = KC + 16;

    type Acc = [[__m512; NR]; MR];

    /// `b` plain (then of `a`'s type) or in blocks, dequantized exactly as its chunks are
    /// widened ([`dequantize_f32`]); `ldb` and `k` count values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
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
        let k16 = k.next_multiple_of(16);
        SCRATCH.with_borrow_mut(|(a32, panel)| {
            // Blocks of MC rows of `a`, each against all of `b`: every output is still one sum
            // over the whole reduction, in the same order.
            for m0 in (0..m).step_by(MC) {
                let (a, c, m) = (&a[m0 * lda..], &mut c[m0 * ldc..], MC.min(m - m0));
                // SAFETY: forwarded from the caller, for rows m0.. of `a` and `c`.
                unsafe { gemm_in(a, lda, b, ldb, c, ldc, m, n, k, k16, a32, panel) }
            }
        });
    }

    thread_local! {
        /// Per-thread widened operands, reused across calls (no page faults per expert).
        static SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<f32>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn gemm_in<A: Element, W: Element>(
        a: &[A],
        lda: usize,
        b: &[W],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
        k16: usize,
        a32: &mut Vec<f32>,
        panel: &mut Vec<f32>,
    ) {
        // Activations widened once, rows padded with zeros to whole 16-lane steps. Both buffers
        // start on a cache line: a 64-byte load that straddles two lines costs two.
        let a32 = aligned(a32, m * k16);
        a32.fill(0.0);
        for i in 0..m {
            // SAFETY: row i of `a` holds `k` elements (asserted by the caller).
            unsafe { widen::<A>(a.as_ptr().add(i * lda), k, &mut a32[i * k16..i * k16 + k]) };
        }
        let tiles = m.div_ceil(MR);
        let mut acc: Vec<Acc> = vec![[[_mm512_setzero_ps(); NR]; MR]; tiles];
        let panel = aligned(panel, NR * PANEL_LD);
        for j0 in (0..n).step_by(NR) {
            let nj = NR.min(n - j0);
            let brows = tile_rows::<NR>(ldb, j0, nj);
            let next = (j0 + NR < n).then(|| tile_rows::<NR>(ldb, j0 + NR, NR.min(n - j0 - NR)));
            acc.iter_mut()
                .for_each(|t| *t = [[_mm512_setzero_ps(); NR]; MR]);
            for kc in (0..k).step_by(KC) {
                let len = KC.min(k - kc);
                let steps = len.div_ceil(16) * 16;
                for (r, &off) in brows.iter().enumerate() {
                    let dst = &mut panel[r * PANEL_LD..r * PANEL_LD + steps];
                    dst[len..].fill(0.0);
                    if W::VALUES > 1 {
                        // SAFETY: row `j0 + r` of `b` holds `k` values from `off`.
                        unsafe { dequantize_f32(b, off + kc, &mut dst[..len]) };
                        continue;
                    }
                    // SAFETY: row `j0 + r` of `b` holds `k` elements from `off`.
                    unsafe { widen::<W>(b.as_ptr().add(off + kc), len, &mut dst[..len]) };
                }
                for (t, tile_acc) in acc.iter_mut().enumerate() {
                    let ahead = next.map(|nx| Ahead::share(b, nx, (kc, len), (t, tiles)));
                    let arows = tile_rows::<MR>(k16, t * MR, MR.min(m - t * MR));
                    // SAFETY: a32 rows hold k16 >= kc + steps elements; panel rows hold KC.
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
            add_tiles(&acc, c, ldc, m, j0, nj);
        }
    }

    /// Each tile's 16-lane sums reduced and added to `c`'s rows of `a` (`m` in all) and its
    /// columns `j0..j0 + nj` (the rows and columns past the edges are not stored).
    #[target_feature(enable = "avx512f")]
    fn add_tiles(acc: &[Acc], c: &mut [f32], ldc: usize, m: usize, j0: usize, nj: usize) {
        for (t, tile_acc) in acc.iter().enumerate() {
            let (i0, mi) = (t * MR, MR.min(m - t * MR));
            for ti in 0..mi {
                let crow = &mut c[(i0 + ti) * ldc + j0..][..nj];
                for tj in 0..nj {
                    crow[tj] += _mm512_reduce_add_ps(tile_acc[ti][tj]);
                }
            }
        }
    }

    /// Reduction steps per chunk of the `vdpbf16ps` GEMM: six rows of 1024 bf16 (12 KiB) stay in
    /// L1 while every tile of `a` passes (2048 measured the same at the 26B-A4B's sizes).
    const KC_BF16: usize = 1024;

    /// `c += a . b^T` for bf16 `a` and `b` (as bits) on `vdpbf16ps`: 4 x 6 tiles of 16-lane
    /// accumulators over 32 bf16 a step, read in place (nothing widened or packed). Each lane
    /// adds its two exact products in turn (round to nearest even; subnormals flushed, which
    /// moves a sum by less than 2^-126), so a sum differs from the FMA path's in order only.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn gemm_dpbf16(
        a: &[u16],
        lda: usize,
        b: &[u16],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
    ) {
        let tiles = m.div_ceil(MR);
        let mut acc: Vec<Acc> = vec![[[_mm512_setzero_ps(); NR]; MR]; tiles];
        for j0 in (0..n).step_by(NR) {
            let nj = NR.min(n - j0);
            let brows = tile_rows::<NR>(ldb, j0, nj);
            let next = (j0 + NR < n).then(|| tile_rows::<NR>(ldb, j0 + NR, NR.min(n - j0 - NR)));
            acc.iter_mut()
                .for_each(|t| *t = [[_mm512_setzero_ps(); NR]; MR]);
            for kc in (0..k).step_by(KC_BF16) {
                let len = KC_BF16.min(k - kc);
                for (t, tile_acc) in acc.iter_mut().enumerate() {
                    let arows = tile_rows::<MR>(lda, t * MR, MR.min(m - t * MR));
                    // The first tile fetches the next panel's chunk as it goes.
                    let ahead = next
                        .filter(|_| t == 0)
                        .map(|nx| nx.map(|o| b[o + kc..].as_ptr()));
                    // SAFETY: rows of `a` and `b` hold `k >= kc + len` elements (asserted by
                    // the caller); `ahead` rows likewise.
                    unsafe {
                        dot_tile(
                            arows.map(|o| a.as_ptr().add(o + kc)),
                            brows.map(|o| b.as_ptr().add(o + kc)),
                            len,
                            tile_acc,
                            ahead,
                        )
                    };
                }
            }
            add_tiles(&acc, c, ldc, m, j0, nj);
        }
    }

    /// Row stride of [`gemm_dpbf16_blocks`]' bf16 panel: a chunk plus one cache line, so its six
    /// rows do not alias 4 KiB apart.
    const PANEL_LD_BF16: usize = KC_BF16 + 32;

    /// [`gemm_dpbf16`] for `b` in blocks: each chunk of a panel of six rows dequantized and
    /// rounded to bf16 into L1 ([`dequantize_bf16`]), `a` rounded to bf16 once per call (a bf16
    /// `a` is copied as it is). Both roundings are to nearest even, at most 2^-9 of a value;
    /// [`crate::quant::gemm_blocks`] says where that is allowed.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(crate) unsafe fn gemm_dpbf16_blocks<A: Element, W: Element>(
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
        BF16_SCRATCH.with_borrow_mut(|(a16, panel)| {
            // SAFETY: `m` rows of `k` elements, `lda` apart, in `a` (asserted by the caller).
            unsafe { round_rows_to_bf16(a, lda, m, k, a16) };
            panel.resize(NR * PANEL_LD_BF16 + 32, 0);
            let skip = panel.as_ptr().align_offset(64);
            let panel = &mut panel[skip..skip + NR * PANEL_LD_BF16];
            let tiles = m.div_ceil(MR);
            let mut acc: Vec<Acc> = vec![[[_mm512_setzero_ps(); NR]; MR]; tiles];
            for j0 in (0..n).step_by(NR) {
                let nj = NR.min(n - j0);
                let brows = tile_rows::<NR>(ldb, j0, nj);
                let next =
                    (j0 + NR < n).then(|| tile_rows::<NR>(ldb, j0 + NR, NR.min(n - j0 - NR)));
                acc.iter_mut()
                    .for_each(|t| *t = [[_mm512_setzero_ps(); NR]; MR]);
                for kc in (0..k).step_by(KC_BF16) {
                    let len = KC_BF16.min(k - kc);
                    for (r, &off) in brows.iter().enumerate() {
                        let ahead = next.map(|nx| nx[r] + kc);
                        let dst = &mut panel[r * PANEL_LD_BF16..r * PANEL_LD_BF16 + len];
                        // SAFETY: row `j0 + r` of `b` holds `k` values from `off`.
                        unsafe { dequantize_bf16(b, off + kc, dst, ahead) };
                    }
                    for (t, tile_acc) in acc.iter_mut().enumerate() {
                        let arows = tile_rows::<MR>(k, t * MR, MR.min(m - t * MR));
                        // SAFETY: rows of `a16` hold `k >= kc + len` values, panel rows `len`.
                        unsafe {
                            dot_tile(
                                arows.map(|o| a16.as_ptr().add(o + kc)),
                                std::array::from_fn(|r| panel.as_ptr().add(r * PANEL_LD_BF16)),
                                len,
                                tile_acc,
                                None,
                            )
                        };
                    }
                }
                add_tiles(&acc, c, ldc, m, j0, nj);
            }
        });
    }

    /// [`crate::amx::gemm`] for `b` in blocks: [`crate::amx::PANEL`] rows at a time
    /// dequantized and rounded to bf16 ([`dequantize_bf16`]) into a panel that stays in L2
    /// while every token passes, `a` rounded to bf16 and packed once per call. The roundings
    /// are [`gemm_dpbf16_blocks`]'; the tiles multiply eight times as much a cycle as
    /// `vdpbf16ps`, so dequantizing is most of the cost.
    ///
    /// # Safety
    /// AMX was enabled ([`crate::amx::enable`]); the shapes were asserted by the caller.
    #[cfg(target_os = "linux")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub(crate) unsafe fn gemm_amx_blocks<A: Element, W: Element>(
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
        /// Rows of blocks dequantized to bf16 a panel at a time.
        struct Dequantized<'b, W> {
            b: &'b [W],
            ldb: usize,
            panel: &'b mut Vec<u16>,
        }
        impl<W: Element> crate::amx::WeightPanels for Dequantized<'_, W> {
            fn panel(&mut self, j0: usize, nj: usize, k: usize) -> (&[u16], usize) {
                self.panel.resize(nj * k, 0);
                for (r, row) in self.panel.chunks_exact_mut(k).enumerate() {
                    // SAFETY: AVX-512 BF16 is present where AMX is; row `j0 + r` of `b` holds
                    // `k` values from its start.
                    unsafe { dequantize_bf16(self.b, (j0 + r) * self.ldb, row, None) };
                }
                (self.panel, k)
            }
        }
        BF16_SCRATCH.with_borrow_mut(|(a16, panel)| {
            // SAFETY: `m` rows of `k` elements, `lda` apart, in `a` (asserted by the caller).
            unsafe { round_rows_to_bf16(a, lda, m, k, a16) };
            let mut panels = Dequantized { b, ldb, panel };
            // SAFETY: AMX is enabled (the caller's contract); each panel holds its rows.
            unsafe { crate::amx::gemm_panels(a16, k, &mut panels, c, ldc, m, n, k) };
        });
    }

    thread_local! {
        /// Per-thread operands of the bf16 GEMMs over blocks: `a` in bf16 and the bf16 panel.
        static BF16_SCRATCH: std::cell::RefCell<(Vec<u16>, Vec<u16>)> = const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    }

    /// Values `at..at + dst.len()` of `b` (whole blocks) rounded to bf16 into `dst` (each once,
    /// to nearest even), fetching as many bytes from value `ahead` on alongside.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn dequantize_bf16<W: Element>(
        b: &[W],
        at: usize,
        dst: &mut [u16],
        ahead: Option<usize>,
    ) {
        let out = dst.as_mut_ptr();
        // SAFETY: `dst` holds the values `at..at + dst.len()`, 16 at a time.
        unsafe {
            dequantize_lanes(b, at, dst.len(), ahead, |i, x| {
                let bits: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(x));
                _mm256_storeu_si256(out.add(i).cast::<__m256i>(), bits);
            })
        }
    }

    /// Values `at..at + dst.len()` of `b` (whole blocks), exactly, into `dst`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn dequantize_f32<W: Element>(b: &[W], at: usize, dst: &mut [f32]) {
        let out = dst.as_mut_ptr();
        // SAFETY: `dst` holds the values `at..at + dst.len()`, 16 at a time.
        unsafe {
            dequantize_lanes(b, at, dst.len(), None, |i, x| {
                _mm512_storeu_ps(out.add(i), x)
            })
        }
    }

    /// Values `at..at + len` of `b` (whole blocks), exactly (each a small integer times its
    /// block's f16 scale, or an e2m1 value times its power of two), 16 at a time: `put(i, x)`
    /// takes values `i..i + 16` relative to `at`. A block's scale is broadcast once and its
    /// integers or e2m1 codes widened to 16 f32 lanes at a time. Fetches as many bytes from
    /// value `ahead` on alongside.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn dequantize_lanes<W: Element>(
        b: &[W],
        at: usize,
        len: usize,
        ahead: Option<usize>,
        mut put: impl FnMut(usize, __m512),
    ) {
        use moek_ir::quant::{E2M1, E8M0_POWERS, GROUP};
        use moek_ir::{BlockFormat, Kind};
        let v = W::VALUES;
        let blocks = &b[at / v..(at + len) / v];
        if let Some(ahead) = ahead {
            crate::quant::prefetch_blocks(b, ahead, blocks.len());
        }
        let bytes: &[u8] = bytemuck::cast_slice(blocks);
        let f16_scale = |p: *const u8| {
            // SAFETY: a Q8_0 or Q4_0 block starts with its f16 scale.
            let bits = i32::from(unsafe { p.cast::<u16>().read_unaligned() });
            _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)))
        };
        let low = _mm_set1_epi8(0x0f);
        let nibbles = |q: __m128i| {
            [
                _mm_and_si128(q, low),
                _mm_and_si128(_mm_srli_epi16(q, 4), low),
            ]
        };
        // SAFETY: E2M1 holds 16 values.
        let e2m1 = unsafe { _mm512_loadu_ps(E2M1.as_ptr()) };
        for (i, blk) in bytes.chunks_exact(std::mem::size_of::<W>()).enumerate() {
            let (p, o) = (blk.as_ptr(), i * v);
            // SAFETY: a block of `W` is its scale then its groups' bytes (`repr(C)`,
            // moek_ir::quant), `size_of::<W>()` bytes: every load below is inside `blk`.
            unsafe {
                match W::KIND {
                    Kind::Plain(d) => unreachable!("{d} is not a block format"),
                    Kind::Blocks(BlockFormat::Q8_0) => {
                        let d = f16_scale(p);
                        for h in 0..v / 16 {
                            let q = _mm_loadu_si128(p.add(2 + 16 * h).cast::<__m128i>());
                            let x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q));
                            put(o + 16 * h, _mm512_mul_ps(d, x));
                        }
                    }
                    Kind::Blocks(BlockFormat::Q4_0) => {
                        let (d, eight) = (f16_scale(p), _mm512_set1_epi32(8));
                        for g in 0..v / GROUP {
                            let q = _mm_loadu_si128(p.add(2 + 16 * g).cast::<__m128i>());
                            for (h, n) in nibbles(q).into_iter().enumerate() {
                                let s = _mm512_sub_epi32(_mm512_cvtepu8_epi32(n), eight);
                                put(
                                    o + GROUP * g + 16 * h,
                                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(s)),
                                );
                            }
                        }
                    }
                    Kind::Blocks(BlockFormat::Mxfp4) => {
                        let d = _mm512_set1_ps(E8M0_POWERS[usize::from(*p)]);
                        let q = _mm_loadu_si128(p.add(1).cast::<__m128i>());
                        for (h, n) in nibbles(q).into_iter().enumerate() {
                            let x = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(n), e2m1);
                            put(o + 16 * h, _mm512_mul_ps(d, x));
                        }
                    }
                }
            }
        }
    }

    /// Rows `0..m` of `a` (`lda` apart, `k` elements each) rounded to bf16, packed `k` apart.
    ///
    /// # Safety
    /// `a` holds the rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn round_rows_to_bf16<A: Element>(
        a: &[A],
        lda: usize,
        m: usize,
        k: usize,
        a16: &mut Vec<u16>,
    ) {
        a16.clear();
        a16.resize(m * k, 0);
        for (i, row) in a16.chunks_exact_mut(k).enumerate() {
            // SAFETY: row i of `a` holds `k` elements (the caller's contract).
            unsafe { round_to_bf16(a.as_ptr().add(i * lda), row) };
        }
    }

    /// `dst[i] = bf16(src[i])` for `dst.len()` plain elements, rounded to nearest even (bf16
    /// copied as it is).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn round_to_bf16<T: Element>(src: *const T, dst: &mut [u16]) {
        let p = src.cast::<u8>();
        let mut i = 0;
        while i < dst.len() {
            let n = 16.min(dst.len() - i);
            let m = crate::dot::avx512::mask16(n);
            // SAFETY: `n` elements remain at `src + i`; `dst` holds them; masked lanes are not
            // touched.
            unsafe {
                let round = |v: __m512| -> __m256i { std::mem::transmute(_mm512_cvtneps_pbh(v)) };
                let bits = match kind::<T>() {
                    Kind::Bf16 => _mm256_maskz_loadu_epi16(m, p.add(2 * i).cast::<i16>()),
                    Kind::F16 => round(load16::<F16>(p.add(2 * i), n)),
                    Kind::F32 => round(load16::<F32>(p.add(4 * i), n)),
                };
                _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(i).cast::<i16>(), m, bits);
            }
            i += n;
        }
    }

    /// `len` bf16 steps of a 4 x 6 tile on `vdpbf16ps`, the last step masked; prefetches the
    /// `ahead` rows alongside.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn dot_tile(
        a: [*const u16; MR],
        b: [*const u16; NR],
        len: usize,
        acc_io: &mut Acc,
        ahead: Option<[*const u16; NR]>,
    ) {
        let mut acc = *acc_io;
        let mut step = |p: usize, mask: __mmask32| {
            // SAFETY: every row holds `len` elements; masked lanes are not read.
            unsafe {
                if let Some(ahead) = ahead {
                    for r in ahead {
                        _mm_prefetch::<_MM_HINT_T0>(r.add(p).cast::<i8>());
                    }
                }
                let load = |r: *const u16| -> __m512bh {
                    std::mem::transmute(_mm512_maskz_loadu_epi16(mask, r.add(p).cast::<i16>()))
                };
                let bv: [__m512bh; NR] = b.map(load);
                for i in 0..MR {
                    let av = load(a[i]);
                    for j in 0..NR {
                        acc[i][j] = _mm512_dpbf16_ps(acc[i][j], av, bv[j]);
                    }
                }
            }
        };
        let whole = len / 32 * 32;
        for p in (0..whole).step_by(32) {
            step(p, u32::MAX);
        }
        if whole < len {
            step(whole, (1u32 << (len - whole)) - 1);
        }
        *acc_io = acc;
    }

    /// The faster tile on this core: each runs a 4 x 6 tile over 1024 steps of operands in L1,
    /// 400 times a round (about a third of a millisecond), rounds of the two interleaved after
    /// one of each to wake the 512-bit units; the best round of five each decides.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn faster_tile() -> Bf16Tile {
        const K: usize = 1024;
        let (a16, b16) = (vec![0x3f80u16; MR * K], vec![0x3f80u16; NR * K]);
        let (a32, b32) = (vec![1f32; MR * K], vec![1f32; NR * K]);
        let mut acc = [[_mm512_setzero_ps(); NR]; MR];
        let mut round = |dot: bool| {
            let t = std::time::Instant::now();
            for _ in 0..400 {
                // SAFETY: every row holds K elements; both tiles do MR x NR x K multiply-adds
                // (the FMA tile in 16 f32 steps, `vdpbf16ps` in 32 bf16 ones).
                unsafe {
                    match dot {
                        true => dot_tile(
                            std::array::from_fn(|i| a16.as_ptr().add(i * K)),
                            std::array::from_fn(|j| b16.as_ptr().add(j * K)),
                            K,
                            &mut acc,
                            None,
                        ),
                        false => fma_tile(
                            std::array::from_fn(|i| a32.as_ptr().add(i * K)),
                            std::array::from_fn(|j| b32.as_ptr().add(j * K)),
                            K,
                            &mut acc,
                            None,
                        ),
                    }
                }
            }
            t.elapsed()
        };
        round(true);
        round(false);
        let (mut dot, mut fma) = (std::time::Duration::MAX, std::time::Duration::MAX);
        for _ in 0..5 {
            dot = dot.min(round(true));
            fma = fma.min(round(false));
        }
        std::hint::black_box(acc);
        match dot < fma {
            true => Bf16Tile::Dot,
            false => Bf16Tile::Fma,
        }
    }

    /// `dst[i] = src[i] as f32` for `len` elements.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn widen<W: Element>(src: *const W, len: usize, dst: &mut [f32]) {
        let p = src.cast::<u8>();
        // Sixteen elements from `i`, `n` of them read (a constant 16 in the whole steps, so
        // their loads and stores carry no mask to compute).
        let mut step = |i: usize, n: usize| {
            // SAFETY: `n` elements remain at `src + i`; `dst` holds `len`.
            unsafe {
                let v = match kind::<W>() {
                    Kind::Bf16 => load16::<BF16>(p.add(2 * i), n),
                    Kind::F16 => load16::<F16>(p.add(2 * i), n),
                    Kind::F32 => load16::<F32>(p.add(size_of_kind(F32) * i), n),
                };
                _mm512_mask_storeu_ps(dst.as_mut_ptr().add(i), crate::dot::avx512::mask16(n), v);
            }
        };
        let whole = len / 16 * 16;
        for i in (0..whole).step_by(16) {
            step(i, 16);
        }
        if whole < len {
            step(whole, len - whole);
        }
    }

    /// `steps` (a multiple of 16) f32 steps of a 4 x 6 tile, fetching `ahead` as it goes.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn fma_tile(
        a: [*const f32; MR],
        b: [*const f32; NR],
        steps: usize,
        acc_io: &mut Acc,
        ahead: Option<Ahead<NR>>,
    ) {
        let mut acc = *acc_io;
        let mut fetch = Fetch::new(ahead, steps / 16);
        let mut p = 0;
        while p < steps {
            fetch.step();
            // SAFETY: every row holds `steps` elements.
            unsafe {
                let bv: [__m512; NR] = b.map(|r| _mm512_loadu_ps(r.add(p)));
                for i in 0..MR {
                    let av = _mm512_loadu_ps(a[i].add(p));
                    for j in 0..NR {
                        acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
                    }
                }
            }
            p += 16;
        }
        fetch.rest();
        *acc_io = acc;
    }
}
