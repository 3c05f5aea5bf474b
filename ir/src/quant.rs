//! Block-quantized weight formats: what a stored block is, how f32 values become one, and the
//! exact values it stands for.
//!
//! Both formats are llama.cpp's, with the block size a spec declares (`quant_block`, 32 by
//! default, as llama.cpp's): the values of a block share one f16 scale `d`.
//! - Q8_0 (2 + B bytes a block of B; 8.5 bits a weight at B = 32, 8.125 at 256): `value = d * q`,
//!   `q` an i8 in -127..=127, `d = amax / 127`.
//! - Q4_0 (2 + B/2 bytes; 4.5 bits a weight at B = 32, 4.125 at 256): `value = d * (q - 8)`, `q`
//!   a nibble in 0..=15; `d = m / -8` with `m` the value of largest magnitude (its sign kept, so
//!   that value maps to nibble 0 exactly).
//!
//! - MXFP4 (the OCP microscaling format gpt-oss ships; 17 bytes a block of 32, 4.25 bits a
//!   weight): `value = 2^(e - 127) * fp4(q)`, `q` an e2m1 nibble (sign, two exponent bits, one
//!   mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives) and `e` an e8m0 byte (255 is
//!   NaN). The format fixes the block at 32 values. Its values are `2^(e - 128)` times the
//!   integers `2 fp4(q)` (at most 12 in magnitude, [`MXFP4_STEPS`]), which the kernels widen
//!   exactly and multiply into an unrounded activation.
//!
//! A block of B values is B / 32 *groups* of 32 after its scale, each group laid out as a whole
//! llama.cpp block's values are (Q4_0: byte `j` of a group holds value `j` in its low nibble and
//! `j + 16` in its high): the kernels read a group at a time and quantize activations per group,
//! so a larger block only shares a scale among more groups. Block sizes are whole groups from
//! [`BLOCK_SIZES`]; each is a type (`BlockQ8<G>`, `G` groups) the kernels are compiled for.
//!
//! A block's values are exact in f32 (an f16 scale has 11 significant bits, `q` at most 8), so the
//! f64 reference of a quantized variant is the reference of these dequantized weights, with no
//! rounding of its own.

use crate::BlockFormat;
use crate::element::{Element, Kind};
use half::f16;

/// Values in one group: what the kernels read at a time, the unit activations are quantized in,
/// and the default block size (llama.cpp's).
pub const GROUP: usize = 32;

/// The default block size: one group.
pub const BLOCK: usize = GROUP;

/// The block sizes a spec may declare: 1, 2, 4 or 8 groups under one scale. Each is compiled
/// into the kernels and their tables, so the list is short; powers of two so a block always
/// divides a dim that a larger one does.
pub const BLOCK_SIZES: [usize; 4] = [GROUP, 2 * GROUP, 4 * GROUP, 8 * GROUP];

/// One Q8 block of `G` groups: an f16 scale (as its bits) and `32 G` signed bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ8<const G: usize = 1> {
    pub d: u16,
    pub qs: [[i8; GROUP]; G],
}

/// One Q4 block of `G` groups: an f16 scale (as its bits) and `32 G` nibbles, 16 bytes a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct BlockQ4<const G: usize = 1> {
    pub d: u16,
    pub qs: [[u8; GROUP / 2]; G],
}

/// One MXFP4 block: an e8m0 scale byte and 32 e2m1 nibbles, laid out as Q4_0's (value `j` in
/// byte `j`'s low nibble, `j + 16` in its high).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct BlockMxfp4 {
    pub e: u8,
    pub qs: [u8; GROUP / 2],
}

/// The e2m1 value of each nibble (bit 3 the sign).
pub const E2M1: [f32; 16] = [
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
];

/// Twice the e2m1 value of each nibble: the integers MXFP4 weights are in steps of half their
/// block's power of two.
pub const MXFP4_STEPS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// llama.cpp's Q8_0: one group a block.
pub type BlockQ8_0 = BlockQ8<1>;
/// llama.cpp's Q4_0: one group a block.
pub type BlockQ4_0 = BlockQ4<1>;

