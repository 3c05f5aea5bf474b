//! bf16 GEMM on AMX tiles (`tdpbf16ps`: a 16 x 16 f32 tile += 16 x 32 bf16 times 32 x 16 bf16).
//!
//! Measured on this project's machines: about 1.7 TMAC/s per core from registers, sixteen times
//! the two f32 FMA ports; prefill's GEMMs become a matter of feeding the tiles. bf16 weights
//! load into tiles in place, weights in blocks from a panel dequantized to bf16 in L2
//! ([`WeightPanels`]); activations are packed once per call. Each 32 x 32 output block keeps four
//! accumulator tiles over the whole reduction, so every output's partial is one f32 sum from
//! zero, added to `c` at the end (as the other paths do).
//! Rust has no stable AMX intrinsics: the four instructions used are written as `asm!`.

use std::sync::OnceLock;

/// Asks Linux for the AMX tile state, once per process; false where the CPU or OS lacks it.
pub fn enable() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            // CPUID leaf 7: EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
            // CPUID leaf 7 reports zeros on CPUs too old to have it.
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            if edx & (1 << 22) == 0 || edx & (1 << 24) == 0 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a request for permission; it changes nothing but the process's allowed
            // register state, and fails cleanly on kernels without AMX support.
            unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// Weight rows (output columns) per panel: 128 x 2816 bf16 is 704 KiB, held in L2 while every
