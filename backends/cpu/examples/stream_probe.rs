//! How fast a decode-sized matrix-vector product streams from memory, by its size and by how
//! many column blocks it is cut into, started from outside rayon's pool and from a worker
//! (`moek_cpu::pool`): `cargo run --release -p moek-cpu --example stream_probe`.
//! Each product reads a matrix no recent call read (a 2 GiB pool cycled through).
use half::bf16;
use rayon::prelude::*;
use std::time::Instant;

fn main() {
    let h = 2816usize;
    let pool_bytes = 1usize << 31;
    let w = filled(pool_bytes / 2);
    let x: Vec<bf16> = (0..h)
        .map(|i| bf16::from_f32((i % 5) as f32 * 0.1))
        .collect();
    println!(
        "read bandwidth probe: {:.1} GB/s",
        moek_cpu::bandwidth::read_bandwidth(1 << 30, 5) / 1e9
    );
    for (place, on_pool) in [("outside the pool", false), ("on a worker", true)] {
        let run = || {
            for rows in [1024usize, 2048, 4096, 8192] {
                let bytes = rows * h * 2;
                let mats = pool_bytes / bytes;
                for blocks in [2usize, 4, 8, 32] {
                    let mut times = vec![];
                    let mut y = vec![0f32; rows];
                    for rep in 0..(3 * mats).max(12) {
                        let m = &w[(rep % mats) * rows * h..][..rows * h];
                        let start = Instant::now();
                        let cols = rows.div_ceil(blocks);
                        y.par_chunks_mut(cols).enumerate().for_each(|(b, yc)| {
                            let c0 = b * cols;
                            let n = yc.len();
                            moek_cpu::gemm_nt(&x, h, &m[c0 * h..], h, yc, n, 1, n, h);
                        });
                        times.push(start.elapsed().as_secs_f64());
                    }
                    times.sort_by(f64::total_cmp);
                    let median = times[times.len() / 2];
                    println!(
                        "{place}: {:5.1} MB in {blocks:2} blocks: {:.1} GB/s median, {:.1} best",
                        bytes as f64 / 1e6,
                        bytes as f64 / median / 1e9,
                        bytes as f64 / times[0] / 1e9
                    );
                }
            }
        };
        if on_pool {
            moek_cpu::on_pool(run)
        } else {
            run()
        }
    }
}

/// `len` bf16 values in huge pages, written in parallel.
fn filled(len: usize) -> Vec<bf16> {
    let mut v = moek_cpu::memory::huge_vec::<bf16>(len);
    v.par_chunks_mut(1 << 20).for_each(|c| {
        c.iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = bf16::from_f32((i % 7) as f32 * 0.01))
    });
    v
}
