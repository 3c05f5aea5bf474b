use moek_kernels::kernel;

kernel! {
    pub k = gate_up {
        dims:    T = 1, R = 8, E = 16, H = 2816, F = 704;
        dtypes:  q8_0;
        targets: cpu;
        select:  gather E by R;
        cores:   R x H = 8 x 3;
    }
}

fn main() {}
