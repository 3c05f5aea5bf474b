use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T, R, E, H, F;
        dtypes:  q4_k;
        targets: cpu;
        select:  gather E by R;
    }
}

fn main() {}
