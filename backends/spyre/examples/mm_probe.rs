//! Single-thread throughput of the Spyre simulator's matmul at the persistent prefill's per-core
//! shapes (best of five), as a profiling aid.
use std::time::Instant;
fn main() {
    for (m, k, n) in [(64usize, 704usize, 192usize), (32, 192, 1408)] {
        let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect();
        let mut o = vec![0f32; m * n];
        let reps = 200;
        let t = (0..5)
            .map(|_| {
                let s = Instant::now();
                for _ in 0..reps {
                    moek_spyre::matmul::matmul(&a, &b, &mut o, m, k, n);
                }
                s.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "m {m} k {k} n {n}: {:.1} GFLOP/s",
            2.0 * (reps * m * n * k) as f64 / t / 1e9
        );
    }
}
