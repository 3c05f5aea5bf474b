//! The `moek` command's crate. Today it holds the commands over the kernel specs
//! ([`commands`]); the Gemma-4 model (config, loading, attention, generation) lands here next.

pub mod commands;
