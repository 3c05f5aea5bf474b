//! Elementwise functions over slices, per ISA. The scalar functions are `moek_ir::scalar`'s (the
//! one definition every run time shares), re-exported here.

pub use moek_ir::scalar::{gelu_tanh, silu, softcap, swiglu_clamped, tanh};

/// [`softcap`] over a slice, in place; the same bits as the scalar function on every ISA.
pub fn softcap_slice(xs: &mut [f32], cap: f32) {
    crate::isa::vectorised(
        #[inline(always)]
        || xs.iter_mut().for_each(|x| *x = softcap(*x, cap)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use moek_ir::scalar::{CLAMP, TINY};

    /// Inputs across tanh's fit, its clamp and its small-argument cut, both signs.
    fn sweep() -> impl Iterator<Item = f32> {
        let dense = (-200_000..=200_000).map(|i| i as f32 * 1e-4);
        let wide = [-1e30, -100.0, -CLAMP, -TINY, 0.0, TINY, CLAMP, 100.0, 1e30];
        dense.chain(wide)
    }

    #[test]
    fn softcap_slice_matches_the_scalar_function_bit_for_bit() {
        let mut xs: Vec<f32> = sweep().collect();
        let want: Vec<u32> = xs.iter().map(|&x| softcap(x, 30.0).to_bits()).collect();
        softcap_slice(&mut xs, 30.0);
        let got: Vec<u32> = xs.iter().map(|x| x.to_bits()).collect();
        assert!(got == want, "the slice path differs from the scalar path");
    }
}
