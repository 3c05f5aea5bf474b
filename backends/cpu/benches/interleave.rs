//! The measured A/B behind "repack Q4_0 into row-interleaved tiles at load?": Q4_0 row products
//! as the kernels read them today (row after row, each block's scale beside its nibbles), against
//! the same weights repacked 16 rows to a tile (llama.cpp repacks Q4_0 likewise on x86): tile
//! `(g, b)` holds block `b` of rows `16g..16g + 16`, their 16 scales in one 32-byte load and
//! their nibbles as four 64-byte vectors whose lane `l` is row `l`'s bytes `4k..4k + 4`. A lane
//! then sums one row, so the activation's bytes are broadcast and the scales are one load, where
//! the row kernel gathers and spreads a scale per block. A third contender keeps rows whole but
//! splits each: its scales first, then its nibbles (sixteen scales one load, four blocks'
//! nibbles one load, the activation read as the row kernel reads it), the cheaper layout change,
//! to say how much of the tiles' gain a row-major layout could keep. Every contender prefetches
//! each line of its steps as far ahead as the row kernel does, so only the layouts differ.
//!
//! Two groups: `in_cache` (one thread, a 101 KB matrix: instructions a block) and `streamed` (two
//! threads, a matrix as large as the bandwidth probe, in huge pages, each timed pass after a
//! probe pass: what decode sees). The tile and split kernels need AVX-512 VNNI; elsewhere the
//! bench says so and times the row kernel alone.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use moek_cpu::Weight;
use moek_cpu::bandwidth::Probe;
use moek_cpu::quant::QuantizedActivation;
use moek_ir::quant::{BlockQ4_0, quantize};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// The 26B-A4B's hidden size: one row's values.
const H: usize = 2816;
const BLOCKS: usize = H / 32;
// The split-row kernel steps four blocks at a time.
const _: () = assert!(BLOCKS.is_multiple_of(4));
/// One row's bytes, in every layout.
const ROW_BYTES: usize = BLOCKS * size_of::<BlockQ4_0>();
/// Every kernel prefetches as far ahead as the row kernel does.
const AHEAD: usize = moek_cpu::dot::BLOCKS_AHEAD;
/// Rows a tile interleaves: one per 32-bit lane of a 512-bit vector.
const LANES: usize = 16;

/// Block `b` of 16 rows: their scales, then their nibbles four bytes a lane.
#[derive(Clone, Copy)]
#[repr(C)]
struct Tile {
    d: [u16; LANES],
    qs: [u8; LANES * 16],
}

impl Default for Tile {
    fn default() -> Self {
        Tile {
            d: [0; LANES],
            qs: [0; LANES * 16],
        }
    }
}

/// `mat` (`rows` rows of [`BLOCKS`] blocks) as tiles, row group after row group, in huge pages.
fn repack(mat: &[BlockQ4_0], rows: usize) -> Vec<Tile> {
    let mut tiles: Vec<Tile> = moek_cpu::memory::huge_vec(rows / LANES * BLOCKS);
    for (i, t) in tiles.iter_mut().enumerate() {
        let (g, b) = (i / BLOCKS, i % BLOCKS);
        for l in 0..LANES {
            let block = &mat[(g * LANES + l) * BLOCKS + b];
            t.d[l] = block.d;
            for k in 0..4 {
                t.qs[k * 64 + l * 4..][..4].copy_from_slice(&block.qs[0][4 * k..4 * k + 4]);
            }
        }
    }
    tiles
}

/// A quantized activation as the tile kernel reads it, made once a token: per block, its
/// halves as four 32-bit words each (each broadcast to every lane), its offset (what the
/// nibbles' 8 adds) in one sum, its scale.
struct TileActivation {
    words: Vec<[i32; 8]>,
    offsets: Vec<i32>,
    scales: Vec<f32>,
}

impl TileActivation {
    /// From the row kernel's quantized activation, so both multiply the same integers.
    fn new(x: &QuantizedActivation) -> Self {
        let word = |v: &[i8]| i32::from_le_bytes(std::array::from_fn(|i| v[i] as u8));
        let words = (0..x.scales.len())
            .map(|b| {
                std::array::from_fn(|i| match i {
                    0..4 => word(&x.low[b * 16 + 4 * i..]),
                    _ => word(&x.high[b * 16 + 4 * (i - 4)..]),
                })
            })
            .collect();
        let offsets = x.offsets.chunks_exact(4).map(|o| o.iter().sum()).collect();
        TileActivation {
            words,
            offsets,
            scales: x.scales.clone(),
        }
    }
}

