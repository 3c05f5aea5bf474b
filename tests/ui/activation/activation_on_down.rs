use moek_kernels::kernel;

kernel! {
    pub k = down {
        dims:       T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:     bf16;
        targets:    cpu;
        activation: silu;
        select:     gather E by R;
    }
}

fn main() {}
