use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T, R, E, H, F;
        dtypes:  bf16, q8_0_bf16;
        targets: cpu;
        select:  grouped E by R;
    }
}

fn main() {}