/// `out[l] = row 16g + l . x` for the row groups `tiles` holds.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
fn tile_rows(tiles: &[Tile], x: &TileActivation, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mask = _mm512_set1_epi8(0x0f);
    for (group, out) in tiles.chunks_exact(BLOCKS).zip(out.chunks_exact_mut(LANES)) {
        let mut acc = [_mm512_setzero_ps(); 4];
        let blocks = group.iter().zip(&x.words).zip(&x.offsets).zip(&x.scales);
        for (b, (((t, words), &offset), &xd)) in blocks.enumerate() {
            let at = (t as *const Tile).cast::<u8>();
            moek_cpu::memory::prefetch_span(at.wrapping_add(AHEAD), size_of::<Tile>());
            let (mut low, mut high) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..4 {
                let q = t.qs[64 * k..].as_ptr();
                // SAFETY: 64 bytes from `64k` are in `qs`.
                let w = unsafe { _mm512_loadu_si512(q.cast()) };
                // The high nibbles stay in place (16 times their value), shifted back once.
                let (lo, hi) = (_mm512_and_si512(w, mask), _mm512_andnot_si512(mask, w));
                low = _mm512_dpbusd_epi32(low, lo, _mm512_set1_epi32(words[k]));
                high = _mm512_dpbusd_epi32(high, hi, _mm512_set1_epi32(words[4 + k]));
            }
            let sum = _mm512_add_epi32(low, _mm512_srai_epi32::<4>(high));
            let sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(offset));
            // SAFETY: `d` is 32 bytes.
            let d = _mm512_cvtph_ps(unsafe { _mm256_loadu_si256(t.d.as_ptr().cast()) });
            let scale = _mm512_mul_ps(d, _mm512_set1_ps(xd));
            acc[b % 4] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sum), acc[b % 4]);
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        // SAFETY: `out` is 16 values.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
    }
}

/// `mat` with each row's blocks split: the row's scales first, then its nibbles, block after
/// block (as many bytes a row as before), in huge pages.
fn split_rows(mat: &[BlockQ4_0], rows: usize) -> Vec<u8> {
    let mut out: Vec<u8> = moek_cpu::memory::huge_vec(rows * ROW_BYTES);
    for (r, dst) in out.chunks_exact_mut(ROW_BYTES).enumerate() {
        let (d, qs) = dst.split_at_mut(BLOCKS * 2);
        for (b, block) in mat[r * BLOCKS..(r + 1) * BLOCKS].iter().enumerate() {
            d[2 * b..2 * b + 2].copy_from_slice(&block.d.to_le_bytes());
            qs[16 * b..16 * b + 16].copy_from_slice(&block.qs[0]);
        }
    }
    out
}

/// `out[j] = row j . x` over split rows: sixteen blocks' scales in one load (times the
/// activation's sixteen), four blocks' nibbles in one 64-byte load, the activation's halves
/// and offsets loaded as the row kernel loads them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")]
fn split_kernel(mat: &[u8], x: &QuantizedActivation, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let mask = _mm512_set1_epi8(0x0f);
    // Lane `i` of four blocks' sums belongs to block `4q + i / 4` of sixteen.
    let spread: [__m512i; 4] = std::array::from_fn(|q| {
        let at: [i32; 16] = std::array::from_fn(|i| (4 * q + i / 4) as i32);
        // SAFETY: 64 bytes.
        unsafe { _mm512_loadu_si512(at.as_ptr().cast()) }
    });
    let ahead = AHEAD;
    for (row, o) in mat.chunks_exact(ROW_BYTES).zip(out.iter_mut()) {
        let (d, qs) = (row.as_ptr(), row[BLOCKS * 2..].as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        for line in (0..BLOCKS * 2).step_by(64) {
            moek_cpu::memory::prefetch(d.wrapping_add(ahead + line));
        }
        for b in (0..BLOCKS).step_by(16) {
            let n = 16.min(BLOCKS - b);
            let m: __mmask16 = if n == 16 { 0xffff } else { (1u16 << n) - 1 };
            // SAFETY: every load is within the row and the activation (BLOCKS groups).
            unsafe {
                let dw = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, d.add(2 * b).cast()));
                let s = _mm512_mul_ps(dw, _mm512_maskz_loadu_ps(m, x.scales.as_ptr().add(b)));
                for q in 0..n / 4 {
                    let g = b + 4 * q;
                    let p = qs.add(16 * g);
                    moek_cpu::memory::prefetch(p.wrapping_add(ahead));
                    let w = _mm512_loadu_si512(p.cast());
                    let lo = _mm512_and_si512(w, mask);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask);
                    let xl = _mm512_loadu_si512(x.low.as_ptr().add(g * 16).cast());
                    let xh = _mm512_loadu_si512(x.high.as_ptr().add(g * 16).cast());
                    let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl);
                    let dot = _mm512_dpbusd_epi32(dot, hi, xh);
                    let off = _mm512_loadu_si512(x.offsets.as_ptr().add(g * 4).cast());
                    let dot = _mm512_sub_epi32(dot, off);
                    let sc = _mm512_permutexvar_ps(spread[q], s);
                    acc[q] = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(dot), acc[q]);
                }
            }
        }
        let sum = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        *o = _mm512_reduce_add_ps(sum);
    }
}

fn contenders_run() -> bool {
    #[cfg(target_arch = "x86_64")]
    return is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn split(mat: &[u8], x: &QuantizedActivation, out: &mut [f32]) {
    assert!(contenders_run());
    // SAFETY: the features were detected.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        split_kernel(mat, x, out)
    }
}

