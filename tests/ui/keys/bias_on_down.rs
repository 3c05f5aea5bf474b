use moek_kernels::kernel;

kernel! {
    pub k = down {
        dims:    T, R, E, H, F;
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
        bias:    down;
    }
}

fn main() {}
