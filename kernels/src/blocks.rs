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
    out.par_iter_mut()
        .zip(values.par_chunks_exact(Q::VALUES))
        .for_each(|(b, v)| {
            let mut block = [0f32; BLOCK_SIZES[BLOCK_SIZES.len() - 1]];
            let block = &mut block[..v.len()];
            block.iter_mut().zip(v).for_each(|(x, w)| *x = w.to_f32());
            *b = Q::quantize(block);
        });
    out
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
