//! Criterion benches of the built-in kernels at the 26B-A4B geometry, beside their floors: memory
//! read bandwidth for decode, a well-kept GEMM crate (`matrixmultiply`) for prefill. `moek bench`
//! prints the same comparisons as ratios measured in one run.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use half::bf16;
use moek_kernels::geometry::{DECODE, PREFILL};
use moek_kernels::ir::Op;
use moek_kernels::specs::*;
use moek_kernels::testing::{Case, uniform};

fn decode(c: &mut Criterion) {
    let case = Case::<bf16>::new(Op::ExpertFfn, DECODE, 1);
    let mut g = c.benchmark_group("decode T=1 R=8 bf16");
    g.throughput(Throughput::Bytes(8 * 3 * 704 * 2816 * 2));
    let mut out = vec![0f32; 2816];
    for entry in [
        decode_expert_ffn_blocked::entry(),
        general_expert_ffn_gather::entry(),
    ] {
        let f = entry.cpu.bf16.unwrap();
        g.bench_function(entry.name(), |b| {
            b.iter(|| f(&DECODE, &case.inputs(), &mut out))
        });
    }
    let words = vec![1u64; (1 << 30) / 8];
    g.throughput(Throughput::Bytes(1 << 30));
    g.bench_function("floor: read 1 GiB", |b| {
        b.iter(|| {
            use rayon::prelude::*;
            words
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |s, &w| s.wrapping_add(w)))
                .sum::<u64>()
        })
    });
    g.finish();
}

fn prefill(c: &mut Criterion) {
    let shape = PREFILL;
    let case = Case::<bf16>::new(Op::ExpertFfn, shape, 2);
    let flops = 2 * 512 * 8 * 3 * 704 * 2816;
    let mut g = c.benchmark_group("prefill T=512 top-8 bf16");
    g.sample_size(10).throughput(Throughput::Elements(flops));
    let mut out = vec![0f32; 512 * 2816];
    let f = prefill_expert_ffn_grouped::entry().cpu.bf16.unwrap();
    g.bench_function("prefill_expert_ffn_grouped", |b| {
        b.iter(|| f(&shape, &case.inputs(), &mut out))
    });
    drop(case);
    let m = 512 * 8;
    let (a1, b1, a2, b2): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) = (
        uniform(m * 2816, 1, 1.0),
        uniform(2816 * 1408, 2, 1.0),
        uniform(m * 704, 3, 1.0),
        uniform(704 * 2816, 4, 1.0),
    );
    let mut c1 = vec![0f32; m * 1408];
    let mut c2 = vec![0f32; m * 2816];
    g.bench_function("floor: matrixmultiply sgemm, same FLOPs", |b| {
        b.iter(|| {
            // SAFETY: row-major operands with the strides and lengths allocated above.
            unsafe {
                matrixmultiply::sgemm(
                    m,
                    2816,
                    1408,
                    1.0,
                    a1.as_ptr(),
                    2816,
                    1,
                    b1.as_ptr(),
                    1,
                    2816,
                    0.0,
                    c1.as_mut_ptr(),
                    1408,
                    1,
                );
                matrixmultiply::sgemm(
                    m,
                    704,
                    2816,
                    1.0,
                    a2.as_ptr(),
                    704,
                    1,
                    b2.as_ptr(),
                    1,
                    704,
                    0.0,
                    c2.as_mut_ptr(),
                    2816,
                    1,
                );
            }
        })
    });
    g.finish();
}

criterion_group!(benches, decode, prefill);
criterion_main!(benches);
