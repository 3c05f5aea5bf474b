use moek_kernels::ir::{DType, Target};
use moek_kernels::kernel;

kernel! {
    /// One spec, plain and quantized weights: one CPU variant per dtype, each held to the
    /// reference on the weights it reads (for q8_0, the blocks' exact values).
    pub my_experts = expert_ffn {
        dims:    T, R, E, H = 256, F = 96;
        dtypes:  bf16, q8_0, q4_0, q4_0_bf16;
        targets: cpu;
        select:  gather E by R;
        reduce:  H = 128 x 2;
        cores:   R = 2;
    }

    /// Blocks of 128 values under one scale: H and F are whole blocks, and so is each
    /// reduction block.
    pub my_wide_blocks = expert_ffn {
        dims:        T, R, E, H = 256, F = 128;
        dtypes:      q8_0, q4_0_bf16;
        targets:     cpu;
        quant_block: 128;
        select:      gather E by R;
        reduce:      H = 128 x 2;
        cores:       R = 2;
    }

    /// Prefill: tokens grouped by expert, each expert's rows dequantized a panel at a time
    /// for the GEMM tiles.
    pub my_grouped_experts = expert_ffn {
        dims:    T = 2.., R, E, H = 256, F = 96;
        dtypes:  q8_0, q4_0, q4_0_bf16;
        targets: cpu;
        select:  grouped E by R;
        reduce:  H = 128 x 2;
    }
}

fn main() {
    for dtype in [DType::Bf16, DType::Q8_0, DType::Q4_0, DType::Q4_0Bf16] {
        moek_kernels::testing::check_spec(&my_experts::entry(), Target::Cpu, dtype);
    }
    assert_eq!(my_wide_blocks::entry().ir().quant_block, 128);
    for dtype in [DType::Q8_0, DType::Q4_0Bf16] {
        moek_kernels::testing::check_spec(&my_wide_blocks::entry(), Target::Cpu, dtype);
    }
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q4_0Bf16] {
        moek_kernels::testing::check_spec(&my_grouped_experts::entry(), Target::Cpu, dtype);
    }
}
