//! Random inputs: uniform values and blocks drawn in parallel chunks (the same values on any
//! thread count), routes, and the output rows a full-size run samples.

use super::*;

/// `len` values uniform in `[-scale, scale)`, drawn in parallel chunks (deterministic in `seed`).
///
/// With the `cpu` feature the buffer lives in huge pages (`moek_cpu::memory`): benches stream
/// these as weights, and 4 KiB pages would halve the bandwidth they measure.
pub fn uniform<W: Element>(len: usize, seed: u64, scale: f32) -> Vec<W> {
    #[cfg(feature = "cpu")]
    let mut v = moek_cpu::memory::huge_vec(len);
    #[cfg(not(feature = "cpu"))]
    let mut v = vec![W::default(); len];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
        let mut rng = chunk_rng(seed, i);
        c.iter_mut()
            .for_each(|x| *x = W::from_f32(rng.random_range(-scale..scale)));
    });
    v
}

/// [`uniform`]'s values in `W`, quantized to blocks of `Q` as they are drawn (never all held
/// in `W`): the blocks [`moek_ir::quant::quantize`] makes of `uniform::<W>(len, seed, scale)`.
pub fn uniform_blocks<W: Element, Q: Element>(len: usize, seed: u64, scale: f32) -> Vec<Q> {
    assert!(
        len.is_multiple_of(Q::VALUES),
        "{len} values are not whole blocks of {}",
        Q::VALUES
    );
    #[cfg(feature = "cpu")]
    let mut v = moek_cpu::memory::huge_vec(len / Q::VALUES);
    #[cfg(not(feature = "cpu"))]
    let mut v = vec![Q::default(); len / Q::VALUES];
    v.par_chunks_mut(CHUNK / Q::VALUES)
        .enumerate()
        .for_each(|(i, c)| {
            let mut rng = chunk_rng(seed, i);
            let mut values = vec![0f32; Q::VALUES];
            for b in c {
                for x in &mut values {
                    *x = W::from_f32(rng.random_range(-scale..scale)).to_f32();
                }
                *b = Q::quantize(&values);
            }
        });
    v
}

/// Values per independently seeded chunk of [`uniform`] (a multiple of the quantized block).
pub(super) const CHUNK: usize = 1 << 16;

pub(super) fn chunk_rng(seed: u64, chunk: usize) -> SmallRng {
    SmallRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ chunk as u64)
}

/// Top-`r` routes per token: distinct experts (when `r <= e`) with positive weights summing to 1.
pub fn routes(t: usize, r: usize, e: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut idx = Vec::with_capacity(t * r);
    let mut weights = Vec::with_capacity(t * r);
    let mut experts: Vec<u32> = (0..e as u32).collect();
    for _ in 0..t {
        for j in 0..r {
            let pick = if r <= e {
                rng.random_range(j..e)
            } else {
                rng.random_range(0..e)
            };
            experts.swap(j.min(e - 1), pick);
            idx.push(experts[j.min(e - 1)]);
        }
        let w: Vec<f32> = (0..r).map(|_| rng.random_range(0.05f32..1.0)).collect();
        let sum: f32 = w.iter().sum();
        weights.extend(w.iter().map(|x| x / sum));
    }
    (idx, weights)
}

/// Up to `n` distinct rows of `0..rows` (all when few): first, last, the argmax, and random ones.
pub(super) fn sample_rows(rows: usize, n: usize, seed: u64, argmax: Option<u32>) -> Vec<usize> {
    if rows <= n {
        return (0..rows).collect();
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5A5A);
    let mut pick = vec![0, rows - 1];
    pick.extend(argmax.map(|a| a as usize));
    while pick.len() < n {
        pick.push(rng.random_range(0..rows));
    }
    pick.sort_unstable();
    pick.dedup();
    pick
}
