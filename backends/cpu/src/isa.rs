//! Run-time choice of the instruction set primitives use.
//!
//! `MOEK_CPU_ISA=portable` forces the portable path, `avx2` the AVX2 + FMA + F16C path, `avx512`
//! the AVX-512 path without AMX tiles, `amx` AMX (CI runs the primitive tests under every level
//! the CPU has). Each forced level panics with a clear message where the CPU (or the OS) lacks it;
//! unset or `auto` picks the best there is: amx > avx512 > avx2 > portable.

use crate::peak::Mac;
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 as below, plus AMX tiles (`tdpbf16ps`) for bf16 GEMMs and GEMMs over blocks.
    Amx,
    /// AVX-512 F/BW/VL with VNNI byte dot products (`vpdpbusd`; Cascade Lake, Ice Lake and
    /// every later core, Zen 4 on). Where the CPU also has BF16 dot products (`vdpbf16ps`,
    /// [`has_avx512_bf16`]), bf16 GEMMs may multiply with them ([`crate::gemm::bf16_tile`]);
    /// elsewhere bf16 is widened to f32 and multiplied by FMA, as on AVX2.
    Avx512,
    /// AVX2 with FMA and F16C: 8 f32 lanes, 16-bit weights widened on load ([`crate::avx2`]).
    Avx2,
    /// Plain Rust the compiler vectorises for the baseline target.
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx-bf16",
            Isa::Avx512 if has_avx512_bf16() => "avx512-bf16",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// The `MOEK_CPU_ISA` value that forces this level.
    pub fn switch(self) -> &'static str {
        match self {
            Isa::Amx => "amx",
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Portable => "portable",
        }
    }

    /// Nominal f32 multiply-adds per cycle per core, for the portable path (whose products
    /// are no one instruction to time).
    fn f32_macs_per_cycle(self) -> f64 {
        match self {
            // two 16-lane f32 FMAs per cycle
            Isa::Amx | Isa::Avx512 => 32.0,
            // two 8-lane f32 FMAs per cycle
            Isa::Avx2 => 16.0,
            // the baseline target has no FMA: two 4-lane multiplies and two adds per cycle
            Isa::Portable => 8.0,
        }
    }
}

impl Isa {
    /// Peak bf16 GEMM GFLOP/s of `threads` cores: the physical floor prefill figures are printed
    /// beside. Timed ([`crate::peak`]) on the instruction the level's bf16 tile multiplies
    /// with ([`Isa::gemm_mac`]); the nominal rate at the reported clock ([`nominal_ghz`]) on the
    /// portable path.
    pub fn peak_gflops(self, threads: usize) -> f64 {
        self.timed_or_nominal(self.gemm_mac(), threads)
    }

    /// [`Isa::peak_gflops`] timed afresh ([`crate::peak::measure`]), to judge one timed call
    /// against the peak of its moment.
    pub fn peak_gflops_now(self, threads: usize) -> f64 {
        self.gemm_mac().map_or_else(
            || self.peak_gflops(threads),
            |mac| crate::peak::measure(mac, threads),
        )
    }

    /// The instruction this level's bf16 GEMM multiplies with: AMX tiles, `vdpbf16ps` where
    /// [`crate::gemm::bf16_tile`] picked it, else the f32 FMA (none on the portable path).
    pub(crate) fn gemm_mac(self) -> Option<Mac> {
        match self {
            Isa::Amx => Some(Mac::Tdpbf16),
            Isa::Avx512 if crate::gemm::bf16_tile() == crate::gemm::Bf16Tile::Dot => {
                Some(Mac::Dpbf16)
            }
            other => other.f32_mac(),
        }
    }

    /// Peak GFLOP/s of `threads` cores for the GEMM over `format`'s blocks where it multiplies
    /// in integers on AVX-512 ([`crate::quant::GemmRounding::Activation8`]: `vpdpbusd`, timed,
    /// a byte multiply-add counted as two operations); `None` where it runs on the float tiles,
    /// whose peak is [`Isa::peak_gflops`], and on AVX2, whose `vpmaddubsw` is not timed.
    pub fn integer_peak_gflops(self, format: moek_ir::BlockFormat, threads: usize) -> Option<f64> {
        let integer =
            crate::quant::gemm_rounding(format) == crate::quant::GemmRounding::Activation8;
        (self == Isa::Avx512 && integer).then(|| crate::peak::gflops(Mac::Dpbusd, threads))
    }