impl<const G: usize> Default for BlockQ8<G> {
    fn default() -> Self {
        BlockQ8 {
            d: 0,
            qs: [[0; GROUP]; G],
        }
    }
}

impl<const G: usize> Default for BlockQ4<G> {
    fn default() -> Self {
        BlockQ4 {
            d: 0,
            qs: [[0; GROUP / 2]; G],
        }
    }
}

// SAFETY: both are `repr(C)` over a u16 and byte arrays, sized 2 + 32 G and 2 + 16 G with
// alignment 2: no padding, and every bit pattern is a valid block.
unsafe impl<const G: usize> bytemuck::Zeroable for BlockQ8<G> {}
unsafe impl<const G: usize> bytemuck::Pod for BlockQ8<G> {}
unsafe impl<const G: usize> bytemuck::Zeroable for BlockQ4<G> {}
unsafe impl<const G: usize> bytemuck::Pod for BlockQ4<G> {}
// SAFETY: `repr(C)` over bytes alone (17 of them, alignment 1): no padding, every pattern valid.
unsafe impl bytemuck::Zeroable for BlockMxfp4 {}
unsafe impl bytemuck::Pod for BlockMxfp4 {}

impl<const G: usize> BlockQ8<G> {
    /// The block's scale.
    pub fn scale(&self) -> f32 {
        f16::from_bits(self.d).to_f32()
    }

    /// Value `i` of group `g` in steps of the scale: the byte.
    pub fn step(&self, g: usize, i: usize) -> i32 {
        i32::from(self.qs[g][i])
    }
}

impl<const G: usize> Element for BlockQ8<G> {
    const KIND: Kind = Kind::Blocks(BlockFormat::Q8_0);
    const VALUES: usize = G * GROUP;

    fn value(&self, i: usize) -> f32 {
        self.scale() * self.step(i / GROUP, i % GROUP) as f32
    }

    /// [`Element::value`] for every value, the scale converted once, in a loop the compiler
    /// vectorizes (the GEMM over blocks dequantizes panels of rows through it).
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.scale();
        for (o, q) in out[..Self::VALUES].chunks_exact_mut(GROUP).zip(&self.qs) {
            for (o, &q) in o.iter_mut().zip(q) {
                *o = d * f32::from(q);
            }
        }
    }

    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        assert_eq!(
            values.len(),
            Self::VALUES,
            "a Q8 block holds {} values",
            Self::VALUES
        );
        let amax = amax(values);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut b = BlockQ8::<G> {
            d: f16::from_f32(d).to_bits(),
            ..Default::default()
        };
        for (group, vs) in b.qs.iter_mut().zip(values.chunks_exact(GROUP)) {
            for (q, &v) in group.iter_mut().zip(vs) {
                *q = whole(rounded(v * id), -128.0, 127.0) as i8;
            }
        }
        b
    }
}

impl<const G: usize> BlockQ4<G> {
    /// Value `i`'s nibble (0..=15; the value is `d * (nibble - 8)`).
    pub fn nibble(&self, i: usize) -> u8 {
        let (g, i) = (i / GROUP, i % GROUP);
        let byte = self.qs[g][i % (GROUP / 2)];
        if i < GROUP / 2 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }

    /// The block's scale.
    pub fn scale(&self) -> f32 {
        f16::from_bits(self.d).to_f32()
    }

    /// Value `i` of group `g` in steps of the scale: the nibble less 8.
    pub fn step(&self, g: usize, i: usize) -> i32 {
        i32::from(self.nibble(g * GROUP + i)) - 8
    }
}

impl<const G: usize> Element for BlockQ4<G> {
    const KIND: Kind = Kind::Blocks(BlockFormat::Q4_0);
    const VALUES: usize = G * GROUP;

    fn value(&self, i: usize) -> f32 {
        self.scale() * self.step(i / GROUP, i % GROUP) as f32
    }

