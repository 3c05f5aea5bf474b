//! Qwen3-MoE configuration from a Hugging Face `config.json`, in both spellings found in the
//! wild: the hub's (`num_experts`, a top-level `rope_theta`) and what transformers 5 writes
//! (`num_local_experts`, `rope_parameters`). Features this crate does not implement are refused
//! by name.

pub use crate::config::ConfigError;
use crate::config::{Reader, eos_tokens, expect_model_type, invalid, positive};
use crate::ops::Rope;
use serde_json::Value;
use std::path::Path;

/// Whether a layer's feed-forward is the routed experts or a dense MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mlp {
    Sparse,
    Dense,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    /// Each expert's width.
    pub moe_intermediate_size: usize,
    /// Renormalise the top-k probabilities to sum to 1 (`norm_topk_prob`).
    pub norm_topk_prob: bool,
}

/// Fields carry config.json's key names (candle's style), so a field is found by the key it
/// reads; `layers` and `moe` gather the per-layer and expert keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// The dense MLP's width (`intermediate_size`), for `Mlp::Dense` layers.
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: Rope,
    /// Positions a sequence may reach.
    pub max_position_embeddings: usize,
    pub layers: Vec<Mlp>,
    pub moe: Moe,
    /// The LM head is the embedding.
    pub tie_word_embeddings: bool,
    pub eos_token_id: Vec<u32>,
}

impl Config {
    /// The expert FFN the sparse layers dispatch for `t` tokens.
    pub fn moe_shape(&self, t: usize) -> moek_kernels::Shape {
        let m = self.moe;
        moek_kernels::Shape {
            t,
            r: m.num_experts_per_tok,
            e: m.num_experts,
            h: self.hidden_size,
            f: m.moe_intermediate_size,
            v: 0,
        }
    }

    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Config, ConfigError> {
        Config::from_json(&crate::config::read(dir)?)
    }

    pub fn from_json(v: &Value) -> Result<Config, ConfigError> {
        expect_model_type(v, "qwen3_moe")?;
        let r = Reader(v);
        refuse(&r)?;
        let hidden = r.usize("hidden_size")?;
        let heads = r.usize("num_attention_heads")?;
        let kv_heads = r.usize_or("num_key_value_heads", heads)?;
        let head_dim = r.usize_or("head_dim", hidden / heads.max(1))?;
        let n = r.usize("num_hidden_layers")?;
        let experts = match r.opt_usize("num_experts")? {
            Some(e) => e,
            None => r.usize("num_local_experts")?,
        };
        let step = r.usize_or("decoder_sparse_step", 1)?;
        let dense = dense_layers(&r, n)?;
        let layers = (0..n)
            .map(|i| {
                let sparse = !dense.contains(&i) && experts > 0 && step > 0 && (i + 1) % step == 0;
                if sparse { Mlp::Sparse } else { Mlp::Dense }
            })
            .collect();
        let eos = v
            .get("eos_token_id")
            .and_then(eos_tokens)
            .unwrap_or_default();
        let cfg = Config {
            vocab_size: r.usize("vocab_size")?,
            hidden_size: hidden,
            intermediate_size: r.usize("intermediate_size")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rms_norm_eps: r.f64_or("rms_norm_eps", 1e-6)? as f32,
            rope: Rope {
                theta: rope_theta(v)?,
                pairs: head_dim / 2,
                factor: 1.0,
            },
            max_position_embeddings: r.usize_or("max_position_embeddings", 40_960)?,
            layers,
            moe: Moe {
                num_experts: experts,
                num_experts_per_tok: r.usize("num_experts_per_tok")?,
                moe_intermediate_size: r.usize("moe_intermediate_size")?,
                norm_topk_prob: r.bool_or("norm_topk_prob", false)?,
            },
            tie_word_embeddings: r.bool_or("tie_word_embeddings", false)?,
            eos_token_id: eos,
        };
        cfg.sane()?;
        Ok(cfg)
    }

