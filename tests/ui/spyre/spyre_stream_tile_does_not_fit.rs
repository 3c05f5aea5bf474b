use moek_kernels::kernel;

// A fixed stream tile of 704 F columns over the whole 2816-term reduction: gate and up tiles alone
// need 7.9 MB of LX.
kernel! {
    pub k = gate_up {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: spyre;
        select:  gather E by R;
        cores:   R = 8;
        stream:  F = 704;
    }
}

fn main() {}
