//! What a kernel engineer's own crate looks like: a spec declared with `kernel!` at their model's
//! geometry (here the tiny Gemma-4 fixture's: H 64, F 32, 8 experts, top-2). The macro generates
//! its CPU variant, its equivalence tests (`cargo test -p moek-user-specs`) and `entries()`, which
//! a registry takes so the spec serves the model beside the built-ins.

use moek_kernels::kernel;

kernel! {
    /// The tiny fixture's expert FFN: H in two 32-term blocks, two route owners.
    pub tiny_expert_ffn = expert_ffn {
        dims:    T, R = 2, E = 8, H = 64, F = 32;
        dtypes:  bf16, f32;
        targets: cpu;
        select:  gather E by R;
        reduce:  H = 32 x 2;
        cores:   R = 2;
    }
}
