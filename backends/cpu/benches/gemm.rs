//! The f32/bf16 GEMM at the expert FFN's shapes (32 token rows, the mean at T 512, top-8 of
//! 128 experts), on the machine's best level (`MOEK_CPU_ISA` picks another), both threads: 128
//! products over two weight matrices that stay in cache ("hot") against 128 distinct ones, a GB
//! in all, streamed from memory ("cold"). Where the two agree, the weights' fetch is hidden and
//! what is left is the tiles' own rate; the grouped MoE kernel's time beyond these products
//! (`moek bench`) is spent outside them.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use rayon::prelude::*;
use std::hint::black_box;

const M: usize = 32;
const EXPERTS: usize = 128;

fn shape(c: &mut Criterion, name: &str, n: usize, k: usize) {
    let mut w: Vec<bf16> = moek_cpu::memory::huge_vec(EXPERTS * n * k);
    w.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(c, chunk)| {
            for (i, v) in chunk.iter_mut().enumerate() {
                *v = bf16::from_f32(((c * 7 + i * 13) % 17) as f32 / 17.0 - 0.5);
            }
        });
    let a: Vec<bf16> = (0..M * k)
        .map(|i| bf16::from_f32((i % 11) as f32 / 11.0 - 0.5))
        .collect();
    let mut g = c.benchmark_group(format!("expert_gemm_{name}"));
    g.sample_size(10);
    g.throughput(Throughput::Elements((2 * M * n * k * EXPERTS) as u64));
    for (label, matrices) in [("hot", 2), ("cold", EXPERTS)] {
        let id = format!("{label} ({}, m {M} n {n} k {k})", moek_cpu::isa().name());
        g.bench_function(id, |b| {
            b.iter(|| {
                (0..EXPERTS).into_par_iter().for_each(|e| {
                    let j = e % matrices;
                    let mut out = vec![0f32; M * n];
                    let wj = &w[j * n * k..(j + 1) * n * k];
                    moek_cpu::gemm_nt(black_box(&a), k, wj, k, &mut out, n, M, n, k);
                    black_box(&out);
                })
            })
        });
    }
    g.finish();
}

fn benches(c: &mut Criterion) {
    // gate and up of one expert (2F x H), then down's widest column block (1024 x F).
    shape(c, "gate_up", 1408, 2816);
    shape(c, "down", 1024, 704);
}

criterion_group!(gemm, benches);
criterion_main!(gemm);
