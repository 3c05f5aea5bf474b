//! The worked examples of docs/dsl.md ("One spec per model"): each model's decode expert FFN as a
//! user would write it. A test keeps the docs' copy and this one the same.
use moek_kernels::ir::Target;
use moek_kernels::kernel;

kernel! {
    /// Gemma-4 26B-A4B: GELU-tanh experts, H in four 704-term blocks, down in three column blocks.
    pub gemma4_decode = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:          bf16;
        targets:         cpu, wgpu, spyre;
        select:          gather E by R;
        reduce:          H = 704 x 4;
        columns:         H = [1024, 1024, 768];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Qwen3-30B-A3B: SiLU experts; H in four 512-term blocks, down in two column halves.
    pub qwen3_decode = expert_ffn {
        dims:            T = 1, R = 8, E = 128, H = 2048, F = 768;
        dtypes:          bf16;
        targets:         cpu, wgpu, spyre;
        activation:      silu;
        select:          gather E by R;
        reduce:          H = 512 x 4;
        columns:         H = [1024, 1024];
        cores(gate_up):  R = 8;
        cores(down):     R = 8;
        requires:        indexed_selection_layout;
    }

    /// Mixtral-8x7B: two routes over eight large SiLU experts. On Spyre one down weight tile
    /// over all 14336 terms of F does not fit LX: F is reduced in two 7168-term blocks.
    pub mixtral_decode = expert_ffn {
        dims:       T = 1, R = 2, E = 8, H = 4096, F = 14336;
        dtypes:     bf16;
        targets:    cpu, wgpu, spyre;
        activation: silu;
        select:     gather E by R;
        reduce:     F = 7168 x 2;
        cores:      R = 2;
    }

    /// DeepSeek-V2-Lite's routed experts: six of 64, SiLU. Its two shared experts are always on:
    /// one dense SiLU MLP of twice the width, beside (`deepseek_shared`).
    pub deepseek_decode = expert_ffn {
        dims:       T = 1, R = 6, E = 64, H = 2048, F = 1408;
        dtypes:     bf16;
        targets:    cpu, wgpu, spyre;
        activation: silu;
        select:     gather E by R;
        cores:      R = 6;
    }

    /// DeepSeek-V2-Lite's shared experts, as the dense MLP they compute.
    pub deepseek_shared = dense_mlp {
        dims:       T = 1, H = 2048, F = 2816;
        dtypes:     bf16;
        targets:    cpu, wgpu;
        activation: silu;
    }

    /// gpt-oss-20b: four of 32 experts with its clamped SwiGLU (limit 7, alpha 1.702) and
    /// biases on gate/up and down (the Spyre lowering has no bias operands yet).
    pub gpt_oss_decode = expert_ffn {
        dims:       T = 1, R = 4, E = 32, H = 2880, F = 2880;
        dtypes:     bf16;
        targets:    cpu, wgpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:       gate_up, down;
        select:     gather E by R;
        cores:      R = 4;
    }
}

fn main() {
    // Every one of them compiled for its targets, Spyre programs included.
    for entry in [
        gemma4_decode::entry(),
        qwen3_decode::entry(),
        mixtral_decode::entry(),
        deepseek_decode::entry(),
    ] {
        assert!(entry.ir().targets.contains(&Target::Spyre), "{}", entry.ir().name);
    }
    for entry in [deepseek_shared::entry(), gpt_oss_decode::entry()] {
        assert_eq!(entry.ir().targets, [Target::Cpu, Target::Wgpu], "{}", entry.ir().name);
    }
    assert_eq!(gpt_oss_decode::entry().ir().optional.to_string(), "gate_up_bias, down_bias");
}
