use moek_kernels::kernel;

// Five mistakes in one spec: every one is reported, each on its own token.
kernel! {
    pub k = gate_up {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704, K = 8;
        dtypes:  bf16, fp8;
        targets: cpu, spyre;
        select:  gather E by R;
        reduce:  H = 704 x 3;
        cores:   R = 3;
        colour:  blue;
    }
}

fn main() {}
