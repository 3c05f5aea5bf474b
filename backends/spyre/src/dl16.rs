//! IBM DLFloat16 (1 sign, 6 exponent, 9 fraction bits), the device's number format for both host
//! f16 and bf16. Rounding is to nearest even on the fraction; there are no subnormals (values
//! below the smallest normal flush to zero) and values beyond the largest finite saturate (our
//! reading of the public description; stated in docs/spyre-program.md).

/// Exponent bias.
const BIAS: i32 = 31;
/// Fraction bits.
const FRACTION: u32 = 9;
/// Smallest normal: 2^(1 - bias).
pub const MIN_NORMAL: f32 = 1.0 / (1u64 << 30) as f32;
/// Largest finite: 2^(62 - bias) * (2 - 2^-9) (the all-ones exponent is reserved).
pub const MAX: f32 = (1u64 << 31) as f32 * (2.0 - 1.0 / 512.0);

/// `x` rounded to the nearest DL16 value.
pub fn round(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < MIN_NORMAL {
        return 0.0f32.copysign(x);
    }
    let bits = x.to_bits();
    let drop = 23 - FRACTION;
    let half = 1u32 << (drop - 1);
    let lsb = (bits >> drop) & 1;
    let rounded = f32::from_bits((bits + half - 1 + lsb) & !((1u32 << drop) - 1));
    if rounded.abs() > MAX {
        MAX.copysign(x)
    } else {
        rounded
    }
}

/// `x` rounded to DL16 and packed into 16 bits (sign, 6 exponent bits, 9 fraction bits), so a
/// device tensor takes two bytes per element in the simulator as on the card.
pub fn encode(x: f32) -> u16 {
    let r = round(x);
    let sign = ((r.to_bits() >> 31) as u16) << 15;
    if r.is_nan() {
        return sign | 0x7FFF;
    }
    if r == 0.0 {
        return sign;
    }
    let bits = r.to_bits();
    let exponent = ((bits >> 23) & 0xFF) as i32 - 127 + BIAS;
    sign | ((exponent as u16) << FRACTION) | ((bits >> (23 - FRACTION)) & 0x1FF) as u16
}

/// The value of a packed DL16 number.
pub fn decode(v: u16) -> f32 {
    let sign = u32::from(v >> 15) << 31;
    let exponent = i32::from((v >> FRACTION) & 0x3F);
    let fraction = u32::from(v & 0x1FF);
    match exponent {
        0 => f32::from_bits(sign),
        63 => f32::NAN,
        e => {
            f32::from_bits(sign | (((e - BIAS + 127) as u32) << 23) | (fraction << (23 - FRACTION)))
        }
    }
}

/// `dst[i] = encode(src[i])`, in selects rather than branches so that it vectorises (binding
/// a bank encodes hundreds of millions of values).
pub fn encode_slice(src: &[f32], dst: &mut [u16]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512bw") {
        // SAFETY: AVX-512 BW (and so F) was detected.
        return unsafe { encode_slice_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { encode_slice_avx2(src, dst) };
    }
    encode_slice_any(src, dst);
}

/// The same code compiled for 512-bit vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn encode_slice_avx512(src: &[f32], dst: &mut [u16]) {
    encode_slice_any(src, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn encode_slice_avx2(src: &[f32], dst: &mut [u16]) {
    encode_slice_any(src, dst);
}

#[inline(always)]
fn encode_slice_any(src: &[f32], dst: &mut [u16]) {
    const DROP: u32 = 23 - FRACTION;
    const MIN_BITS: u32 = MIN_NORMAL.to_bits();
    const MAX_BITS: u32 = MAX.to_bits();
    const INF_BITS: u32 = f32::INFINITY.to_bits();
    for (d, &x) in dst.iter_mut().zip(src) {
        let bits = x.to_bits();
        let sign = (bits >> 31) << 15;
        let a = bits & 0x7FFF_FFFF;
        // Round to nearest even on the magnitude, as `round` does.
        let r = (a + (1 << (DROP - 1)) - 1 + ((a >> DROP) & 1)) & !((1 << DROP) - 1);
        let exponent = (r >> 23).wrapping_sub((127 - BIAS) as u32);
        let normal = (exponent << FRACTION) | ((r >> DROP) & 0x1FF);
        let largest = (((MAX_BITS >> 23) - (127 - BIAS) as u32) << FRACTION) | 0x1FF;
        let v = if a > INF_BITS {
            0x7FFF
        } else if a < MIN_BITS {
            0
        } else if r > MAX_BITS {
            largest
        } else {
            normal
        };
        *d = (sign | v) as u16;
    }
}

/// `dst[i] = decode(src[i])`, without branches so that it vectorises (the simulator's DMA
/// reads; a 256 KiB lookup table competed with the matmuls for L2).
pub fn decode_slice(src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512bw") {
        // SAFETY: AVX-512 BW (and so F) was detected.
        return unsafe { decode_slice_avx512(src, dst) };
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        return unsafe { decode_slice_avx2(src, dst) };
    }
    decode_slice_any(src, dst);
}

