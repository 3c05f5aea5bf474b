use moek_kernels::kernel;

// The spec has one mistake; its module and `entry()` still exist, so the uses below add no
// unresolved-name errors to the one that matters.
kernel! {
    pub k = gate_up {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: cpu;
        select:  gather E by R;
        reduce:  H = 704 x 3;
    }
}

fn main() {
    let _ = k::entry();
    let _ = k::IR_JSON;
}
