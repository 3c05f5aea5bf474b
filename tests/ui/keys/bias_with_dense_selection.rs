use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T = 2.., R, E, H, F;
        dtypes:  bf16;
        targets: cpu;
        select:  dense E;
        bias:    gate_up, down;
    }
}

fn main() {}
