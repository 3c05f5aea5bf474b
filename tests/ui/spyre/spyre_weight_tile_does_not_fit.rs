use moek_kernels::kernel;

// Resident operands fit, but one whole-stick tile of gate and up weights (double-buffered) over
// an 8192-term reduction does not: the LX plan is computed at compile time and refused.
kernel! {
    pub k = gate_up {
        dims:    T = 1, R = 8, E = 8, H = 8192, F = 64;
        dtypes:  bf16;
        targets: spyre;
        select:  gather E by R;
        cores:   R = 8;
    }
}

fn main() {}