    /// [`Element::value`] for every value, as for Q8: each byte's low nibble is value `j` of
    /// its group, its high nibble value `j + 16`.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.scale();
        for (o, q) in out[..Self::VALUES].chunks_exact_mut(GROUP).zip(&self.qs) {
            let (low, high) = o.split_at_mut(GROUP / 2);
            for ((l, h), &b) in low.iter_mut().zip(high).zip(q) {
                *l = d * (i32::from(b & 0x0f) - 8) as f32;
                *h = d * (i32::from(b >> 4) - 8) as f32;
            }
        }
    }

    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        assert_eq!(
            values.len(),
            Self::VALUES,
            "a Q4 block holds {} values",
            Self::VALUES
        );
        // The first value of the largest magnitude (0 when all are zero or NaN), found in two
        // passes the compiler vectorizes rather than one chain of dependent selects.
        let amax = amax(values);
        let max = match amax {
            0.0 => 0.0,
            _ => values
                .iter()
                .copied()
                .find(|v| v.abs() == amax)
                .unwrap_or(0.0),
        };
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let q = |v: f32| whole((v * id + 8.5).trunc(), 0.0, 15.0) as u8;
        let mut b = BlockQ4::<G> {
            d: f16::from_f32(d).to_bits(),
            ..Default::default()
        };
        const HALF: usize = GROUP / 2;
        for (group, vs) in b.qs.iter_mut().zip(values.chunks_exact(GROUP)) {
            for (j, byte) in group.iter_mut().enumerate() {
                *byte = q(vs[j]) | (q(vs[j + HALF]) << 4);
            }
        }
        b
    }
}

/// The largest magnitude in `values` (a whole number of groups), NaNs ignored, 0 when there is
/// none: sixteen running maxima side by side, which a vector unit keeps in one register (the
/// maximum ignoring NaNs does not depend on the order it is taken in).
#[inline(always)]
fn amax(values: &[f32]) -> f32 {
    let mut lanes = [0f32; 16];
    for c in values.chunks_exact(16) {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    lanes.iter().fold(0f32, |m, &l| m.max(l))
}

/// `x` rounded half away from zero (`f32::round`, which x86 has no instruction for), from
/// `trunc` and exact operations, so that a loop of it vectorises.
#[inline(always)]
fn rounded(x: f32) -> f32 {
    let t = x.trunc();
    // Exact: `x - t` is `x`'s fraction (0 for the integral and NaN for the infinite).
    if (x - t).abs() >= 0.5 {
        t + 1f32.copysign(x)
    } else {
        t
    }
}

/// An integral `x` clamped to `lo..=hi` (within i16), NaN as 0: what `x as i32` then a clamp
/// give, in selects and an exact add (the integer lands in the low bits of 1.5 * 2^23 + x)
/// rather than a saturating conversion per value.
#[inline(always)]
fn whole(x: f32, lo: f32, hi: f32) -> i32 {
    const MAGIC: f32 = 12_582_912.0;
    let x = if x.is_nan() { 0.0 } else { x.clamp(lo, hi) };
    (x + MAGIC).to_bits() as i32 - MAGIC.to_bits() as i32
}

/// `2^(e - 127)` for every e8m0 scale byte `e` (subnormal at 0, NaN at 255): a kernel loads a
/// block's power of two from here (one broadcast from memory) instead of building it from bits.
pub static E8M0_POWERS: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = match e {
            255 => f32::NAN,
            0 => f32::from_bits(0x0040_0000),
            e => f32::from_bits((e as u32) << 23),
        };
        e += 1;
    }
    t
};

impl BlockMxfp4 {
    /// Value `i`'s nibble.
    pub fn nibble(&self, i: usize) -> u8 {
        let byte = self.qs[i % (GROUP / 2)];
        if i < GROUP / 2 {
            byte & 0x0f
        } else {
            byte >> 4
        }
    }

