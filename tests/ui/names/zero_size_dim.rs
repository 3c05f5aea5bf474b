use moek_kernels::kernel;

kernel! {
    pub k = gate_up {
        dims:    T = 0, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
    }
}

fn main() {}
