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
    fn relative_error_is_at_most_half_an_ulp() {
        for i in 1..10_000 {
            let x = i as f32 * 0.7371;
            assert!(((round(x) - x) / x).abs() <= 1.0 / 1024.0 + 1e-7);
        }
    }
}