fn tiled(tiles: &[Tile], x: &TileActivation, out: &mut [f32]) {
    assert!(contenders_run());
    // SAFETY: the features were detected.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        tile_rows(tiles, x, out)
    }
}

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i + seed) * 7919) % 1999) as f32 / 1000.0 - 1.0)
        .collect()
}

/// Every kernel sums exact integer products of one quantized activation; only the f32 order
/// differs from the row kernel's.
fn assert_agree(rows: &[f32], other: &[f32], what: &str) {
    let worst = rows
        .iter()
        .zip(other)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1.0));
    assert!(
        worst.fold(0f32, f32::max) < 1e-4,
        "{what}: the kernel computes other sums"
    );
}

/// The row, split-row and tile kernels over one matrix of `rows` rows, split between `threads`,
/// each timed pass after a pass of `probe` where one is given.
fn pair(c: &mut Criterion, group: &str, rows: usize, threads: usize, probe: Option<&Probe>) {
    let mat: Vec<BlockQ4_0> = {
        let drawn: Vec<BlockQ4_0> = quantize(&values(rows * H, 1));
        let mut huge = moek_cpu::memory::huge_vec(drawn.len());
        huge.copy_from_slice(&drawn);
        huge
    };
    let x = values(H, 3);
    let xr = BlockQ4_0::row::<f32>(&x);
    let mut xq = QuantizedActivation::default();
    xq.quantize(&x);
    let tile_x = TileActivation::new(&xq);
    let segs = [(0, H)];
    let share = rows / threads;
    // Each thread's share of the rows, inline for one (a spawn would outweigh 64 rows).
    fn each_share(out: &mut [f32], share: usize, run: &(impl Fn(usize, &mut [f32]) + Sync)) {
        if out.len() == share {
            return run(0, out);
        }
        std::thread::scope(|s| {
            for (i, out) in out.chunks_mut(share).enumerate() {
                s.spawn(move || run(i, out));
            }
        })
    }
    let mut out = vec![0f32; rows];
    // Each timed pass after a pass of the probe where one is given, as decode reads its weights
    // after the rest of a step has read other memory (back to back, a pass finds part of the
    // matrix still in a large L3).
    let timed = |iters: u64, run: &mut dyn FnMut()| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            if let Some(p) = probe {
                black_box(p.best_of(1));
            }
            let start = Instant::now();
            run();
            total += start.elapsed();
        }
        total
    };
    let mut g = c.benchmark_group(group);
    g.sample_size(10)
        .throughput(Throughput::Bytes(size_of_val(&mat[..]) as u64));
    g.bench_function(BenchmarkId::new("rows", moek_cpu::isa().name()), |b| {
        let run = |i: usize, out: &mut [f32]| {
            let rows = i * share..(i + 1) * share;
            BlockQ4_0::matvec_row::<f32>(black_box(&xr), &mat, H, rows, &segs, out)
        };
        b.iter_custom(|iters| timed(iters, &mut || each_share(&mut out, share, &run)))
    });
    if !contenders_run() {
        eprintln!(
            "{group}: the tile and split kernels need AVX-512 VNNI, which this CPU lacks; rows alone"
        );
        return;
    }
    let tiles = repack(&mat, rows);
    let mut tiled_out = vec![0f32; rows];
    tiled(&tiles, &tile_x, &mut tiled_out);
    BlockQ4_0::matvec_row::<f32>(&xr, &mat, H, 0..rows, &segs, &mut out);
    assert_agree(&out, &tiled_out, "tiles");
    let split_mat = split_rows(&mat, rows);
    let mut split_out = vec![0f32; rows];
    split(&split_mat, &xq, &mut split_out);
    assert_agree(&out, &split_out, "split rows");
    g.bench_function(BenchmarkId::new("split", moek_cpu::isa().name()), |b| {
        let per = share * ROW_BYTES;
        let run =
            |i: usize, out: &mut [f32]| split(black_box(&split_mat[i * per..][..per]), &xq, out);
        b.iter_custom(|iters| timed(iters, &mut || each_share(&mut split_out, share, &run)))
    });
    g.bench_function(BenchmarkId::new("tiles", moek_cpu::isa().name()), |b| {
        let per = share / LANES * BLOCKS;
        let run =
            |i: usize, out: &mut [f32]| tiled(black_box(&tiles[i * per..][..per]), &tile_x, out);
        b.iter_custom(|iters| timed(iters, &mut || each_share(&mut tiled_out, share, &run)))
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    pair(c, "interleave_in_cache", 64, 1, None);
    // Past the largest cache twice over, as the probe reads: a matrix the L3 could partly keep
    // from one pass to the next would stream faster than memory does.
    let bytes = moek_cpu::bandwidth::probe_bytes();
    let streamed = bytes.div_ceil(ROW_BYTES).next_multiple_of(2 * LANES);
    let probe = Probe::new(bytes);
    pair(c, "interleave_streamed", streamed, 2, Some(&probe));
    eprintln!("bandwidth probe: {:.1} GB/s", probe.best_of(5) / 1e9);
}

criterion_group!(interleave, benches);
criterion_main!(interleave);
