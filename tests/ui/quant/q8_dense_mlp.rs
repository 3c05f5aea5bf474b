use moek_kernels::kernel;

kernel! {
    pub k = dense_mlp {
        dims:    T, H, F;
        dtypes:  q8_0;
        targets: cpu;
    }
}

fn main() {}
