use moek_kernels::kernel;

kernel! {
    /// First.
    pub a = dense_mlp {
        dims:    T, H = 256, F = 128;
        dtypes:  bf16;
        targets: cpu;
        reduce:  H = 128 x 2;
    }

    /// Second, private.
    b = lm_head_row {
        dims:    T, H, V;
        dtypes:  f32;
        targets: cpu;
    }
}

fn main() {
    assert_eq!(a::entry().name(), "a");
    assert_eq!(b::entry().name(), "b");
}
