use moek_kernels::kernel;

kernel! {
    pub k = dense_mlp {
        dims:    T, H, F;
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
    }
}

fn main() {}
