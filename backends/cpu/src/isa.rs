//! Run-time choice of the instruction set primitives use.
//!
//! `MOEK_CPU_ISA=portable` forces the portable path (CI runs the tests both ways);
//! `MOEK_CPU_ISA=avx512` insists on AVX-512 and panics with a clear message where it is missing;
//! unset or `auto` picks the best the CPU has.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F/BW/VL with BF16 dot products (`vdpbf16ps`) and 16-bit conversion.
    Avx512Bf16,
    /// Plain Rust the compiler vectorises for the baseline target.
    Portable,
}

impl Isa {
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512Bf16 => "avx512-bf16",
            Isa::Portable => "portable",
        }
    }

    /// Peak f32-accumulated multiply-adds per cycle per core on 16-bit inputs, for reports.
    pub fn macs_per_cycle(self) -> f64 {
        match self {
            // one vdpbf16ps (32 MACs) per cycle on the cores this project runs on
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
            "" | "auto" => {
                if has_avx512_bf16() {
                    Isa::Avx512Bf16
                } else {
                    Isa::Portable
                }
            }
            other => panic!("MOEK_CPU_ISA={other:?} is not one of: auto, avx512, portable"),
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
