//! gpt-oss configuration from a Hugging Face `config.json`, in both spellings found in the wild:
//! the hub's (`rope_scaling` beside a top-level `rope_theta`) and what transformers 5 writes
//! (`rope_parameters` holding the theta). Fields carry config.json's key names.

pub use crate::config::ConfigError;
use crate::config::{Reader, eos_tokens, expect_model_type, invalid, positive};
use serde_json::Value;
use std::path::Path;

/// Which keys a layer attends to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerType {
    /// The `sliding_window` most recent positions, itself included.
    Sliding,
    /// Every earlier position.
    Full,
}

/// YaRN's rotary frequencies (transformers' `_compute_yarn_parameters`): each pair's frequency
/// blended between the plain one and the one divided by `factor`, by a ramp over the pairs from
/// `beta_fast` to `beta_slow` rotations within the original context; cosines and sines scaled
/// by `attention_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub rope_theta: f64,
    pub factor: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub original_max_position_embeddings: usize,
    /// Round the ramp's ends outward to whole pairs (transformers' default when absent).
    pub truncate: bool,
    /// `0.1 ln(factor) + 1` unless config.json sets it.
    pub attention_factor: f64,
}

impl Yarn {
    /// The inverse frequency of each of the `d / 2` pairs of a head of `d`.
    pub fn inv_freq(&self, d: usize) -> Vec<f32> {
        let (base, dim) = (self.rope_theta, d as f64);
        let orig = self.original_max_position_embeddings as f64;
        let correction = |rotations: f64| {
            dim * (orig / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        let (mut low, mut high) = (correction(self.beta_fast), correction(self.beta_slow));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, high) = (low.max(0.0), high.min(dim - 1.0));
        let high = if low == high { high + 0.001 } else { high };
        (0..d / 2)
            .map(|i| {
                let extrapolation = 1.0 / base.powf(2.0 * i as f64 / dim);
                let interpolation = extrapolation / self.factor;
                let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                (interpolation * ramp + extrapolation * (1.0 - ramp)) as f32
            })
            .collect()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    /// `num_local_experts` (`num_experts` on some configs).
    pub num_local_experts: usize,
    pub num_experts_per_tok: usize,
    /// Each expert's width (`intermediate_size`).
    pub intermediate_size: usize,
    /// `swiglu_limit`: the gate is clamped above, the up projection both ways.
    pub swiglu_limit: f32,
    /// `swiglu_alpha`: the gate's sigmoid slope.
    pub swiglu_alpha: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope: Yarn,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
    pub layers: Vec<LayerType>,
    pub moe: Moe,
    pub eos_token_id: Vec<u32>,
}

impl Config {
    /// Positions a query of layer `i` sees, its own included: the sliding window, or `None`
    /// (all).
    pub fn window(&self, i: usize) -> Option<usize> {
        (self.layers[i] == LayerType::Sliding).then_some(self.sliding_window)
    }

    /// The expert FFN every layer dispatches for `t` tokens.
    pub fn moe_shape(&self, t: usize) -> moek_kernels::Shape {
        let m = self.moe;
        moek_kernels::Shape {
            t,
            r: m.num_experts_per_tok,
            e: m.num_local_experts,
            h: self.hidden_size,
            f: m.intermediate_size,
            v: 0,
        }
    }

    /// The experts' activation.
    pub fn activation(&self) -> moek_kernels::ir::Activation {
        moek_kernels::ir::Activation::SwigluClamped {
            limit: self.moe.swiglu_limit,
            alpha: self.moe.swiglu_alpha,
        }
    }

    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Config, ConfigError> {
        Config::from_json(&crate::config::read(dir)?)
    }

    pub fn from_json(v: &Value) -> Result<Config, ConfigError> {
        expect_model_type(v, "gpt_oss")?;
        let r = Reader(v);
        refuse(&r)?;
        let hidden = r.usize("hidden_size")?;
        let heads = r.usize("num_attention_heads")?;
        let n = r.usize("num_hidden_layers")?;
        let experts = match r.opt_usize("num_local_experts")? {
            Some(e) => e,
            None => r.usize("num_experts")?,
        };
        let top_k = match r.opt_usize("num_experts_per_tok")? {
            Some(k) => k,
            None => r.usize("experts_per_token")?,
        };
        let cfg = Config {
            vocab_size: r.usize("vocab_size")?,
            hidden_size: hidden,
            num_attention_heads: heads,
            num_key_value_heads: r.usize_or("num_key_value_heads", heads)?,
            head_dim: r.usize_or("head_dim", hidden / heads.max(1))?,
            rms_norm_eps: r.f64_or("rms_norm_eps", 1e-5)? as f32,
            rope: yarn(v)?,
            sliding_window: r.usize_or("sliding_window", 128)?,
            max_position_embeddings: r.usize_or("max_position_embeddings", 131_072)?,
            layers: layer_types(&r, n)?,
            moe: Moe {
                num_local_experts: experts,
                num_experts_per_tok: top_k,
                intermediate_size: r.usize("intermediate_size")?,
                swiglu_limit: r.f64_or("swiglu_limit", 7.0)? as f32,
                swiglu_alpha: r.f64_or("swiglu_alpha", 1.702)? as f32,
            },
            eos_token_id: v
                .get("eos_token_id")
                .and_then(eos_tokens)
                .unwrap_or_default(),
        };
        cfg.sane()?;
        Ok(cfg)
    }

    /// Sizes that must be positive are; heads group evenly; top-k picks among the experts; the
    /// SwiGLU's limit and slope are finite and positive.
    fn sane(&self) -> Result<(), ConfigError> {
        positive(&[
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("num_hidden_layers", self.layers.len()),
            ("max_position_embeddings", self.max_position_embeddings),
            ("sliding_window", self.sliding_window),
            ("intermediate_size", self.moe.intermediate_size),
            ("num_local_experts", self.moe.num_local_experts),
        ])?;
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
        if m.num_experts_per_tok == 0 || m.num_experts_per_tok > m.num_local_experts {
            return Err(invalid(
                "num_experts_per_tok",
                &format!("1 to num_local_experts ({})", m.num_local_experts),
                &m.num_experts_per_tok.into(),
            ));
        }
        for (key, x) in [
            ("swiglu_limit", m.swiglu_limit),
            ("swiglu_alpha", m.swiglu_alpha),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return Err(invalid(key, "a finite number above 0", &x.into()));
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(invalid(
                "rms_norm_eps",
                "a finite number >= 0",
                &self.rms_norm_eps.into(),
            ));
        }
        let y = self.rope;
        if !(y.rope_theta.is_finite() && y.rope_theta > 1.0 && y.factor >= 1.0) {
            return Err(invalid(
                "rope_parameters",
                "rope_theta above 1 and factor at least 1",
                &format!("rope_theta {}, factor {}", y.rope_theta, y.factor).into(),
            ));
        }
        Ok(())
    }
}

/// `layer_types` (each `sliding_attention` or `full_attention`), or transformers' default:
/// sliding first, then alternating.
fn layer_types(r: &Reader, n: usize) -> Result<Vec<LayerType>, ConfigError> {
    match r.0.get("layer_types") {
        None | Some(Value::Null) => Ok((0..n)
            .map(|i| match i % 2 {
                0 => LayerType::Sliding,
                _ => LayerType::Full,
            })
            .collect()),
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(LayerType::Sliding),
                Some("full_attention") => Ok(LayerType::Full),
                _ => Err(invalid(
                    "layer_types",
                    "`sliding_attention` or `full_attention`",
                    t,
                )),
            })
            .collect(),
        Some(other) => Err(invalid(
            "layer_types",
            &format!("a list of {n} layer types (num_hidden_layers)"),
            other,
        )),
    }
}

