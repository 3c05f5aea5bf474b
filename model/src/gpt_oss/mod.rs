//! gpt-oss (`model_type` `gpt_oss`; docs/gpt-oss.md): a sibling of [`crate::qwen3`] in the same
//! shape. Attention (GQA with biases, a learned sink logit per head, YaRN RoPE, sliding and full
//! layers alternating), norms and the router run on the CPU; the experts (clamped SwiGLU with
//! biases, from MXFP4 blocks as the checkpoints ship them or from bf16/f32) and the LM head run
//! as generated kernels through dispatch.

pub mod config;
pub mod geometry;
pub mod model;
pub mod weights;