    /// Peak f32 FMA GFLOP/s of `threads` cores, printed beside the above: timed as it is.
    pub fn f32_peak_gflops(self, threads: usize) -> f64 {
        self.timed_or_nominal(self.f32_mac(), threads)
    }

    /// GFLOP/s of `threads` cores: `mac` timed, or without one the nominal f32 rate.
    fn timed_or_nominal(self, mac: Option<Mac>, threads: usize) -> f64 {
        mac.map_or_else(
            || 2.0 * self.f32_macs_per_cycle() * nominal_ghz() * threads as f64,
            |mac| crate::peak::gflops(mac, threads),
        )
    }

    /// The FMA this level's f32 products issue (none on the portable path).
    pub(crate) fn f32_mac(self) -> Option<Mac> {
        match self {
            Isa::Amx | Isa::Avx512 => Some(Mac::Fma512),
            Isa::Avx2 => Some(Mac::Fma256),
            Isa::Portable => None,
        }
    }
}

/// The clock `/proc/cpuinfo` reports (2 GHz where it says nothing), GHz.
pub fn nominal_ghz() -> f64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("cpu MHz"))
                .and_then(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        })
        .map_or(2.0, |mhz| mhz / 1e3)
}

/// The instruction set in use (detected once; see the module doc for the switch).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let wanted = std::env::var("MOEK_CPU_ISA").unwrap_or_default();
        match wanted.as_str() {
            "portable" => Isa::Portable,
            "avx2" => {
                assert!(
                    has_avx2(),
                    "MOEK_CPU_ISA=avx2 but this CPU lacks AVX2/FMA/F16C; unset it or use `portable`"
                );
                Isa::Avx2
            }
            "avx512" => {
                assert!(
                    has_avx512(),
                    "MOEK_CPU_ISA=avx512 but this CPU lacks AVX-512 F/BW/VL/VNNI (or AVX2/FMA/F16C); unset it or use `avx2` or `portable`"
                );
                Isa::Avx512
            }
            "amx" => {
                assert!(
                    has_avx512_bf16() && crate::amx::enable(),
                    "MOEK_CPU_ISA=amx but this CPU or OS gives no AMX-BF16 tiles; unset it or use `avx512`"
                );
                Isa::Amx
            }
            "" | "auto" => best(),
            other => panic!("MOEK_CPU_ISA={other:?} is not one of: auto, amx, avx512, avx2, portable"),
        }
    })
}

/// `body()` compiled for the vector width of the level in use (16 lanes on AVX-512, 8 on AVX2,
/// the baseline's elsewhere): plain scalar loops, written once, vectorised per level. The body
/// is inlined into a function carrying the level's features, so it must be `#[inline(always)]`
/// as written (a closure marked so, calling only inlined code).
#[inline(always)]
pub fn vectorised<R>(body: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    fn avx512<R>(body: impl FnOnce() -> R) -> R {
        body()
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn avx2<R>(body: impl FnOnce() -> R) -> R {
        body()
    }
    match isa() {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` checked the AVX-512 features.
        Isa::Avx512 | Isa::Amx => unsafe { avx512(body) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `isa()` checked the AVX2 features.
        Isa::Avx2 => unsafe { avx2(body) },
        _ => body(),
    }
}

/// The best level this CPU (and OS) gives: what `MOEK_CPU_ISA` unset or `auto` picks.
pub fn best() -> Isa {
    supported()[0]
}

/// Whether this CPU has everything the AVX-512 level uses (its kernels also use AVX2's).
pub fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        has_avx2()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the AVX-512 level also has BF16 dot products (`vdpbf16ps`, `vcvtneps2bf16`): what
/// the `dot` bf16 GEMM tile, the bf16 dot products and AMX need beside [`has_avx512`]. Detected
/// once: the bf16 dot products ask on every call.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static BF16: OnceLock<bool> = OnceLock::new();
        *BF16.get_or_init(|| has_avx512() && is_x86_feature_detected!("avx512bf16"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether this CPU has everything the AVX2 path uses (AVX2, FMA, F16C).
pub fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        crate::avx2::detected()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The levels this CPU can run, best first (what `MOEK_CPU_ISA` may force here).
pub fn supported() -> Vec<Isa> {
    let mut levels = vec![];
    if has_avx512_bf16() && crate::amx::enable() {
        levels.push(Isa::Amx);
    }
    if has_avx512() {
        levels.push(Isa::Avx512);
    }
    if has_avx2() {
        levels.push(Isa::Avx2);
    }
    levels.push(Isa::Portable);
    levels
}