/// The same code compiled for 512-bit vectors.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_slice_avx512(src: &[u16], dst: &mut [f32]) {
    decode_slice_any(src, dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn decode_slice_avx2(src: &[u16], dst: &mut [f32]) {
    decode_slice_any(src, dst);
}

#[inline(always)]
fn decode_slice_any(src: &[u16], dst: &mut [f32]) {
    for (d, &v) in dst.iter_mut().zip(src) {
        let v = u32::from(v);
        let sign = (v >> 15) << 31;
        let exponent = (v >> FRACTION) & 0x3F;
        let normal = sign | ((exponent + (127 - BIAS) as u32) << 23) | ((v & 0x1FF) << 14);
        let bits = match exponent {
            0 => sign,
            63 => f32::NAN.to_bits(),
            _ => normal,
        };
        *d = f32::from_bits(bits);
    }
}

/// The exponent range, for tests and docs.
pub fn exponent_range() -> (i32, i32) {
    (1 - BIAS, 62 - BIAS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_nine_fraction_bits_rounding_to_even() {
        assert_eq!(round(1.0), 1.0);
        assert_eq!(round(1.0 + 1.0 / 512.0), 1.0 + 1.0 / 512.0);
        // Halfway between 1 and 1 + 2^-9 rounds to the even one (1).
        assert_eq!(round(1.0 + 1.0 / 1024.0), 1.0);
        // Halfway between 1 + 2^-9 and 1 + 2^-8 rounds to the even one (1 + 2^-8).
        assert_eq!(round(1.0 + 3.0 / 1024.0), 1.0 + 1.0 / 256.0);
        assert_eq!(round(-3.0), -3.0);
    }

    #[test]
    fn flushes_below_the_range_and_saturates_above() {
        assert_eq!(round(MIN_NORMAL / 2.0), 0.0);
        assert_eq!(round(MIN_NORMAL), MIN_NORMAL);
        assert_eq!(round(1e12), MAX);
        assert_eq!(round(-1e12), -MAX);
        assert_eq!(exponent_range(), (-30, 31));
    }

    #[test]
    fn packing_round_trips_every_rounded_value() {
        for i in -5000..5000 {
            let x = i as f32 * 0.013 + 1e-3;
            assert_eq!(decode(encode(x)), round(x), "{x}");
        }
        assert_eq!(decode(encode(MAX)), MAX);
        assert_eq!(decode(encode(-MIN_NORMAL)), -MIN_NORMAL);
        assert_eq!(decode(encode(1e-12)), 0.0);
    }

    /// A slice conversion, one path of it.
    type Slices<A, B> = fn(&[A], &mut [B]);

    #[test]
    fn the_slice_decode_agrees_with_decode_for_every_bit_pattern() {
        let all: Vec<u16> = (0..=u16::MAX).collect();
        let mut paths: Vec<(&str, Slices<u16, f32>)> =
            vec![("chosen", decode_slice), ("portable", decode_slice_any)];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            paths.push(("avx2", |s, d| unsafe { decode_slice_avx2(s, d) }));
        }
        for (path, decode_slice) in paths {
            let mut got = vec![0f32; all.len()];
            decode_slice(&all, &mut got);
            for (&v, g) in all.iter().zip(&got) {
                let want = decode(v);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{path}: {v:#06x}: {g} against {want}"
                );
            }
        }
    }

    #[test]
    fn the_slice_encode_agrees_with_encode() {
        let mut xs: Vec<f32> = (0..=u32::MAX).step_by(997).map(f32::from_bits).collect();
        xs.extend([
            0.0,
            -0.0,
            MIN_NORMAL,
            -MIN_NORMAL,
            MAX,
            -MAX,
            f32::INFINITY,
            f32::NAN,
        ]);
        xs.extend([
            f32::NEG_INFINITY,
            1.0 + 1.0 / 1024.0,
            1.0 + 3.0 / 1024.0,
            1e-12,
            -1e12,
        ]);
        let mut paths: Vec<(&str, Slices<f32, u16>)> =
            vec![("chosen", encode_slice), ("portable", encode_slice_any)];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected.
            paths.push(("avx2", |s, d| unsafe { encode_slice_avx2(s, d) }));
        }
        for (path, encode_slice) in paths {
            let mut got = vec![0u16; xs.len()];
            encode_slice(&xs, &mut got);
            for (x, g) in xs.iter().zip(&got) {
                assert_eq!(*g, encode(*x), "{path}: {x:e} ({:#010x})", x.to_bits());
            }
        }
    }

    #[test]
    fn relative_error_is_at_most_half_an_ulp() {
        for i in 1..10_000 {
            let x = i as f32 * 0.7371;
            assert!(((round(x) - x) / x).abs() <= 1.0 / 1024.0 + 1e-7);
        }
    }
}
