use moek_kernels::kernel;

kernel! {
    pub k = gate_up {
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
    }
}

fn main() {}
