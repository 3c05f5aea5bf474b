//! The multiply-add peak this machine delivers, timed rather than assumed: the instruction a
//! level's GEMM tile is built on, issued in independent chains with no loads, on every thread.
//!
//! The nominal formula (lanes x instructions a cycle x the clock `/proc/cpuinfo` reports) takes
//! two 512-bit multiply-adds a cycle at the base clock. Both can be wrong: Zen 4 runs a 512-bit
//! `vdpbf16ps` or FMA as two 256-bit halves (one a cycle, not two), and a core boosts above its
//! base clock. Prefill figures are judged against what the instruction really does here.

use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// An instruction a GEMM tile multiplies with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mac {
    /// `vdpbf16ps` on 512 bits: 16 f32 lanes, two bf16 products each.
    Dpbf16,
    /// `vfmadd231ps` on 512 bits: 16 f32 lanes.
    Fma512,
    /// `vfmadd231ps` on 256 bits: 8 f32 lanes.
    Fma256,
    /// `tdpbf16ps`: a 16 x 16 f32 tile += 16 x 32 bf16 times 32 x 16 bf16 (AMX).
    Tdpbf16,
    /// `vpdpbusd` on 512 bits: 16 i32 lanes, four byte products each (VNNI; the integer GEMM
    /// over Q8_0 and Q4_0 blocks, whose integer multiply-adds count as a float one each).
    Dpbusd,
}

impl Mac {
    /// Independent accumulators a thread keeps in flight: at least the instruction's latency
    /// times the units issuing it (4-6 cycles x 2 on the machines the project runs on); 256-bit
    /// code has 16 registers, two of them operands.
    fn chains(self) -> usize {
        match self {
            Mac::Dpbf16 | Mac::Fma512 | Mac::Dpbusd => 16,
            Mac::Fma256 => 14,
            // eight tiles: six accumulate, two hold the operands
            Mac::Tdpbf16 => 6,
        }
    }

    /// Floating-point operations one instruction does (a multiply-add is two).
    fn flops(self) -> f64 {
        match self {
            Mac::Dpbf16 => 64.0,
            Mac::Dpbusd => 128.0,
            Mac::Fma512 => 32.0,
            Mac::Fma256 => 16.0,
            Mac::Tdpbf16 => 16.0 * 16.0 * 32.0 * 2.0,
        }
    }
}

/// Instructions a chain issues per round: a few milliseconds a thread (AMX: 6 x 2^18 tile
/// products at 16 cycles each, about 7 ms at 3.4 GHz).
const STEPS: usize = 1 << 18;

/// GFLOP/s of `threads` tasks on the pool, each issuing `mac` in [`Mac::chains`] chains: the
/// best of five rounds after one to wake the wide units, measured once per process and kept.
///
/// # Panics
/// If this CPU lacks the instruction (callers ask for the level's own).
pub fn gflops(mac: Mac, threads: usize) -> f64 {
    static KEPT: Mutex<Option<HashMap<(Mac, usize), f64>>> = Mutex::new(None);
    let mut kept = KEPT.lock().unwrap_or_else(|e| e.into_inner());
    *kept
        .get_or_insert_with(HashMap::new)
        .entry((mac, threads))
        .or_insert_with(|| measure(mac, threads))
}

/// [`gflops`] timed afresh, not kept: for a figure judged against the peak the machine gives
/// at that moment (a VM's core can share its units with a neighbour's for seconds at a time).
pub fn measure(mac: Mac, threads: usize) -> f64 {
    let round = || {
        let start = Instant::now();
        crate::on_pool(|| {
            (0..threads).into_par_iter().for_each(|_| {
                issue(mac);
            })
        });
        start.elapsed().as_secs_f64()
    };
    round();
    let best = (0..5).map(|_| round()).fold(f64::MAX, f64::min);
    (threads * mac.chains() * STEPS) as f64 * mac.flops() / best / 1e9
}

