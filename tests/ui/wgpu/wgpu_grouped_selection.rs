use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T = 2.., R = 8, E = 128, H = 2816, F = 704;
        dtypes:  bf16;
        targets: cpu, wgpu;
        select:  grouped E by R;
    }
}

fn main() {}
