use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T = 1, R = 4, E = 32, H = 2880, F = 2880;
        dtypes:  bf16;
        targets: cpu, spyre;
        select:  gather E by R;
        bias:    gate_up, down;
        cores:   R = 4;
    }
}

fn main() {}
