use moek_kernels::kernel;

// One persistent loop runs on one set of cores: gate/up on 32, down on 16 cannot share it.
kernel! {
    pub k = expert_ffn {
        dims:           T = 512, R = 8, E = 128, H = 2816, F = 704;
        dtypes:         bf16;
        targets:        spyre;
        select:         dense E;
        loop:           E persistent;
        groups:         T = 32;
        cores(gate_up): T x H = 8 x 4;
        cores(down):    T x H = 8 x 2;
    }
}

fn main() {}
