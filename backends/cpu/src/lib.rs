//! CPU primitives that generated kernels compose: dot products, GEMM tiles, activations.
//!
//! A schedule (blocks, splits, groups) is data, [`moek_ir::cpu::Tables`]: the generic loop nests
//! in [`skeleton`] follow it, whether it was compiled into a spec's variant or built at run time
//! from the IR; the primitives below multiply contiguous runs of numbers fast. Every primitive has an AVX-512 path (BF16 dot
//! products, 16-bit conversion), an AVX2 path ([`avx2`]: FMA, F16C) and a portable path, chosen
//! at run time; `MOEK_CPU_ISA` forces one (see [`isa`]).

pub mod activation;
pub mod amx;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
pub mod axpy;
pub mod bandwidth;
pub mod dot;
pub mod element;
pub mod gemm;
#[cfg(target_arch = "x86_64")]
mod int_gemm;
pub mod isa;
pub mod memory;
pub mod peak;
pub mod pool;
pub mod quant;
pub mod schedule;
pub mod scratch;
pub mod skeleton;
#[cfg(target_arch = "x86_64")]
pub mod vnni;

pub use activation::{gelu_tanh, silu, softcap, softcap_slice, swiglu_clamped};
pub use axpy::axpy;
pub use dot::{dot, dot_f32_w, dot4};
pub use gemm::gemm_nt;
pub use isa::{Isa, isa};
pub use moek_ir::Element;
pub use pool::on_pool;
pub use quant::{QuantizedActivation, Weight};
pub use schedule::{
    Grid, SharedOut, clip, dense_routes, gather_rows_into, group_by_expert, matvec_row,
    matvec_segments, part, values,
};
pub use scratch::Scratch;
