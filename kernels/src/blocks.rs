//! Where a block size known at run time becomes a type: [`with_block!`](crate::with_block).

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
