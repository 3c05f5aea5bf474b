//! The tuned decode specs of docs/dsl.md ("Tuned specs"): what `moek tune --target cpu --write`
//! wrote at each model's decode geometry, compiled unchanged. A test keeps the docs' copy and
//! this one the same.
use moek_kernels::kernel;

kernel! {
    /// Tuned by `moek tune` for cpu at T=1,R=8,E=128,H=2816,F=704 (bf16):
    /// 50.397 GB/s against the built-in `decode_expert_ffn_blocked`'s 45.287.
    pub gemma4_decode_tuned = expert_ffn {
        dims:           T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:         bf16;
        targets:        cpu;
        select:         gather E by R;
        columns:        H = [512, 512, 512, 512, 512, 256];
        cores(gate_up): R = 8;
        cores(down):    R = 8;
        requires:       indexed_selection_layout;
    }

    /// Tuned by `moek tune` for cpu at T=1,R=8,E=128,H=2048,F=768 (bf16):
    /// 51.543 GB/s against the built-in `qwen3_decode_expert_ffn_blocked`'s 44.875.
    pub qwen3_decode_tuned = expert_ffn {
        dims:           T = 1, R = 8, E = 128, H = 2048, F = 768;
        dtypes:         bf16;
        targets:        cpu;
        activation:     silu;
        select:         gather E by R;
        columns:        H = [256, 256, 256, 256, 256, 256, 256, 256];
        cores(gate_up): R = 8;
        cores(down):    R = 8;
        requires:       indexed_selection_layout;
    }

    /// Tuned by `moek tune` for cpu at T=1,R=2,E=8,H=4096,F=14336 (bf16):
    /// 43.792 GB/s against the built-in `general_expert_ffn_gather_silu`'s 43.621.
    pub mixtral_decode_tuned = expert_ffn {
        dims:           T = 1, R = 2, E = 8, H = 4096, F = 14336;
        dtypes:         bf16;
        targets:        cpu;
        activation:     silu;
        select:         gather E by R;
        columns:        H = [512, 512, 512, 512, 512, 512, 512, 512];
        cores(gate_up): R x F = 2 x 16;
        cores(down):    R x H = 2 x 2;
        requires:       indexed_selection_layout;
    }

    /// Tuned by `moek tune` for cpu at T=1,R=6,E=64,H=2048,F=1408 (bf16):
    /// 49.114 GB/s against the built-in `general_expert_ffn_gather_silu`'s 45.501.
    pub deepseek_decode_tuned = expert_ffn {
        dims:           T = 1, R = 6, E = 64, H = 2048, F = 1408;
        dtypes:         bf16;
        targets:        cpu;
        activation:     silu;
        select:         gather E by R;
        reduce:         H = 512 x 4;
        cores(gate_up): R = 6;
        cores(down):    R = 6;
        requires:       indexed_selection_layout;
    }

    /// Tuned by `moek tune` for cpu at T=1,R=4,E=32,H=2880,F=2880 (bf16):
    /// 47.239 GB/s against the built-in `general_expert_ffn_gather_swiglu_biased`'s 46.740.
    pub gpt_oss_decode_tuned = expert_ffn {
        dims:           T = 1, R = 4, E = 32, H = 2880, F = 2880;
        dtypes:         bf16;
        targets:        cpu;
        activation:     swiglu_clamped(limit = 7.0, alpha = 1.702);
        bias:           gate_up, down;
        select:         gather E by R;
        reduce:         H = 720 x 4;
        columns:        H = [2048, 832];
        cores(gate_up): R = 4;
        cores(down):    R x H = 4 x 8;
        requires:       indexed_selection_layout;
    }
}

fn main() {
    for entry in [
        gemma4_decode_tuned::entry(),
        qwen3_decode_tuned::entry(),
        mixtral_decode_tuned::entry(),
        deepseek_decode_tuned::entry(),
        gpt_oss_decode_tuned::entry(),
    ] {
        assert!(entry.cpu.bf16.is_some(), "{}", entry.ir().name);
    }
}
