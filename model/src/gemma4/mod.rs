//! Gemma-4 (text, MoE): a model family in its own module, so another family is a sibling.
//!
//! - [`config`]: `config.json` (both layouts), unimplemented features refused by name.
//! - [`weights`]: the model's tensors named after their checkpoint keys, and the one table of
//!   them that loading, the tiny model and saving all read.
//! - [`model`]: the forward pass; [`layer`]: one decoder layer.
//! - [`tiny`]: a built-in tiny model with deterministic weights, and the 26B-A4B geometry.

pub mod config;
pub mod layer;
pub mod model;
pub mod tiny;
pub mod weights;
