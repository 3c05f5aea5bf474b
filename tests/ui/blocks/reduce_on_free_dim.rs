use moek_kernels::kernel;

kernel! {
    pub k = gate_up {
        dims:    T, R, E, H, F;
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
        reduce:  H = 704 x 4;
    }
}

fn main() {}
