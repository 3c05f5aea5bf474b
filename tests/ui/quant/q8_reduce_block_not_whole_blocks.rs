use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T = 1, R = 8, E = 16, H = 2816, F = 704;
        dtypes:  bf16, q8_0;
        targets: cpu;
        select:  gather E by R;
        reduce:  H = [700, 2116];
    }
}

fn main() {}