    /// The block's power of two, `2^(e - 127)`: the scale of [`E2M1`] (exact in f32 for every
    /// `e`, subnormal at 0; NaN for `e = 255`). Values times it pass f32's range only for
    /// `e >= 253` (no trained weight is near 2^125).
    pub fn power(&self) -> f32 {
        E8M0_POWERS[usize::from(self.e)]
    }

    /// Half the block's power of two, `2^(e - 128)`: the scale of [`MXFP4_STEPS`].
    pub fn scale(&self) -> f32 {
        self.power() / 2.0
    }

    /// Value `i` in steps of the scale.
    pub fn step(&self, i: usize) -> i32 {
        i32::from(MXFP4_STEPS[usize::from(self.nibble(i))])
    }
}

impl Element for BlockMxfp4 {
    const KIND: Kind = Kind::Blocks(BlockFormat::Mxfp4);
    const VALUES: usize = GROUP;

    fn value(&self, i: usize) -> f32 {
        self.scale() * self.step(i) as f32
    }

    /// [`Element::value`] for every value, the scale read once.
    #[inline]
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.scale();
        let (low, high) = out[..GROUP].split_at_mut(GROUP / 2);
        for ((l, h), &b) in low.iter_mut().zip(high).zip(&self.qs) {
            *l = d * f32::from(MXFP4_STEPS[usize::from(b & 0x0f)]);
            *h = d * f32::from(MXFP4_STEPS[usize::from(b >> 4)]);
        }
    }

    /// The OCP conversion: the shared exponent `floor(log2(amax)) - 2` (e2m1's largest
    /// exponent), then each value to the nearest e2m1 (ties to the even mantissa), clipped to
    /// +-6.
    #[inline(always)]
    fn quantize(values: &[f32]) -> Self {
        assert_eq!(values.len(), GROUP, "an MXFP4 block holds {GROUP} values");
        let amax = amax(values);
        // floor(log2(amax)) from the exponent of the value widened to f64 (f32 subnormals are
        // normal there).
        let exp = if amax > 0.0 {
            ((f64::from(amax).to_bits() >> 52) & 0x7ff) as i32 - 1023 - 2
        } else {
            -127
        };
        let e = (exp + 127).clamp(0, 254) as u8;
        let mut b = BlockMxfp4 {
            e,
            ..Default::default()
        };
        // In halves of the power of two, as the steps are; in f64, where 2^(128 - e) is finite.
        let inv = 2f64.powi(128 - i32::from(e));
        let q = |v: f32| mxfp4_nearest(f64::from(v) * inv);
        const HALF: usize = GROUP / 2;
        for (j, byte) in b.qs.iter_mut().enumerate() {
            *byte = q(values[j]) | (q(values[j + HALF]) << 4);
        }
        b
    }
}

/// The nibble of the step ([`MXFP4_STEPS`]) nearest `x`, ties to the even mantissa (the even
/// nibble), magnitudes past 12 clipped, zero as +0; a NaN or infinity gives +0. Each
/// magnitude code is the number of midpoints between steps that `|x|` passes, a tie passing
/// the midpoint only where the step above has the even code.
pub fn mxfp4_nearest(x: f64) -> u8 {
    if !x.is_finite() {
        return 0;
    }
    let a = x.abs();
    let code = u8::from(a > 0.5)
        + u8::from(a >= 1.5)
        + u8::from(a > 2.5)
        + u8::from(a >= 3.5)
        + u8::from(a > 5.0)
        + u8::from(a >= 7.0)
        + u8::from(a > 10.0);
    if code > 0 && x < 0.0 { code | 8 } else { code }
}

/// `values` (a whole number of blocks) in blocks of `Q`.
pub fn quantize<Q: Element>(values: &[f32]) -> Vec<Q> {
    assert_eq!(
        values.len() % Q::VALUES,
        0,
        "{} values are not whole blocks of {}",
        values.len(),
        Q::VALUES
    );
    values.chunks_exact(Q::VALUES).map(Q::quantize).collect()
}

