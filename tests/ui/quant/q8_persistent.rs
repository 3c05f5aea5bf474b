use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:    T, R, E, H, F;
        dtypes:  q8_0;
        targets: cpu, wgpu;
        select:  dense E;
        loop:    E persistent;
    }
}

fn main() {}
