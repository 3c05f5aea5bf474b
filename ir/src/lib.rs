//! What a validated kernel spec is, and what its emitters produce for the backends, as plain data:
//! the IR ([`kernel`], re-exported at the root), the op table of tensors ([`tensors`]), the f64
//! reference semantics of every op ([`reference`]), the tolerance table ([`tolerance`]), the
//! block-quantized weight formats ([`quant`]), the one trait of a stored element ([`element`]), the f32 elementwise functions every run time
//! shares ([`scalar`]), a schedule as the CPU skeletons read it ([`cpu`]), the
//! Spyre program format ([`spyre`]) and device plans ([`plan`]).
//!
//! This crate parses nothing (no syn): the proc-macro core (`moek-dsl`) builds these types from
//! spec tokens, and the backends and the kernel runtime read them without compiling a parser.

pub mod cpu;
pub mod element;
pub mod kernel;
pub mod plan;
pub mod quant;
pub mod reference;
pub mod scalar;
pub mod spyre;
pub mod tensors;
pub mod tolerance;

pub use element::{Element, Kind};
pub use kernel::*;
