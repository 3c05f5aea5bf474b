use moek_kernels::kernel;

// The persistent loop's lowering is not written yet: targeting spyre says so at compile time.
kernel! {
    pub k = expert_ffn {
        dims:    T = 512, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: spyre;
        select:  dense E;
        loop:    E persistent;
        groups:  T = 32;
    }
}

fn main() {}
