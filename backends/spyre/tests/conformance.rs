//! The conformance suite on Spyre (the simulator and its cost model): every built-in spec that
//! targets it, in every dtype, against the f64 reference (`moek_kernels::testing::conformance`).

#[test]
fn every_builtin_spec_conforms() {
    moek_kernels::testing::conformance(moek_kernels::ir::Target::Spyre);
}