    /// Sizes that must be positive are; heads group evenly; top-k picks among the experts.
    fn sane(&self) -> Result<(), ConfigError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_hidden_layers", self.layers.len()),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        positive(&sizes)?;
        if self.num_key_value_heads == 0
            || !self
                .num_attention_heads
                .is_multiple_of(self.num_key_value_heads)
            || !self.head_dim.is_multiple_of(2)
        {
            return Err(ConfigError::Invalid {
                key: "attention".into(),
                expected: "kv heads dividing num_attention_heads and an even head_dim".into(),
                found: format!(
                    "{} heads, {} kv heads, head_dim {}",
                    self.num_attention_heads, self.num_key_value_heads, self.head_dim
                ),
            });
        }
        let m = self.moe;
        let sparse = self.layers.contains(&Mlp::Sparse);
        if sparse
            && (m.num_experts_per_tok == 0
                || m.num_experts_per_tok > m.num_experts
                || m.moe_intermediate_size == 0)
        {
            return Err(ConfigError::Invalid {
                key: "num_experts_per_tok / moe_intermediate_size".into(),
                expected: "top-k from 1 to the experts, a positive expert width".into(),
                found: format!(
                    "{} experts, top-k {}, width {}",
                    m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size
                ),
            });
        }
        if self.layers.contains(&Mlp::Dense) && self.intermediate_size == 0 {
            return Err(invalid("intermediate_size", "at least 1", &0.into()));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                "a finite number >= 0",
                &self.rms_norm_eps.into(),
            ));
        }
        if !(self.rope.theta.is_finite() && self.rope.theta > 1.0) {
            return Err(invalid(
                "rope_theta",
                "a finite number above 1",
                &self.rope.theta.into(),
            ));
        }
        Ok(())
    }
}

/// `rope_parameters.rope_theta` (transformers 5) or `rope_theta` (the hub); only the default
/// RoPE is implemented.
fn rope_theta(v: &Value) -> Result<f64, ConfigError> {
    match v.get("rope_parameters") {
        Some(p @ Value::Object(_)) => {
            let kind = p
                .get("rope_type")
                .and_then(Value::as_str)
                .unwrap_or("default");
            if kind != "default" {
                return Err(ConfigError::Unsupported {
                    feature: "scaled RoPE",
                    key: "rope_parameters.rope_type",
                    value: format!("`{kind}`"),
                });
            }
            Reader(p).f64_or("rope_theta", 10_000.0)
        }
        _ => {
            if let Some(s) = v.get("rope_scaling").filter(|s| !s.is_null()) {
                return Err(ConfigError::Unsupported {
                    feature: "scaled RoPE",
                    key: "rope_scaling",
                    value: s.to_string(),
                });
            }
            Reader(v).f64_or("rope_theta", 10_000.0)
        }
    }
}

/// `mlp_only_layers`: indices of dense layers.
fn dense_layers(r: &Reader, n: usize) -> Result<Vec<usize>, ConfigError> {
    match r.0.get("mlp_only_layers") {
        None | Some(Value::Null) => Ok(vec![]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .map(|i| i as usize)
                    .filter(|&i| i < n)
                    .ok_or_else(|| {
                        invalid("mlp_only_layers", &format!("layer indices below {n}"), x)
                    })
            })
            .collect(),
        Some(other) => Err(invalid("mlp_only_layers", "a list of layer indices", other)),
    }
}

/// Refuses the configuration features this crate does not implement, naming them.
fn refuse(r: &Reader) -> Result<(), ConfigError> {
    if r.bool_or("attention_bias", false)? {
        return Err(ConfigError::Unsupported {
            feature: "attention biases",
            key: "attention_bias",
            value: "true".into(),
        });
    }
    if r.bool_or("use_sliding_window", false)? {
        return Err(ConfigError::Unsupported {
            feature: "sliding-window attention",
            key: "use_sliding_window",
            value: "true".into(),
        });
    }
    match r.0.get("hidden_act").and_then(Value::as_str) {
        None | Some("silu") => Ok(()),
        Some(other) => Err(ConfigError::Unsupported {
            feature: "an expert activation other than SiLU",
            key: "hidden_act",
            value: format!("`{other}`"),
        }),
    }
}
