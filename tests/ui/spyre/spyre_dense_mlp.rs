use moek_kernels::kernel;

kernel! {
    pub k = dense_mlp {
        dims:    T = 1, H = 4096, F = 14336;
        dtypes:  bf16;
        targets: cpu, spyre;
    }
}

fn main() {}
