//! A built-in tiny Gemma-4 MoE (deterministic weights made in code): both attention kinds, a
//! window shorter than the test sequences, non-trivial norms, router scales and layer scalars.
//! `moek check` runs it through every backend; tests use it without a checkpoint.

use crate::checkpoint::LoadError;
use crate::gemma4::config::{Attention, Config, Layer, Moe, Rope};
use crate::gemma4::weights::{Source, Weights, build};
use crate::quantized::{Quantize, Stored, for_rows};
use moek_kernels::Element;
use moek_kernels::ir::BlockFormat;
use moek_kernels::testing::{uniform, uniform_blocks};
use std::borrow::Cow;

pub fn config() -> Config {
    let sliding = Layer {
        attention: Attention::Sliding,
        head_dim: 16,
        num_key_value_heads: 2,
        attention_k_eq_v: false,
        rope: Rope {
            theta: 1e4,
            pairs: 8,
            factor: 1.0,
        },
    };
    let full = Layer {
        attention: Attention::Full,
        head_dim: 32,
        num_key_value_heads: 1,
        attention_k_eq_v: true,
        rope: Rope {
            theta: 1e6,
            pairs: 4,
            factor: 1.0,
        },
    };
    Config {
        vocab_size: 96,
        hidden_size: 64,
        intermediate_size: 48,
        num_attention_heads: 4,
        rms_norm_eps: 1e-6,
        sliding_window: 4,
        final_logit_softcapping: Some(30.0),
        max_position_embeddings: 1024,
        layers: vec![sliding.clone(), full, sliding],
        moe: Some(Moe {
            num_experts: 8,
            top_k_experts: 2,
            moe_intermediate_size: 32,
        }),
        eos_token_id: vec![1],
    }
}

/// Weights for any `cfg` in `W`, drawn from fixed seeds (the tiny model's, and the real-geometry
/// layers `moek bench --geometry 26b-a4b` builds in memory).
pub fn weights<W: Element>(cfg: &Config) -> Weights<'static, W> {
    build(&mut Draw::default(), cfg, |_| {}).expect("drawing weights cannot fail")
}

/// The tiny model's weights as a [`Source`]: matrices uniform in +-1/sqrt(fan-in) (the
/// embedding narrower), norms and scales 1 +- 0.3, layer `i`'s scalar 0.6 + 0.1 i; each kind
/// from its own run of seeds, in the order [`build`] asks. With `quantize`, the matrices it
/// covers are drawn straight into blocks: the blocks of the values drawn without it.
#[derive(Debug, Default)]
pub struct Draw {
    matrices: u64,
    vectors: u64,
    scalars: usize,
    quantize: Option<Quantize>,
}

impl Draw {
    /// The tiny model's draw with the matrices `quantize` covers in its blocks.
    pub fn quantized(quantize: Option<Quantize>) -> Draw {
        Draw {
            quantize,
            ..Draw::default()
        }
    }

    /// The next matrix's (values, seed, scale).
    fn next_matrix(&mut self, names: &[String], shape: &[usize]) -> (usize, u64, f32) {
        self.matrices += 1;
        // Narrow enough that greedy tokens vary (a wide tied embedding makes one token win).
        let fan_in = match names[0].ends_with("embed_tokens.weight") {
            true => 44,
            false => shape[shape.len() - 1],
        };
        (
            shape.iter().product(),
            1000 + self.matrices,
            1.0 / (fan_in as f32).sqrt(),
        )
    }

    /// The next matrix, in `quant`'s blocks if set.
    fn stored<W: Element>(
        &mut self,
        names: &[String],
        shape: &[usize],
        quant: Option<BlockFormat>,
    ) -> Stored<'static, W> {
        let (n, seed, scale) = self.next_matrix(names, shape);
        match quant {
            None => Stored::Plain(Cow::Owned(uniform(n, seed, scale))),
            Some(BlockFormat::Q8_0) => {
                Stored::Q8_0(Cow::Owned(uniform_blocks::<W, _>(n, seed, scale)))
            }
            Some(BlockFormat::Q4_0) => {
                Stored::Q4_0(Cow::Owned(uniform_blocks::<W, _>(n, seed, scale)))
            }
            Some(BlockFormat::Mxfp4) => {
                Stored::Mxfp4(Cow::Owned(uniform_blocks::<W, _>(n, seed, scale)))
            }
        }
    }
}

impl<W: Element> Source<'static, W> for Draw {
    fn matrix(
        &mut self,
        names: &[String],
        shape: &[usize],
    ) -> Result<Cow<'static, [W]>, LoadError> {
        let (n, seed, scale) = self.next_matrix(names, shape);
        Ok(Cow::Owned(uniform(n, seed, scale)))
    }

    fn bank(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'static, W>, LoadError> {
        let (banks, _) = Quantize::formats(self.quantize);
        Ok(self.stored(names, shape, banks))
    }

    fn linear(
        &mut self,
        names: &[String],
        shape: &[usize],
    ) -> Result<Stored<'static, W>, LoadError> {
        let linears = for_rows(Quantize::formats(self.quantize).1, shape);
        Ok(self.stored(names, shape, linears))
    }

    fn vector(&mut self, names: &[String], shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        if names[0].ends_with("layer_scalar") {
            self.scalars += 1;
            return Ok(vec![0.6 + 0.1 * (self.scalars - 1) as f32]);
        }
        self.vectors += 1;
        let n = shape.iter().product();
        Ok(uniform::<f32>(n, 5000 + self.vectors, 0.3)
            .into_iter()
            .map(|x| 1.0 + x)
            .collect())
    }

    fn has(&self, _: &[String]) -> bool {
        false
    }
}

/// The 26B-A4B geometry with `layers` layers alternating sliding and full (sliding first).
pub fn gemma4_26b(layers: usize) -> Config {
    let sliding = Layer {
        attention: Attention::Sliding,
        head_dim: 256,
        num_key_value_heads: 8,
        attention_k_eq_v: false,
        rope: Rope {
            theta: 1e4,
            pairs: 128,
            factor: 1.0,
        },
    };
    let full = Layer {
        attention: Attention::Full,
        head_dim: 512,
        num_key_value_heads: 2,
        attention_k_eq_v: true,
        rope: Rope {
            theta: 1e6,
            pairs: 64,
            factor: 1.0,
        },
    };
    Config {
        vocab_size: 262_144,
        hidden_size: 2816,
        intermediate_size: 2112,
        num_attention_heads: 16,
        rms_norm_eps: 1e-6,
        sliding_window: 1024,
        final_logit_softcapping: Some(30.0),
        max_position_embeddings: 262_144,
        layers: (0..layers)
            .map(|i| {
                if i % 2 == 0 {
                    sliding.clone()
                } else {
                    full.clone()
                }
            })
            .collect(),
        moe: Some(Moe {
            num_experts: 128,
            top_k_experts: 8,
            moe_intermediate_size: 704,
        }),
        eos_token_id: vec![1],
    }
}
