use moek_kernels::kernel;

kernel! {
    pub k = expert_ffn {
        dims:        T = 1, R = 8, E = 16, H = 2816, F = 704;
        dtypes:      q8_0;
        targets:     cpu;
        quant_block: 128;
        select:      gather E by R;
    }
}

fn main() {}
