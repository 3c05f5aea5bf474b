use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:        T, R, E, H, F;
        dtypes:      bf16;
        targets:     cpu;
        select:      gather E by R;
        output_gate: sigmoid;
    }
}

fn main() {}
