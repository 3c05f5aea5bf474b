//! The conformance suite on the CPU: every built-in spec that targets it, in every dtype, against
//! the f64 reference (`moek_kernels::testing::conformance`). Split in three, bf16 and weights in
//! blocks (the dtypes whose products depend on the bf16 GEMM tile, each tile tested forced: a
//! GEMM over blocks runs on the `vdpbf16ps` tile where that tile runs) and the rest, which run
//! side by side.

use moek_kernels::ir::{DType, Target};
use moek_kernels::testing::conformance_of;

#[test]
fn every_builtin_spec_conforms_in_bf16() {
    conformance_of(Target::Cpu, |d| d == DType::Bf16);
}

#[test]
fn every_builtin_spec_conforms_in_blocks() {
    conformance_of(Target::Cpu, DType::is_quantized);
}

#[test]
fn every_builtin_spec_conforms_in_the_other_dtypes() {
    conformance_of(Target::Cpu, |d| d != DType::Bf16 && !d.is_quantized());
}
