use moek_kernels::kernel;

kernel! {
    pub k = dense_mlp {
        dims:        T, H, F;
        dtypes:      bf16;
        targets:     cpu;
        output_gate: tanh;
    }
}

fn main() {}
