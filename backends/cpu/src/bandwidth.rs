//! The machine's memory read bandwidth, measured in the same run as the kernels it judges.

use rayon::prelude::*;
use std::time::Instant;

/// Reads a buffer of `bytes` (much larger than the caches) with every rayon thread, `reps`
/// times, and returns the best rate in bytes per second. The buffer lives in huge pages, as the
/// weights do ([`crate::memory`]): the probe measures the memory, not the TLB.
pub fn read_bandwidth(bytes: usize, reps: usize) -> f64 {
    let mut words = crate::memory::huge_vec::<u64>(bytes / 8);
    words.fill(1);
    (0..reps.max(1))
        .map(|_| read_pass(&words))
        .fold(0.0, f64::max)
}

/// Reads all of `words` once with every rayon thread (a sum nobody uses); bytes per second.
fn read_pass(words: &[u64]) -> f64 {
    let start = Instant::now();
    let sum: u64 = crate::on_pool(|| {
        words
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |s, &w| s.wrapping_add(w)))
            .reduce(|| 0, u64::wrapping_add)
    });
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(sum);
    std::mem::size_of_val(words) as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_reports_a_finite_positive_rate() {
        let data = vec![3u64; (1 << 20) + 3];
        let rate = read_pass(&data);
        assert!(rate.is_finite() && rate > 0.0, "rate {rate}");
    }
}