/// One thread's round of `mac`.
fn issue(mac: Mac) {
    #[cfg(target_arch = "x86_64")]
    {
        let present = match mac {
            Mac::Dpbf16 => is_x86_feature_detected!("avx512bf16"),
            Mac::Dpbusd => is_x86_feature_detected!("avx512vnni"),
            Mac::Fma512 => is_x86_feature_detected!("avx512f"),
            Mac::Fma256 => is_x86_feature_detected!("fma") && is_x86_feature_detected!("avx"),
            Mac::Tdpbf16 => crate::amx::enable(),
        };
        assert!(present, "this CPU has no {mac:?}");
        // SAFETY: the instruction's features were detected just above.
        unsafe {
            match mac {
                Mac::Dpbf16 => x86::dpbf16(),
                Mac::Dpbusd => x86::dpbusd(),
                Mac::Fma512 => x86::fma512(),
                Mac::Fma256 => x86::fma256(),
                #[cfg(target_os = "linux")]
                Mac::Tdpbf16 => x86::tdpbf16(),
                #[cfg(not(target_os = "linux"))]
                Mac::Tdpbf16 => unreachable!("AMX is enabled on Linux only"),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    panic!("no {mac:?} off x86_64")
}

/// The loops are written in assembly: the compiler rotates an array of accumulators through
/// registers and the stack, which times its moves, not the instruction.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::STEPS;
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Runs `$op` on the accumulators `$r` (zeroed first) [`STEPS`] times, its operands in the
    /// registers `$a` and `$b` holding `$av` and `$bv`.
    macro_rules! chains {
        // The 512-bit instructions' sixteen accumulators.
        ($op:literal, $a:tt = $av:expr, $b:tt = $bv:expr, zmm16) => {
            chains!(
                $op,
                $a = $av,
                $b = $bv,
                [
                    "zmm0", "zmm1", "zmm2", "zmm3", "zmm4", "zmm5", "zmm6", "zmm7", "zmm8",
                    "zmm9", "zmm10", "zmm11", "zmm12", "zmm13", "zmm14", "zmm15"
                ]
            )
        };
        ($op:literal, $a:tt = $av:expr, $b:tt = $bv:expr, [$($r:tt),*]) => {
            // SAFETY: registers only, no memory; every register written is declared clobbered.
            unsafe {
                asm!(
                    $(concat!("vxorps ", $r, ", ", $r, ", ", $r),)*
                    "2:",
                    $(concat!($op, " ", $r, ", ", $a, ", ", $b),)*
                    "dec {n}",
                    "jnz 2b",
                    n = inout(reg) STEPS => _,
                    $(out($r) _,)*
                    in($a) $av,
                    in($b) $bv,
                    options(nostack, nomem),
                )
            }
        };
    }

    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dpbf16() {
        // bf16 pairs of 1.0 and 2^-20: the sums grow by 2^-19 a step.
        let (a, b) = (_mm512_set1_epi16(0x3f80), _mm512_set1_epi16(0x3580));
        chains!("vdpbf16ps", "zmm30" = a, "zmm31" = b, zmm16);
    }

    #[target_feature(enable = "avx512f,avx512vnni")]
    pub(super) unsafe fn dpbusd() {
        // Bytes of 1 and 1: the sums grow by 4 a step (far from wrapping in 2^18 steps).
        let (a, b) = (_mm512_set1_epi8(1), _mm512_set1_epi8(1));
        chains!("vpdpbusd", "zmm30" = a, "zmm31" = b, zmm16);
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn fma512() {
        chains!(
            "vfmadd231ps",
            "zmm30" = _mm512_set1_ps(1.0),
            "zmm31" = _mm512_set1_ps(1e-6),
            zmm16
        );
    }

    #[target_feature(enable = "avx,fma")]
    pub(super) unsafe fn fma256() {
        chains!(
            "vfmadd231ps",
            "ymm14" = _mm256_set1_ps(1.0),
            "ymm15" = _mm256_set1_ps(1e-6),
            [
                "ymm0", "ymm1", "ymm2", "ymm3", "ymm4", "ymm5", "ymm6", "ymm7", "ymm8", "ymm9",
                "ymm10", "ymm11", "ymm12", "ymm13"
            ]
        );
    }

    /// Six tile products a step, the operands zero tiles (AMX's timing does not depend on the
    /// values).
    #[cfg(target_os = "linux")]
    pub(super) unsafe fn tdpbf16() {
        // SAFETY: AMX was enabled (checked by the caller); tiles only, no memory.
        unsafe {
            crate::amx::configure();
            asm!(
                "tilezero tmm6",
                "tilezero tmm7",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "tilezero tmm4",
                "tilezero tmm5",
                "2:",
                "tdpbf16ps tmm0, tmm6, tmm7",
                "tdpbf16ps tmm1, tmm6, tmm7",
                "tdpbf16ps tmm2, tmm6, tmm7",
                "tdpbf16ps tmm3, tmm6, tmm7",
                "tdpbf16ps tmm4, tmm6, tmm7",
                "tdpbf16ps tmm5, tmm6, tmm7",
                "dec {n}",
                "jnz 2b",
                n = inout(reg) STEPS => _,
                options(nostack, nomem),
            );
            crate::amx::release();
        }
    }
}

#[cfg(test)]
mod tests {
    /// The level in use (forced by `MOEK_CPU_ISA` in CI's runs), and its integer GEMM where it
    /// has one, times to a rate one core can give: above 1 GFLOP/s, below its instruction's
    /// flops twice a cycle at 10 GHz (a loop that did not run would report far more).
    #[test]
    fn the_level_peaks_are_rates_one_core_can_give() {
        let isa = crate::isa();
        let integer = isa.integer_peak_gflops(moek_ir::BlockFormat::Q8_0, 1);
        for (what, rate, mac) in [
            ("bf16 GEMM", isa.peak_gflops(1), isa.gemm_mac()),
            ("f32 FMA", isa.f32_peak_gflops(1), isa.f32_mac()),
        ]
        .into_iter()
        .chain(integer.map(|rate| ("integer GEMM", rate, Some(super::Mac::Dpbusd))))
        {
            let most = mac.map_or(64.0, |m| m.flops()) * 2.0 * 10.0;
            assert!(
                rate > 1.0 && rate < most,
                "{} {what} peak {rate} GFLOP/s, not in 1..{most}",
                isa.name()
            );
        }
    }
}
