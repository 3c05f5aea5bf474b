//! Block-quantized weight formats: what a stored block is, how f32 values become one, and the
//! exact values it stands for.
//!
//! Both formats are llama.cpp's: 32 consecutive values of a row share one f16 scale `d`.
//! - Q8_0 (34 bytes a block, 8.5 bits a weight): `value = d * q`, `q` an i8 in -127..=127,
//!   `d = amax / 127`.
//! - Q4_0 (18 bytes a block, 4.5 bits a weight): `value = d * (q - 8)`, `q` a nibble in 0..=15;
//!   `d = m / -8` with `m` the value of largest magnitude (its sign kept, so that value maps to
//!   nibble 0 exactly); byte `j` holds value `j` in its low nibble and value `j + 16` in its high.
//!
//! A block's values are exact in f32 (an f16 scale has 11 significant bits, `q` at most 8), so the
//! f64 reference of a quantized variant is the reference of these dequantized weights, with no
//! rounding of its own.

use crate::DType;
use half::f16;

/// Values in one block of either format.
pub const BLOCK: usize = 32;

/// One Q8_0 block: an f16 scale (as its bits) and 32 signed bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; BLOCK],
}

/// One Q4_0 block: an f16 scale (as its bits) and 32 nibbles in 16 bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; BLOCK / 2],
}

// SAFETY: both are `repr(C)` over u16 and byte arrays, sized 34 and 18 with alignment 2: no
// padding, and every bit pattern is a valid block.
unsafe impl bytemuck::Zeroable for BlockQ8_0 {}
unsafe impl bytemuck::Pod for BlockQ8_0 {}
unsafe impl bytemuck::Zeroable for BlockQ4_0 {}
unsafe impl bytemuck::Pod for BlockQ4_0 {}

/// How many values one stored element of a weight tensor holds: one for the plain dtypes, a
/// block for the quantized ones. Offsets into a weight tensor are counted in values and divided
/// by this (rows are whole blocks, which the checker and the input checks hold).
pub trait Packed: bytemuck::Pod {
    const VALUES: usize;
}

impl Packed for f16 {
    const VALUES: usize = 1;
}
impl Packed for half::bf16 {
    const VALUES: usize = 1;
}
impl Packed for f32 {
    const VALUES: usize = 1;
}
impl Packed for BlockQ8_0 {
    const VALUES: usize = BLOCK;
}
impl Packed for BlockQ4_0 {
    const VALUES: usize = BLOCK;
}

/// A block-quantized weight format.
pub trait Quantized: Packed + Default + Send + Sync + PartialEq + std::fmt::Debug {
    /// The spec dtype that stores weights in this format.
    const DTYPE: DType;
    /// The block's scale.
    fn scale(&self) -> f32;
    /// The block of `values` (exactly [`BLOCK`] of them).
    fn quantize(values: &[f32]) -> Self;
    /// The exact values the block stands for.
    fn dequantize(&self, out: &mut [f32]);
}

impl Quantized for BlockQ8_0 {
    const DTYPE: DType = DType::Q8_0;

    fn scale(&self) -> f32 {
        f16::from_bits(self.d).to_f32()
    }

    fn quantize(values: &[f32]) -> Self {
        assert_eq!(values.len(), BLOCK, "a Q8_0 block holds {BLOCK} values");
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0i8; BLOCK];
        for (q, &v) in qs.iter_mut().zip(values) {
            *q = (v * id).round() as i8;
        }
        BlockQ8_0 {
            d: f16::from_f32(d).to_bits(),
            qs,
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.scale();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * f32::from(q);
        }
    }
}

impl BlockQ4_0 {
    /// Value `i`'s nibble (0..=15; the value is `d * (nibble - 8)`).
    pub fn nibble(&self, i: usize) -> u8 {
        let byte = self.qs[i % (BLOCK / 2)];
        if i < BLOCK / 2 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }
}

impl Quantized for BlockQ4_0 {
    const DTYPE: DType = DType::Q4_0;

    fn scale(&self) -> f32 {
        f16::from_bits(self.d).to_f32()
    }

    fn quantize(values: &[f32]) -> Self {
        assert_eq!(values.len(), BLOCK, "a Q4_0 block holds {BLOCK} values");
        let max = values
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
        let mut qs = [0u8; BLOCK / 2];
        for (j, b) in qs.iter_mut().enumerate() {
            *b = q(values[j]) | (q(values[j + BLOCK / 2]) << 4);
        }
        BlockQ4_0 {
            d: f16::from_f32(d).to_bits(),
            qs,
        }
    }

    fn dequantize(&self, out: &mut [f32]) {
        let d = self.scale();
        for (i, o) in out.iter_mut().enumerate().take(BLOCK) {
            *o = d * (f32::from(self.nibble(i)) - 8.0);
        }
    }
}

/// `values` (a whole number of blocks) in blocks of `Q`.
pub fn quantize<Q: Quantized>(values: &[f32]) -> Vec<Q> {
    assert_eq!(
        values.len() % BLOCK,
        0,
        "{} values are not whole blocks of {BLOCK}",
        values.len()
    );
    values.chunks_exact(BLOCK).map(Q::quantize).collect()
}

/// The exact values of `blocks`.
pub fn dequantize<Q: Quantized>(blocks: &[Q]) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len() * BLOCK];
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(BLOCK)) {
        b.dequantize(o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(seed: u32) -> Vec<f32> {
        (0..BLOCK as u32)
            .map(|i| ((i * 37 + seed * 11) % 64) as f32 / 16.0 - 2.0)
            .collect()
    }

    /// Round to nearest: every value is within `steps` of its block's scale (half a step; Q4_0's
    /// range is -8..=7 steps, so a value of the other sign than the largest one can clip by one).
    fn within<Q: Quantized>(values: &[f32], steps: f32) {
        let b = Q::quantize(values);
        let mut got = vec![0f32; BLOCK];
        b.dequantize(&mut got);
        // The f16 scale rounds too: allow its relative 2^-11 on the largest value.
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let slack = b.scale().abs() * steps + amax * 2f32.powi(-10);
        for (g, v) in got.iter().zip(values) {
            assert!(
                (g - v).abs() <= slack,
                "{v} became {g} (scale {})",
                b.scale()
            );
        }
    }

    #[test]
    fn blocks_are_their_documented_sizes() {
        assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
        assert_eq!(std::mem::size_of::<BlockQ4_0>(), 18);
    }

    #[test]
    fn quantized_values_are_within_a_step() {
        for seed in 0..8 {
            within::<BlockQ8_0>(&ramp(seed), 0.5);
            within::<BlockQ4_0>(&ramp(seed), 1.0);
        }
    }

    #[test]
    fn q4_maps_the_largest_value_to_nibble_zero() {
        let mut v = ramp(3);
        v[5] = -7.5;
        let b = BlockQ4_0::quantize(&v);
        assert_eq!(b.nibble(5), 0);
        let mut got = vec![0f32; BLOCK];
        b.dequantize(&mut got);
        assert!((got[5] + 7.5).abs() < 7.5 * 1e-3, "{}", got[5]);
    }

    #[test]
    fn zero_blocks_stay_zero() {
        let zeros = [0f32; BLOCK];
        assert!(
            dequantize(&[BlockQ8_0::quantize(&zeros)])
                .iter()
                .all(|&v| v == 0.0)
        );
        assert!(
            dequantize(&[BlockQ4_0::quantize(&zeros)])
                .iter()
                .all(|&v| v == 0.0)
        );
    }
}
