//! Single-thread GEMM tile throughput at the grouped prefill's shapes, with weights streamed from
//! memory (one fresh expert bank per call), as a profiling aid.
use half::bf16;
use std::time::Instant;
fn main() {
    for (m, n, k) in [(32usize, 1408usize, 2816usize), (32, 2816, 704)] {
        let experts = 64;
        let a: Vec<bf16> = (0..m * k)
            .map(|i| bf16::from_f32((i % 7) as f32 * 0.1))
            .collect();
        let b: Vec<bf16> = (0..experts * n * k)
            .map(|i| bf16::from_f32((i % 5) as f32 * 0.1))
            .collect();
        let mut c = vec![0f32; m * n];
        let t = (0..5)
            .map(|_| {
                let s = Instant::now();
                for e in 0..experts {
                    moek_cpu::gemm_nt(&a, k, &b[e * n * k..], k, &mut c, n, m, n, k);
                }
                s.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "m {m} n {n} k {k}: {:.1} GFLOP/s streaming (best of 5)",
            2.0 * (experts * m * n * k) as f64 / t / 1e9
        );
    }
}
