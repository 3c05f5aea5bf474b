use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     bf16;
        targets:    cpu;
        activation: swiglu_clamped(limit = 7.0, alpha = 1.702, beta = 1.0);
        select:     gather E by R;
    }
}

fn main() {}
