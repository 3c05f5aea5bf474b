//! Blocks: where a block size known at run time becomes a type
//! ([`with_block!`](crate::with_block)), and weights of any stored element quantized to them
//! ([`quantize`]; `moek_ir::quant::dequantize` gives blocks back their exact values).

use moek_ir::Element;
use moek_ir::quant::BLOCK_SIZES;
use rayon::prelude::*;

/// `values` (whole blocks of `Q`) quantized block by block in parallel, each block widened to
/// f32 on the stack (never the whole weight); with the `cpu` feature into huge pages, as the
/// banks are streamed like any weight.
pub fn quantize<W: Element, Q: Element>(values: &[W]) -> Vec<Q> {
    assert!(
        values.len().is_multiple_of(Q::VALUES),
        "{} values are not whole blocks of {}",
        values.len(),
        Q::VALUES
    );
    #[cfg(feature = "cpu")]
    let mut out: Vec<Q> = moek_cpu::memory::huge_vec(values.len() / Q::VALUES);
    #[cfg(not(feature = "cpu"))]
    let mut out = vec![Q::default(); values.len() / Q::VALUES];
    // Whole runs of blocks a task, each compiled for the level's vectors: Q8_0's `round` is an
    // instruction sequence there, a library call at the baseline.
    const BLOCKS: usize = 256;
    out.par_chunks_mut(BLOCKS)
        .zip(values.par_chunks(BLOCKS * Q::VALUES))
        .for_each(|(out, values)| {
            #[cfg(feature = "cpu")]
            moek_cpu::isa::vectorised(
                #[inline(always)]
                || blocks(values, out),
            );
            #[cfg(not(feature = "cpu"))]
            blocks(values, out);
        });
    out
}

/// `values` quantized into `out`, a block at a time, each widened to f32 on the stack.
#[inline(always)]
fn blocks<W: Element, Q: Element>(values: &[W], out: &mut [Q]) {
    for (b, v) in out.iter_mut().zip(values.chunks_exact(Q::VALUES)) {
        let mut block = [0f32; BLOCK_SIZES[BLOCK_SIZES.len() - 1]];
        let block = &mut block[..v.len()];
        block.iter_mut().zip(v).for_each(|(x, w)| *x = w.to_f32());
        *b = Q::quantize(block);
    }
}

/// Runs `$body` with `$Q` the block type of quantized `$dtype` (either activation) at `$block`
/// values a block, one of [`moek_ir::quant::BLOCK_SIZES`]: where a block size known at run time
/// (a spec's) becomes the type the kernels are compiled for.
#[macro_export]
#[doc(hidden)]
macro_rules! with_block {
    ($dtype:expr, $block:expr, |$Q:ident| $body:expr) => {{
        use $crate::__private::ir::BlockFormat;
        use $crate::__private::ir::quant::{BlockMxfp4, BlockQ4, BlockQ8};
        match ($dtype.blocks(), $block) {
            (Some(BlockFormat::Q8_0), 32) => {
                type $Q = BlockQ8<1>;
                $body
            }
            (Some(BlockFormat::Q8_0), 64) => {
                type $Q = BlockQ8<2>;
                $body
            }
            (Some(BlockFormat::Q8_0), 128) => {
                type $Q = BlockQ8<4>;
                $body
            }
            (Some(BlockFormat::Q8_0), 256) => {
                type $Q = BlockQ8<8>;
                $body
            }
            (Some(BlockFormat::Q4_0), 32) => {
                type $Q = BlockQ4<1>;
                $body
            }
            (Some(BlockFormat::Q4_0), 64) => {
                type $Q = BlockQ4<2>;
                $body
            }
            (Some(BlockFormat::Q4_0), 128) => {
                type $Q = BlockQ4<4>;
                $body
            }
            (Some(BlockFormat::Q4_0), 256) => {
                type $Q = BlockQ4<8>;
                $body
            }
            (Some(BlockFormat::Mxfp4), 32) => {
                type $Q = BlockMxfp4;
                $body
            }
            (format, block) => unreachable!(
                "no block type for {format:?} at {block} values (the checker allows {:?})",
                $crate::__private::ir::quant::BLOCK_SIZES
            ),
        }
    }};
}

#[cfg(test)]
mod tests {
    use moek_ir::Element;
    use moek_ir::quant::{BlockMxfp4, BlockQ4, BlockQ8};

    /// The bulk quantizer (compiled for the level's vectors, in parallel) against the format's
    /// own, one block at a time at the baseline: the same bytes, NaNs, infinities, signed zeros,
    /// ties and values past the f16 scale's range among them.
    fn same_bytes<Q: Element + bytemuck::Pod>() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            0.5,
            -2.5,
            127.5,
            1e-40,
            3e38,
        ];
        let mut x = 0x9E37_79B9u32;
        let values: Vec<f32> = (0..(1 << 16) * Q::VALUES)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match i % 97 {
                    0 => specials[x as usize % specials.len()],
                    1..=40 => f32::from_bits(x),
                    _ => (x % 20001) as f32 / 1000.0 - 10.0,
                }
            })
            .collect();
        let bulk: Vec<Q> = super::quantize(&values);
        let one_by_one: Vec<Q> = moek_ir::quant::quantize(&values);
        assert!(
            bytemuck::cast_slice::<Q, u8>(&bulk) == bytemuck::cast_slice::<Q, u8>(&one_by_one),
            "{:?} blocks differ",
            Q::KIND
        );
    }

    #[test]
    fn bulk_quantizing_gives_the_formats_own_bytes() {
        same_bytes::<BlockQ8<1>>();
        same_bytes::<BlockQ8<8>>();
        same_bytes::<BlockQ4<1>>();
        same_bytes::<BlockQ4<4>>();
        same_bytes::<BlockMxfp4>();
    }
}
