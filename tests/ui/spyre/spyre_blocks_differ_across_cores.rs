use moek_kernels::kernel;

// Column blocks 1024/1024/768 cut the two H halves differently: one program cannot serve both.
kernel! {
    pub k = down {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: spyre;
        select:  gather E by R;
        columns: H = [1024, 1024, 768];
        cores:   R x H = 8 x 2;
    }
}

fn main() {}
