use moek_kernels::kernel;

// Mixtral's expert size: the down phase's F rows (14336) are too long for one weight tile.
kernel! {
    pub k = expert_ffn {
        dims:    T = 1, R = 2, E = 8, H = 4096, F = 14336;
        dtypes:  bf16;
        targets: spyre;
        select:  gather E by R;
        cores:   R = 2;
    }
}

fn main() {}
