//! The conformance suite on wgpu (on whatever adapter this machine has: lavapipe without a GPU):
//! every built-in spec that targets it, in every dtype, against the f64 reference
//! (`moek_kernels::testing::conformance`).

#[test]
fn every_builtin_spec_conforms() {
    moek_kernels::testing::conformance(moek_kernels::ir::Target::Wgpu);
}
