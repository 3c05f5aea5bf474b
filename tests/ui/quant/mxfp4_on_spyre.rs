use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T = 1, R = 8, E = 128, H = 2816, F = 704;
        dtypes:  mxfp4;
        targets: cpu, spyre;
        select:  gather E by R;
        reduce:  H = 704 x 4;
        cores(gate_up): R = 8;
        cores(down):    R = 8;
    }
}

fn main() {}
