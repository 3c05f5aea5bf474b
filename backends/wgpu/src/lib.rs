//! The wgpu runtime of generated WGSL programs (device plans, `moek_ir::plan`).
//!
//! - [`adapter`]: which adapter runs (WGPU_BACKEND, WGPU_ADAPTER_NAME, Vulkan with f16 first),
//!   the device with the adapter's real limits, the f16 switch.
//! - [`tensor`]: device tensors bound in chunks of whole rows under the binding limit.
//! - [`run`]: the pipeline cache and the execution of a program's steps.
//!
//! This crate knows no kernel: it binds the tensors a plan names and runs its steps.

pub mod adapter;
pub mod run;
pub mod tensor;

pub use adapter::{F16Mode, Gpu, GpuError};
pub use run::Program;
pub use tensor::GpuTensor;
