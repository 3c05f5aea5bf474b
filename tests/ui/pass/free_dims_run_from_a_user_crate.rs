use moek_kernels::ir::{DType, Target};
use moek_kernels::kernel;

kernel! {
    /// A user's own spec, in their own crate: generated code names the runtimes by absolute path.
    pub my_down = down {
        dims:    T, R, E, H, F;
        dtypes:  f32, bf16;
        targets: cpu;
        select:  gather E by R;
        cores:   R = 2;
    }
}

fn main() {
    // The same harness the generated tests use: reference, poisoned output, fresh seeds.
    moek_kernels::testing::check_spec(&my_down::entry(), Target::Cpu, DType::F32);
    moek_kernels::testing::check_spec(&my_down::entry(), Target::Cpu, DType::Bf16);
}