/// block of activations passes.
pub(crate) const PANEL: usize = 128;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub(crate) use tiles::{WeightPanels, configure, gemm, gemm_panels, release};

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tiles {
    use super::PANEL;
    use std::arch::asm;
    use std::cell::RefCell;

    /// Rows of a tile, and bf16 per tile row (64 bytes).
    const TR: usize = 16;
    const TK: usize = 32;
    /// Reduction steps ahead that the next tiles' rows are prefetched. Tile registers are not
    /// renamed, so a tile load waits for the products reading the previous one: loads that hit
    /// L1 keep that wait short (measured: 15-25% more GMAC/s on 32 x 1408 x 2816 and
    /// 512 x 2816 x 2112; 2 and 8 steps ahead did no better).
    const AHEAD: usize = 4;
    /// One tile in u32 pairs.
    const TILE: usize = TR * TK / 2;

    /// The tile configuration: palette 1, eight tiles of 16 rows x 64 bytes.
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    const CONFIG: Config = {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut t = 0;
        while t < 8 {
            c[16 + 2 * t] = 64;
            c[48 + t] = TR as u8;
            t += 1;
        }
        Config(c)
    };

    thread_local! {
        /// Per-thread packed activations and padded edge weights, reused across calls.
        static SCRATCH: RefCell<(Vec<u32>, Vec<u16>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    }

    /// `c[i*ldc + j] += sum_{p<k} a[i*lda + p] * b[j*ldb + p]` over bf16 bits.
    ///
    /// The tiles compute `c^T`: weight rows are the tiles' first operand and load straight from
    /// `b` (a tile row is 64 contiguous bytes of a weight row), so the weights are never copied;
    /// the activations, few and reused by every weight row, are packed once into the
    /// pair-interleaved layout of the second operand.
    ///
    /// # Safety
    /// [`super::enable`] returned true; the slices hold the shapes (the caller asserted them).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
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
        let mut b = InPlace { b, ldb };
        // SAFETY: the caller's contract.
        unsafe { gemm_panels(a, lda, &mut b, c, ldc, m, n, k) }
    }

    /// Weight rows for the tiles, [`PANEL`] at a time.
    pub(crate) trait WeightPanels {
        /// Rows `j0..j0 + nj` of the weights as bf16 bits, `k` values each, and their stride.
        fn panel(&mut self, j0: usize, nj: usize, k: usize) -> (&[u16], usize);
    }

    /// bf16 weights, read where they are.
    struct InPlace<'b> {
        b: &'b [u16],
        ldb: usize,
    }

    impl WeightPanels for InPlace<'_> {
        fn panel(&mut self, j0: usize, _: usize, _: usize) -> (&[u16], usize) {
            (&self.b[j0 * self.ldb..], self.ldb)
        }
    }

    /// [`gemm`] over weights that `b` gives a panel at a time, the activations packed once
    /// for every panel.
    ///
    /// # Safety
    /// [`super::enable`] returned true; `a` holds `m` rows of `k`, `lda` apart; `c` holds `m`
    /// rows of `n`, `ldc` apart; every panel `b` gives holds its rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn gemm_panels(
        a: &[u16],
        lda: usize,
        b: &mut impl WeightPanels,
        c: &mut [f32],
        ldc: usize,
        m: usize,
        n: usize,
        k: usize,
    ) {
        let kb_n = k.div_ceil(TK);
        let k32 = kb_n * TK;
        let m32 = m.next_multiple_of(2 * TR);
        SCRATCH.with_borrow_mut(|(ap, edge)| {
            pack_a(a, lda, m, k, m32, kb_n, ap);
            let mut out = [0f32; 4 * TR * TR];
            // SAFETY: AMX was enabled for the process (the caller's contract).
            unsafe { configure() };
            for p0 in (0..n).step_by(PANEL) {
                let p1 = (p0 + PANEL).min(n);
                let (panel, ldb) = b.panel(p0, p1 - p0, k);
                assert!(
                    ldb >= k && panel.len() >= (p1 - p0 - 1) * ldb + k,
                    "a panel of {} rows of {k} in {} values, {ldb} apart",
                    p1 - p0,
                    panel.len()
                );
                for i0 in (0..m32).step_by(2 * TR) {
                    for j0 in (p0..p1).step_by(2 * TR) {
                        let nj = (p1 - j0).min(2 * TR);
                        let rows = &panel[(j0 - p0) * ldb..];
                        // Whole blocks read the weights in place; a block past `n` or with a
                        // ragged reduction is copied, zero-padded, first (no read past a row).
                        let (w, ld) = if nj == 2 * TR && k.is_multiple_of(TK) {
                            (rows.as_ptr(), ldb)
                        } else {
                            edge.clear();
                            edge.resize(2 * TR * k32, 0);
                            for j in 0..nj {
                                edge[j * k32..j * k32 + k]
                                    .copy_from_slice(&rows[j * ldb..j * ldb + k]);
                            }
                            (edge.as_ptr(), k32)
                        };
                        let x = ap[(i0 / TR) * kb_n * TILE..].as_ptr();
                        // SAFETY: 32 weight rows of `ld` u16 (k32 readable) at `w`; two token
                        // tiles columns of `kb_n` packed tiles at `x`.
                        unsafe { block(w, ld, x, kb_n, &mut out) };
                        // out holds c^T: tile q covers weight rows (q/2)*16.. and tokens (q%2)*16..
                        let mi = (m - i0).min(2 * TR);
                        for (q, tile) in out.chunks_exact(TR * TR).enumerate() {
                            let (rj, ci) = ((q / 2) * TR, (q % 2) * TR);
                            let (rows, cols) = (mi.saturating_sub(ci), nj.saturating_sub(rj));
                            if rows > 0 && cols > 0 {
                                let at = (i0 + ci) * ldc + j0 + rj;
                                // SAFETY: AVX-512 is present where AMX is; `c` holds `rows`
                                // rows of `cols` from `at`, `ldc` apart.
                                unsafe { add_transposed(tile, &mut c[at..], ldc, rows, cols) };
                            }
                        }
                    }
                }
            }
            // SAFETY: the tiles were configured above.
            unsafe { release() };
        });
    }

    /// Configures this thread's tiles: eight of 16 rows x 64 bytes.
    ///
    /// # Safety
    /// [`super::enable`] returned true.
    pub(crate) unsafe fn configure() {
        // SAFETY: the caller's contract; the configuration is valid.
        unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
    }

    /// Releases this thread's tile state.
    ///
    /// # Safety
    /// The tiles were configured ([`configure`]).
    pub(crate) unsafe fn release() {
        // SAFETY: the caller's contract.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// Packs activations into tiles of the second operand: tile `(it, kb)` holds, in its row
    /// `r`, the pairs `a[it*16 + ii][kb*32 + 2r .. + 2]` for `ii < 16` (zero past `m` or `k`):
    /// the transpose of 16 rows' 16 pairs, one [`transpose`] a tile.
    fn pack_a(
        a: &[u16],
        lda: usize,
        m: usize,
        k: usize,
        m32: usize,
        kb_n: usize,
        ap: &mut Vec<u32>,
    ) {
        ap.clear();
        ap.resize(m32 / TR * kb_n * TILE, 0);
        for it in 0..m.div_ceil(TR) {
            for kb in 0..kb_n {
                let len = (k - kb * TK).min(TK);
                let tile = &mut ap[(it * kb_n + kb) * TILE..][..TILE];
                // SAFETY: AVX-512 is present where AMX is; each row read holds `len` values
                // from `kb * TK` (rows past `m` are not read).
                unsafe { pack_tile(a, lda, it * TR, (m - it * TR).min(TR), kb * TK, len, tile) };
            }
        }
    }

    /// One packed tile: rows `i..i + rows` of `a`, values `p..p + len`, as 16 rows of 16
    /// pairs transposed into `tile`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn pack_tile(
        a: &[u16],
        lda: usize,
        i: usize,
        rows: usize,
        p: usize,
        len: usize,
        tile: &mut [u32],
    ) {
        use std::arch::x86_64::*;
        let mask = u32::MAX >> (32 - len);
        let v: [__m512i; TR] = std::array::from_fn(|r| match r < rows {
            // SAFETY: row `i + r` holds `len` values from `p` (the caller's contract); the
            // masked lanes are not read.
            true => unsafe {
                _mm512_maskz_loadu_epi16(mask, a.as_ptr().add((i + r) * lda + p).cast())
            },
            false => _mm512_setzero_si512(),
        });
        for (r, row) in transpose(v).iter().enumerate() {
            // SAFETY: `tile` holds 16 rows of 16 u32.
            unsafe { _mm512_storeu_si512(tile.as_mut_ptr().add(r * TR).cast(), *row) };
        }
    }

    /// `c[i][j] += tile[j][i]` for `i < rows`, `j < cols` (rows of `c` `ldc` apart): a tile of
    /// `c^T` added where it belongs, a row of 16 at a time.
    #[target_feature(enable = "avx512f")]
    unsafe fn add_transposed(tile: &[f32], c: &mut [f32], ldc: usize, rows: usize, cols: usize) {
        use std::arch::x86_64::*;
        // SAFETY: `tile` holds 16 rows of 16; `c` holds `rows` rows of `cols` (the caller's
        // contract); masked lanes are not touched.
        unsafe {
            let t: [__m512i; TR] =
                std::array::from_fn(|r| _mm512_loadu_si512(tile.as_ptr().add(r * TR).cast()));
            let mask = crate::dot::avx512::mask16(cols);
            for (i, row) in transpose(t).iter().take(rows).enumerate() {
                let dst = c.as_mut_ptr().add(i * ldc);
                let sum =
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mask, dst), _mm512_castsi512_ps(*row));
                _mm512_mask_storeu_ps(dst, mask, sum);
            }
        }
    }

    /// The transpose of a 16 x 16 matrix of 32-bit values, a row a register: pairs of rows
    /// interleaved by 32 then 64 bits (4 x 4 blocks transposed within each 128-bit lane), then
    /// the lanes gathered by two rounds of lane shuffles.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose(r: [std::arch::x86_64::__m512i; TR]) -> [std::arch::x86_64::__m512i; TR] {
        use std::arch::x86_64::*;
        let t: [__m512i; TR] = std::array::from_fn(|x| match x % 2 {
            0 => _mm512_unpacklo_epi32(r[x], r[x + 1]),
            _ => _mm512_unpackhi_epi32(r[x - 1], r[x]),
        });
        // u[4g + c] holds, in lane L, column 4L + c of rows 4g..4g + 4.
        let u: [__m512i; TR] = std::array::from_fn(|x| {
            let (g, c) = (x / 4 * 4, x % 4);
            let (lo, hi) = (t[g + c / 2], t[g + c / 2 + 2]);
            match c % 2 {
                0 => _mm512_unpacklo_epi64(lo, hi),
                _ => _mm512_unpackhi_epi64(lo, hi),
            }
        });
        let mut out = [_mm512_setzero_si512(); TR];
        for c in 0..4 {
            let s = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
            let s2 = _mm512_shuffle_i32x4::<0xee>(u[c], u[4 + c]);
            let w = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
            let w2 = _mm512_shuffle_i32x4::<0xee>(u[8 + c], u[12 + c]);
            out[c] = _mm512_shuffle_i32x4::<0x88>(s, w);
            out[4 + c] = _mm512_shuffle_i32x4::<0xdd>(s, w);
            out[8 + c] = _mm512_shuffle_i32x4::<0x88>(s2, w2);
            out[12 + c] = _mm512_shuffle_i32x4::<0xdd>(s2, w2);
        }
        out
    }

    /// One 32 x 32 block of `c^T` over the whole reduction: tiles 0-3 accumulate, 4-5 hold two
    /// 16-row weight tiles, 6-7 two packed token tiles; the four results go to `out` in order
    /// (weight rows 0-15 x tokens 0-15, 0-15 x 16-31, 16-31 x 0-15, 16-31 x 16-31).
    ///
    /// # Safety
    /// Tiles are configured; `w` holds 32 rows of `ld` u16 (`kb_n * 32` readable in each) and `x`
    /// two token-tile columns of `kb_n` packed tiles each.
    #[inline]
    unsafe fn block(
        w: *const u16,
        ld: usize,
        x: *const u32,
        kb_n: usize,
        out: &mut [f32; 4 * TR * TR],
    ) {
        let stride = ld * 2;
        // SAFETY: the caller's contract; every address below is inside `w`, `x` or `out`.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
            for kb in 0..kb_n {
                if kb + AHEAD < kb_n {
                    for r in 0..2 * TR {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            w.add(r * ld + (kb + AHEAD) * TK).cast::<i8>(),
                        );
                        let xt = if r < TR {
                            kb + AHEAD
                        } else {
                            kb_n + kb + AHEAD
                        };
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            x.add(xt * TILE + (r % TR) * TR).cast::<i8>(),
                        );
                    }
                }
                let w0 = w.add(kb * TK);
                let w1 = w0.add(TR * ld);
                let x0 = x.add(kb * TILE);
                let x1 = x.add((kb_n + kb) * TILE);
                asm!(
                    "tileloadd tmm4, [{w0} + {s}*1]",
                    "tileloadd tmm5, [{w1} + {s}*1]",
                    "tileloadd tmm6, [{x0} + {t}*1]",
                    "tileloadd tmm7, [{x1} + {t}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    w0 = in(reg) w0,
                    w1 = in(reg) w1,
                    x0 = in(reg) x0,
                    x1 = in(reg) x1,
                    s = in(reg) stride,
                    t = in(reg) 64usize,
                    options(nostack, readonly),
                );
            }
            let o = out.as_mut_ptr();
            asm!(
                "tilestored [{o0} + {s}*1], tmm0",
                "tilestored [{o1} + {s}*1], tmm1",
                "tilestored [{o2} + {s}*1], tmm2",
                "tilestored [{o3} + {s}*1], tmm3",
                o0 = in(reg) o,
                o1 = in(reg) o.add(TR * TR),
                o2 = in(reg) o.add(2 * TR * TR),
                o3 = in(reg) o.add(3 * TR * TR),
                s = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}
