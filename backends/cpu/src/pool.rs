//! Where parallel work is started from.
//!
//! A thread outside rayon's pool that starts a parallel loop hands it to the workers and sleeps
//! on a lock until the loop ends; the last worker then wakes it. On a machine with as many workers
//! as cores, that wake-up waits for a core: measured here (2 cores), a 6-23 MB matrix-vector
//! product streams at 20-26 GB/s (median) from outside the pool and at 27-28 GB/s from a worker,
//! against a 28 GB/s probe. Decode is about thirty such products per token, so every entry point
//! that runs many parallel loops runs them from a worker.

/// Runs `f` on a rayon worker (in place when the caller is one), so the parallel loops inside it
/// are joined by a thread of the pool rather than by a sleeping outsider.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_on_a_worker_and_returns_its_result() {
        assert!(rayon::current_thread_index().is_none());
        let (index, sum) = on_pool(|| (rayon::current_thread_index(), (1..=10).sum::<u32>()));
        assert!(index.is_some(), "the closure ran outside the pool");
        assert_eq!(sum, 55);
    }
}
