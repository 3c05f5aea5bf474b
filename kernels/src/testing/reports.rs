//! Seeds that differ between runs, and the report of one run against the reference.

use super::*;

/// Seeds that differ between runs (time and a counter); reports print them for reproduction.
pub fn fresh_seeds(n: usize) -> Vec<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (0..n)
        .map(|_| {
            now ^ COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        })
        .collect()
}

/// The outcome of one run against the reference.
#[derive(Clone, Debug)]
pub struct Report {
    pub kernel: String,
    pub target: Target,
    pub dtype: DType,
    pub shape: String,
    pub seed: u64,
    pub deviation: Deviation,
    pub tolerance: Tolerance,
    /// Seconds the variant itself took.
    pub seconds: f64,
    /// Weight bytes the op must read, and its multiply-add flops (2 per MAC).
    pub bytes: f64,
    pub flops: f64,
    /// For the LM head: whether the returned argmax is the index of the largest logit.
    pub argmax_ok: bool,
    /// The cost model's figures (Spyre runs).
    pub modeled: Option<Modeled>,
    /// Deviation from the spec's CPU variant on the same inputs (wgpu runs, every element).
    pub versus_cpu: Option<Deviation>,
    /// Where a compiled CPU variant and the same schedule run from its IR (which must agree bit
    /// for bit) first differ.
    pub versus_schedule: Option<String>,
    /// For quantized weights: the reference on them against the reference on the bf16 weights
    /// they were quantized from (the format's own error, which the tolerance does not cover).
    pub quantization: Option<Deviation>,
}

impl Report {
    /// Within tolerance of the reference, (wgpu) within twice it of the CPU variant: each is
    /// within the tolerance of the reference, so they differ by at most twice it, and (compiled
    /// CPU) bit-equal to its schedule run from the IR.
    pub fn passed(&self) -> bool {
        let twice = Tolerance {
            rel_l2: 2.0 * self.tolerance.rel_l2,
            max_abs: 2.0 * self.tolerance.max_abs,
        };
        self.argmax_ok
            && self.deviation.within(self.tolerance)
            && self.versus_cpu.as_ref().is_none_or(|d| d.within(twice))
            && self.versus_schedule.is_none()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on {} ({}, {}): {}; limits rel L2 {:.1e}, max abs {:.1e}{}",
            self.kernel,
            self.target,
            self.dtype,
            self.shape,
            self.deviation,
            self.tolerance.rel_l2,
            self.tolerance.max_abs,
            if self.argmax_ok {
                ""
            } else {
                "; argmax is not the largest logit"
            }
        )?;
        if let Some(d) = &self.versus_cpu {
            write!(f, "; versus the CPU variant: {d}")?;
        }
        if let Some(d) = &self.versus_schedule {
            write!(f, "; {d}")?;
        }
        if let Some(d) = &self.quantization {
            write!(f, "; the weights' quantization itself: {d}")?;
        }
        Ok(())
    }
}
