//! Products of quantized weight rows on the machine's best level (`MOEK_CPU_ISA` picks
//! another): a cache-resident matrix, so what is measured is the kernel's instructions a block,
//! not memory (decode's memory-bound figures are `moek bench`'s). One row of each block size
//! and format, 2816 values (the 26B-A4B's H) in 4 reduction segments of 704 (one of 2816 for
//! 256-value blocks).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use moek_cpu::Weight;
use moek_ir::quant::{BlockMxfp4, BlockQ4, BlockQ8, quantize};
use std::hint::black_box;

const H: usize = 2816;
const ROWS: usize = 64;

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1999) as f32 / 1000.0 - 1.0)
        .collect()
}

fn rows<Q: Weight>(c: &mut Criterion, name: &str) {
    let mat: Vec<Q> = quantize(&values(ROWS * H));
    let x = values(H);
    // Four reduction segments where they are whole blocks (256-value blocks do not divide 704:
    // one segment, as the kernels' eligibility allows for them).
    let seg = if 704 % Q::VALUES == 0 { 704 } else { H };
    let segs: Vec<(usize, usize)> = (0..H / seg).map(|i| (i * seg, (i + 1) * seg)).collect();
    // Made ready once, as the model does for every product of a row (gate and up, every
    // expert): what is timed is the products alone.
    let xr = Q::row(&x);
    let mut out = vec![0f32; ROWS];
    let mut g = c.benchmark_group("quantized_rows");
    g.throughput(Throughput::Elements((ROWS * H / 32) as u64));
    g.bench_function(format!("{name} ({})", moek_cpu::isa().name()), |b| {
        b.iter(|| Q::matvec_row(black_box(&xr), &mat, H, 0..ROWS, &segs, &mut out))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    rows::<BlockQ8<1>>(c, "q8_0 block 32");
    rows::<BlockQ4<1>>(c, "q4_0 block 32");
    rows::<BlockQ8<2>>(c, "q8_0 block 64");
    rows::<BlockQ4<2>>(c, "q4_0 block 64");
    rows::<BlockQ4<8>>(c, "q4_0 block 256");
    rows::<BlockMxfp4>(c, "mxfp4");
}

criterion_group!(quant, benches);
criterion_main!(quant);
