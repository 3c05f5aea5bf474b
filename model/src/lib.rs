//! Gemma-4 (text, MoE) on generated kernels, and the `moek` command.
//!
//! - [`config`]: `config.json` (both layouts), unimplemented features refused by name.
//! - [`checkpoint`]: safetensors over memory maps, typed errors naming each tensor.
//! - [`weights`]: the model's tensors, borrowed from the checkpoint (experts exist once).
//! - [`forward`]: the forward pass; MoE, dense MLP and LM head through `moek_kernels` dispatch.
//! - [`ops`]: the CPU-side pieces (norms, RoPE, attention, linear layers).
//! - [`generate`]: prefill (one shot or chunked) and decoding, greedy or sampled.
//! - [`tiny`]: a built-in tiny model with deterministic weights.
//! - [`commands`]: one module per `moek` subcommand.

pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod forward;
pub mod generate;
pub mod ops;
pub mod tiny;
pub mod weights;
