//! The machine's memory read bandwidth, measured in the same run as the kernels it judges.

use rayon::prelude::*;
use std::time::Instant;

/// Reads a buffer of `bytes` (much larger than the caches) with every rayon thread, `reps`
/// times, and returns the best rate in bytes per second. The buffer lives in huge pages, as the
/// weights do ([`crate::memory`]): the probe measures the memory, not the TLB.
pub fn read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let mut words = crate::memory::huge_vec::<u64>(bytes / 8);
    words.fill(1);
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let sum: u64 = words
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |s, &w| s.wrapping_add(w)))
            .reduce(|| 0, u64::wrapping_add);
        let secs = start.elapsed().as_secs_f64();
        std::hint::black_box(sum);
        best = best.max((words.len() * 8) as f64 / secs);
    }
    best
}
