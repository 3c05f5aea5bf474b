//! Qwen3-MoE (`model_type` `qwen3_moe`; docs/qwen3.md): a sibling of [`crate::gemma4`] in the
//! same shape. Attention (GQA, per-head q/k RMSNorm, RoPE), norms and the router run on the
//! CPU; the experts, the dense MLP of `mlp_only_layers` and the LM head run as generated
//! kernels through dispatch, with SiLU.

pub mod config;
pub mod geometry;
pub mod model;
pub mod weights;