/// The exact values of `blocks`.
pub fn dequantize<Q: Element>(blocks: &[Q]) -> Vec<f32> {
    let mut out = vec![0f32; blocks.len() * Q::VALUES];
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(Q::VALUES)) {
        b.dequantize(o);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorisable forms give what `round` and a saturating `as` give, on the cases where
    /// they could part: ties, NaNs, infinities, signed zeros, values past either end.
    #[test]
    fn rounding_and_clamping_match_the_library_forms() {
        let mut cases = vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            3e38,
            -3e38,
            8_388_607.5,
            16_777_216.0,
        ];
        cases.extend((-600..600).map(|i| i as f32 / 4.0));
        cases.extend((0..1_000_000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        for x in cases {
            assert_eq!(
                whole(rounded(x), -128.0, 127.0) as i8,
                x.round() as i8,
                "{x:e}"
            );
            assert_eq!(
                whole(x.trunc(), 0.0, 15.0),
                (x as i32).clamp(0, 15),
                "{x:e}"
            );
        }
    }

    /// The nearest step by search over all sixteen, ties to the even nibble and +0 first.
    fn nearest_by_search(x: f64) -> u8 {
        let mut best = 0u8;
        for n in 0..16u8 {
            let d = |i: u8| (x - f64::from(MXFP4_STEPS[usize::from(i)])).abs();
            if d(n) < d(best) || (d(n) == d(best) && n % 2 == 0 && best % 2 == 1) {
                best = n;
            }
        }
        best
    }

    /// Q4_0's scale follows the first value of the largest magnitude, as llama.cpp's does: its
    /// sign decides which end of the nibbles the largest values take; all zeros scale by 0.
    #[test]
    fn q4_scale_follows_the_first_largest_value() {
        let mut v = [0f32; GROUP];
        (v[3], v[9], v[20]) = (-2.0, 2.0, f32::NAN);
        let b = BlockQ4_0::quantize(&v);
        assert_eq!(b.scale(), 0.25, "-2 first: d = -2 / -8");
        assert_eq!((b.nibble(3), b.nibble(9)), (0, 15));
        (v[3], v[9]) = (2.0, -2.0);
        assert_eq!(BlockQ4_0::quantize(&v).scale(), -0.25);
        let zeros = BlockQ4_0::quantize(&[-0.0; GROUP]);
        assert_eq!(zeros.d, f16::from_f32(0.0 / -8.0).to_bits());
    }

    #[test]
    fn mxfp4_nearest_is_the_nearest_step_ties_to_even() {
        // Every midpoint and step, just beside each, and a sweep past the largest step.
        let mut xs: Vec<f64> = (0..=60).map(|i| f64::from(i) * 0.25).collect();
        xs.extend((0..4000).map(|i| f64::from(i) * 0.0043 - 0.3));
        let beside: Vec<f64> = xs.iter().flat_map(|&x| [x - 1e-9, x + 1e-9]).collect();
        xs.extend(beside);
        for x in xs.iter().flat_map(|&x| [x, -x]) {
            assert_eq!(mxfp4_nearest(x), nearest_by_search(x), "x = {x}");
        }
    }

    fn ramp(seed: u32) -> Vec<f32> {
        ramp_of(BLOCK, seed)
    }

    fn ramp_of(n: usize, seed: u32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| ((i * 37 + seed * 11) % 64) as f32 / 16.0 - 2.0)
            .collect()
    }

    /// Round to nearest: every value is within `steps` of its block's scale (half a step; Q4_0's
    /// range is -8..=7 steps, so a value of the other sign than the largest one can clip by one).
    fn within<Q: Element>(values: &[f32], steps: f32, scale: fn(&Q) -> f32) {
        let b = Q::quantize(values);
        let mut got = vec![0f32; Q::VALUES];
        b.dequantize(&mut got);
        // The f16 scale rounds too: allow its relative 2^-11 on the largest value.
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        let slack = scale(&b).abs() * steps + amax * 2f32.powi(-10);
        for (g, v) in got.iter().zip(values) {
            assert!(
                (g - v).abs() <= slack,
                "{v} became {g} (scale {})",
                scale(&b)
            );
        }
    }

    #[test]
    fn blocks_are_their_documented_sizes() {
        assert_eq!(std::mem::size_of::<BlockQ8_0>(), 34);
        assert_eq!(std::mem::size_of::<BlockQ4_0>(), 18);
        assert_eq!(std::mem::size_of::<BlockQ8<8>>(), 2 + 256);
        assert_eq!(std::mem::size_of::<BlockQ4<8>>(), 2 + 128);
    }

    /// A block of several groups: one scale from the whole block, each group laid out as a
    /// one-group block is (so a value's nibble is where llama.cpp's layout puts it in its group).
    #[test]
    fn larger_blocks_share_one_scale_and_keep_the_group_layout() {
        let v = ramp_of(4 * GROUP, 5);
        within(&v, 0.5, BlockQ8::<4>::scale);
        within(&v, 1.0, BlockQ4::<4>::scale);
        let mut big = v.clone();
        big[3 * GROUP + 20] = 9.0;
        let b = BlockQ4::<4>::quantize(&big);
        assert_eq!(
            b.nibble(3 * GROUP + 20),
            0,
            "the largest value maps to nibble 0"
        );
        assert_eq!(
            b.qs[3][4] >> 4,
            0,
            "value 20 of group 3 is the high nibble of its byte 4"
        );
        let amax = big.iter().fold(0f32, |m, x| m.max(x.abs()));
        let q8 = BlockQ8::<4>::quantize(&big);
        assert_eq!(q8.scale(), f16::from_f32(amax / 127.0).to_f32());
        assert_eq!(q8.qs[3][20], 127);
    }

    #[test]
    fn quantized_values_are_within_a_step() {
        for seed in 0..8 {
            within(&ramp(seed), 0.5, BlockQ8_0::scale);
            within(&ramp(seed), 1.0, BlockQ4_0::scale);
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

    /// MXFP4: every representable value (each nibble at a few exponents) comes back exactly,
    /// and a block's largest value is within its format's largest step of the original.
    #[test]
    fn mxfp4_is_exact_on_its_grid_and_near_elsewhere() {
        // Above 252 the largest values pass f32's range (6 x 2^127 at e = 254).
        for e in [0u8, 1, 2, 100, 127, 130, 252] {
            for n in 0..16u8 {
                let b = BlockMxfp4 {
                    e,
                    qs: [n | (n << 4); GROUP / 2],
                };
                let want = f64::from(MXFP4_STEPS[usize::from(n)]) * 2f64.powi(i32::from(e) - 128);
                assert_eq!(f64::from(b.value(3)), want, "e {e} nibble {n}");
                assert_eq!(
                    BlockMxfp4::quantize(&[b.value(0); GROUP]).value(0),
                    b.value(0)
                );
            }
        }
        assert!(
            BlockMxfp4 {
                e: 255,
                qs: [0; 16]
            }
            .value(0)
            .is_nan()
        );
        let v = ramp(7);
        let b = BlockMxfp4::quantize(&v);
        let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (i, &x) in v.iter().enumerate() {
            // e2m1's widest gap is 2 (4 to 6) at the top exponent: half of it, scaled.
            assert!(
                (b.value(i) - x).abs() <= amax / 4.0 + 1e-6,
                "{x} became {}",
                b.value(i)
            );
        }
    }

    /// Each format's whole-block dequantization is its per-value one, bit for bit.
    #[test]
    fn dequantize_is_every_value() {
        fn check<Q: Element>() {
            for b in quantize::<Q>(&ramp_of(4 * Q::VALUES, 3)) {
                let mut out = vec![f32::NAN; Q::VALUES];
                b.dequantize(&mut out);
                for (i, o) in out.iter().enumerate() {
                    assert_eq!(o.to_bits(), b.value(i).to_bits(), "value {i}");
                }
            }
        }
        check::<BlockQ8<1>>();
        check::<BlockQ8<4>>();
        check::<BlockQ4<1>>();
        check::<BlockQ4<8>>();
        check::<BlockMxfp4>();
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
