//! The model families (Gemma-4, Qwen3-MoE, gpt-oss) on generated kernels: open a checkpoint,
//! run it.
//!
//! - [`gemma4`]: the family: config, weights (named after checkpoint keys), layer, model, tiny.
//!   [`qwen3`] and [`gpt_oss`] are its siblings.
//! - [`checkpoint`]: safetensors over memory maps, typed errors naming each tensor.
//! - [`forward`]: what every family's forward shares: errors, the KV cache, dispatch records.
//! - [`ops`]: the CPU-side pieces (norms, RoPE, attention, linear layers).
//! - [`quantized`]: weight matrices stored in quantized blocks, and the flag naming a format.
//! - [`open`]: a checkpoint of any family opened as a model that runs ([`open()`], [`Options`]).
//! - [`generate`]: prefill (one shot or chunked) and decoding, greedy or sampled.

pub mod checkpoint;
pub mod config;
pub mod forward;
pub mod gemma4;
pub mod generate;
pub mod gpt_oss;
pub mod limits;
pub mod open;
pub mod ops;
pub mod quantized;
pub mod qwen3;

pub use open::{Model, Options, open};
