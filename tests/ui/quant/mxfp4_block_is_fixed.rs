use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:        T = 1, R = 4, E = 32, H = 2880, F = 2880;
        dtypes:      mxfp4;
        targets:     cpu;
        quant_block: 64;
        select:      gather E by R;
    }
}

fn main() {}