/// The YaRN parameters: `rope_parameters` (transformers 5, the theta inside) or `rope_scaling`
/// beside a top-level `rope_theta` (the hub). A RoPE type other than YaRN is refused by name.
fn yarn(v: &Value) -> Result<Yarn, ConfigError> {
    let (p, theta_from) = match (v.get("rope_parameters"), v.get("rope_scaling")) {
        (Some(p @ Value::Object(_)), _) => (p, p),
        (_, Some(p @ Value::Object(_))) => (p, v),
        _ => {
            return Err(ConfigError::Missing {
                key: "rope_parameters".into(),
            });
        }
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str);
    if kind != Some("yarn") {
        return Err(ConfigError::Unsupported {
            feature: "a RoPE other than YaRN for gpt-oss",
            key: "rope_parameters.rope_type",
            value: kind.map_or("absent".into(), |k| format!("`{k}`")),
        });
    }
    let r = Reader(p);
    let factor = r.f64_or("factor", 1.0)?;
    Ok(Yarn {
        rope_theta: Reader(theta_from).f64_or("rope_theta", 150_000.0)?,
        factor,
        beta_fast: r.f64_or("beta_fast", 32.0)?,
        beta_slow: r.f64_or("beta_slow", 1.0)?,
        original_max_position_embeddings: r.usize("original_max_position_embeddings")?,
        truncate: r.bool_or("truncate", true)?,
        attention_factor: match r.opt_f64("attention_factor")? {
            Some(a) => a,
            None if factor > 1.0 => 0.1 * factor.ln() + 1.0,
            None => 1.0,
        },
    })
}

/// Refuses the configuration features this crate does not implement, naming them.
fn refuse(r: &Reader) -> Result<(), ConfigError> {
    if r.bool_or("tie_word_embeddings", false)? {
        return Err(ConfigError::Unsupported {
            feature: "a gpt-oss LM head tied to the embedding",
            key: "tie_word_embeddings",
            value: "true".into(),
        });
    }
    if !r.bool_or("attention_bias", true)? {
        return Err(ConfigError::Unsupported {
            feature: "gpt-oss attention without biases",
            key: "attention_bias",
            value: "false".into(),
        });
    }
    match r.0.get("quantization_config") {
        None | Some(Value::Null) => Ok(()),
        Some(q) => match q.get("quant_method").and_then(Value::as_str) {
            Some("mxfp4") => Ok(()),
            other => Err(ConfigError::Unsupported {
                feature: "a quantization other than MXFP4 experts",
                key: "quantization_config.quant_method",
                value: other.map_or("absent".into(), |m| format!("`{m}`")),
            }),
        },
    }
}
