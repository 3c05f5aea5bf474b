//! Gemma-4 (text, MoE) on generated kernels, and the `moek` command.
//!
//! - [`gemma4`]: the family: config, weights (named after checkpoint keys), layer, model, tiny.
//! - [`checkpoint`]: safetensors over memory maps, typed errors naming each tensor.
//! - [`forward`]: what every family's forward shares: errors, the KV cache, dispatch records.
//! - [`ops`]: the CPU-side pieces (norms, RoPE, attention, linear layers).
//! - [`quantized`]: weight matrices stored in quantized blocks, and the flag naming a format.
//! - [`open`]: a checkpoint of any family opened as a model that runs ([`open()`], [`Options`]).
//! - [`generate`]: prefill (one shot or chunked) and decoding, greedy or sampled.
//! - [`commands`]: one module per `moek` subcommand.

pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod forward;
pub mod gemma4;
pub mod generate;
pub mod limits;
pub mod open;
pub mod ops;
pub mod quantized;
pub mod qwen3;

pub use open::{Model, Options, open};
