//! Run-time choice of the instruction set primitives use.
//!
//! `MOEK_CPU_ISA=portable` forces the portable path, `avx512` the AVX-512 path without AMX tiles
//! (CI runs the primitive tests both ways besides the default); `amx` insists on AMX. Each forced
//! level panics with a clear message where the CPU (or the OS) lacks it; unset or `auto` picks the
//! best there is.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 as below, plus AMX tiles (`tdpbf16ps`) for bf16 GEMMs.
    Amx,
    /// AVX-512 F/BW/VL with BF16 dot products (`vdpbf16ps`) and 16-bit conversion.
    Avx512Bf16,
    /// Plain Rust the compiler vectorises for the baseline target.
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Amx => "amx-bf16",
            Isa::Avx512Bf16 => "avx512-bf16",
            Isa::Portable => "portable",
        }
    }

    /// Peak f32-accumulated multiply-adds per cycle per core on bf16 GEMMs, for reports.
    pub fn gemm_macs_per_cycle(self) -> f64 {
        match self {
            // one 16 x 16 x 32 `tdpbf16ps` per 16 cycles
            Isa::Amx => 1024.0,
            // two 16-lane f32 FMAs per cycle on widened operands (the GEMM's own path)
            Isa::Avx512Bf16 => 32.0,
            // two 8-lane FMAs per cycle (AVX2) is what a vectorising compiler can reach at best
            Isa::Portable => 16.0,
        }
    }
}

/// The instruction set in use (detected once; see the module doc for the switch).
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        let wanted = std::env::var("MOEK_CPU_ISA").unwrap_or_default();
        match wanted.as_str() {
            "portable" => Isa::Portable,
            "avx512" => {
                assert!(
                    has_avx512_bf16(),
                    "MOEK_CPU_ISA=avx512 but this CPU lacks AVX-512 F/BW/VL/BF16; unset it or use `portable`"
                );
                Isa::Avx512Bf16
            }
            "amx" => {
                assert!(
                    has_avx512_bf16() && crate::amx::enable(),
                    "MOEK_CPU_ISA=amx but this CPU or OS gives no AMX-BF16 tiles; unset it or use `avx512`"
                );
                Isa::Amx
            }
            "" | "auto" => {
                if has_avx512_bf16() && crate::amx::enable() {
                    Isa::Amx
                } else if has_avx512_bf16() {
                    Isa::Avx512Bf16
                } else {
                    Isa::Portable
                }
            }
            other => panic!("MOEK_CPU_ISA={other:?} is not one of: auto, amx, avx512, portable"),
        }
    })
}

/// Whether this CPU has everything the AVX-512 path uses.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
