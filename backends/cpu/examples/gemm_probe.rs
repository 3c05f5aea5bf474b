//! GEMM tile throughput at the grouped prefill's shapes, with weights streamed from memory (one
//! fresh expert bank per call), as a profiling aid. `THREADS=2` runs one probe per thread at once
//! (each its own banks) and reports the total.
use half::bf16;
use std::time::Instant;
fn main() {
    let threads: usize = std::env::var("THREADS").map_or(1, |t| t.parse().expect("THREADS"));
    for (m, n, k) in [(32usize, 1408usize, 2816usize), (32, 2816, 704)] {
        let experts = 64;
        let a: Vec<bf16> = (0..m * k)
            .map(|i| bf16::from_f32((i % 7) as f32 * 0.1))
            .collect();
        let banks: Vec<Vec<bf16>> = (0..threads)
            .map(|t| {
                (0..experts * n * k)
                    .map(|i| bf16::from_f32(((i + t) % 5) as f32 * 0.1))
                    .collect()
            })
            .collect();
        let reps: usize = std::env::var("REPS").map_or(5, |t| t.parse().expect("REPS"));
        let t = (0..reps)
            .map(|_| {
                let s = Instant::now();
                std::thread::scope(|scope| {
                    for b in &banks {
                        let a = &a;
                        scope.spawn(move || {
                            let mut c = vec![0f32; m * n];
                            for e in 0..experts {
                                moek_cpu::gemm_nt(a, k, &b[e * n * k..], k, &mut c, n, m, n, k);
                            }
                        });
                    }
                });
                s.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min);
        println!(
            "m {m} n {n} k {k}, {threads} thread(s): {:.1} GFLOP/s streaming (best of {reps})",
            2.0 * (threads * experts * m * n * k) as f64 / t / 1e9
        );
    }
}
