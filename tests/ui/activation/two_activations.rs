use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     bf16;
        targets:    cpu;
        activation: silu, gelu_tanh;
        select:     gather E by R;
    }
}

fn main() {}
