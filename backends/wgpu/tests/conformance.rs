//! The conformance suite on wgpu (on whatever adapter this machine has: lavapipe without a GPU):
//! every built-in spec that targets it, in every dtype, against the f64 reference
//! (`moek_kernels::testing::conformance`). Split in two, f16 (read natively or packed in pairs,
//! `MOEK_WGPU_F16`: CI runs it under both) and the rest.

use moek_kernels::ir::{DType, Target};
use moek_kernels::testing::conformance_of;

#[test]
fn every_builtin_spec_conforms_in_f16() {
    conformance_of(Target::Wgpu, |d| d == DType::F16);
}

#[test]
fn every_builtin_spec_conforms_in_the_other_dtypes() {
    conformance_of(Target::Wgpu, |d| d != DType::F16);
}
