//! Gemma-4 text configuration from a Hugging Face `config.json` (`model_type` `gemma4_text`, or
//! `gemma4` with its `text_config`). Features this crate does not implement are refused by name.

pub use crate::config::ConfigError;
use crate::config::{Reader, eos_tokens, invalid, positive};
use serde_json::Value;
use std::path::Path;

/// Attention kind of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attention {
    Sliding,
    Full,
}

pub use crate::ops::Rope;

#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub attention: Attention,
    pub head_dim: usize,
    pub num_key_value_heads: usize,
    /// V is the raw K projection (no `v_proj`): full layers with `attention_k_eq_v`.
    pub attention_k_eq_v: bool,
    pub rope: Rope,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moe {
    pub num_experts: usize,
    pub top_k_experts: usize,
    pub moe_intermediate_size: usize,
}

impl Moe {
    /// The expert FFN these experts dispatch for `t` tokens of width `hidden_size`.
    pub fn shape(self, t: usize, hidden_size: usize) -> moek_kernels::Shape {
        moek_kernels::Shape {
            t,
            r: self.top_k_experts,
            e: self.num_experts,
            h: hidden_size,
            f: self.moe_intermediate_size,
            v: 0,
        }
    }
}

/// Fields carry config.json's key names (candle's style), so a field is found by the key it
/// reads; `layers` and `moe` gather the per-layer and expert keys.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Dense MLP width.
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub rms_norm_eps: f32,
    pub sliding_window: usize,
    pub final_logit_softcapping: Option<f32>,
    /// Positions a sequence may reach.
    pub max_position_embeddings: usize,
    pub layers: Vec<Layer>,
    pub moe: Option<Moe>,
    /// Stop tokens (one or several).
    pub eos_token_id: Vec<u32>,
}

impl Config {
    /// Positions a query of `layer` sees, its own included: the sliding window, or `None` (all).
    pub fn window(&self, layer: &Layer) -> Option<usize> {
        (layer.attention == Attention::Sliding).then_some(self.sliding_window)
    }

    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Config, ConfigError> {
        Config::from_json(&crate::config::read(dir)?)
    }

    pub fn from_json(v: &Value) -> Result<Config, ConfigError> {
        let t = match v.get("model_type").and_then(Value::as_str) {
            Some("gemma4_text") => v,
            Some("gemma4") => v.get("text_config").ok_or_else(|| ConfigError::Missing {
                key: "text_config".into(),
            })?,
            other => {
                return Err(ConfigError::Invalid {
                    key: "model_type".into(),
                    expected: "`gemma4_text` or `gemma4`".into(),
                    found: other.map_or("absent".into(), |s| format!("`{s}`")),
                });
            }
        };
        let r = Reader(t);
        refuse(&r)?;
        let n = r.usize("num_hidden_layers")?;
        let head_dim = r.usize_or("head_dim", 256)?;
        let kv_heads = r.usize_or("num_key_value_heads", 4)?;
        let k_eq_v = r.bool_or("attention_k_eq_v", false)?;
        let global_head_dim = r.usize_or("global_head_dim", 512)?;
        let global_kv = r.opt_usize("num_global_key_value_heads")?;
        let kinds = layer_types(&r, n)?;
        let per_layer = t.get("per_layer_config");
        let layers = kinds
            .into_iter()
            .enumerate()
            .map(|(i, attention)| {
                let full = attention == Attention::Full;
                // Hub shape: global_* for full layers; saved shape: per_layer_config overrides.
                let (mut hd, mut kv) = if full && per_layer.is_none() {
                    let kv = if k_eq_v {
                        global_kv.unwrap_or(kv_heads)
                    } else {
                        kv_heads
                    };
                    (global_head_dim, kv)
                } else {
                    (head_dim, kv_heads)
                };
                if let Some(o) = per_layer.and_then(|p| layer_override(p, i, n)) {
                    let o = Reader(o);
                    hd = o.usize_or("head_dim", hd)?;
                    kv = o.usize_or("num_key_value_heads", kv)?;
                }
                Ok(Layer {
                    attention,
                    head_dim: hd,
                    num_key_value_heads: kv,
                    attention_k_eq_v: full && k_eq_v,
                    rope: rope(t, attention, hd)?,
                })
            })
            .collect::<Result<Vec<_>, ConfigError>>()?;
        let heads = r.usize("num_attention_heads")?;
        for (i, l) in layers.iter().enumerate() {
            if l.num_key_value_heads == 0
                || heads % l.num_key_value_heads != 0
                || l.head_dim % 2 != 0
            {
                return Err(ConfigError::Invalid {
                    key: format!("layer {i} attention"),
                    expected: "kv heads dividing num_attention_heads and an even head_dim".into(),
                    found: format!(
                        "{} heads, {} kv heads, head_dim {}",
                        heads, l.num_key_value_heads, l.head_dim
                    ),
                });
            }
        }
        let moe = if r.bool_or("enable_moe_block", false)? {
            Some(Moe {
                num_experts: r.usize("num_experts")?,
                top_k_experts: r.usize("top_k_experts")?,
                moe_intermediate_size: r.usize("moe_intermediate_size")?,
            })
        } else {
            None
        };
        let eos = t.get("eos_token_id").or_else(|| v.get("eos_token_id"));
        let eos = eos.and_then(eos_tokens).unwrap_or_default();
        let cfg = Config {
            vocab_size: r.usize("vocab_size")?,
            hidden_size: r.usize("hidden_size")?,
            intermediate_size: r.usize("intermediate_size")?,
            num_attention_heads: heads,
            rms_norm_eps: r.f64_or("rms_norm_eps", 1e-6)? as f32,
            sliding_window: r.usize_or("sliding_window", 512)?,
            final_logit_softcapping: r.opt_f64("final_logit_softcapping")?.map(|x| x as f32),
            max_position_embeddings: r.usize_or("max_position_embeddings", 131_072)?,
            layers,
            moe,
            eos_token_id: eos,
        };
        cfg.sane(&r)?;
        Ok(cfg)
    }
}

impl Config {
    /// Sizes that must be positive are, top-k picks among the experts, and every number the
    /// forward divides by or scales with is finite and in range.
    fn sane(&self, r: &Reader) -> Result<(), ConfigError> {
        let sizes = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("sliding_window", self.sliding_window),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_hidden_layers", self.layers.len()),
        ];
        positive(&sizes)?;
        for (i, l) in self.layers.iter().enumerate() {
            if l.head_dim == 0 {
                return Err(invalid(
                    &format!("layer {i} head_dim"),
                    "at least 2",
                    &0.into(),
                ));
            }
            if !(l.rope.theta.is_finite() && l.rope.theta > 1.0 && l.rope.factor.is_finite()) {
                return Err(invalid(
                    &format!("layer {i} rope_theta / factor"),
                    "a finite theta above 1 and a finite factor",
                    &serde_json::json!([l.rope.theta, l.rope.factor]),
                ));
            }
        }
        if let Some(m) = self.moe
            && (m.num_experts == 0
                || m.top_k_experts == 0
                || m.top_k_experts > m.num_experts
                || m.moe_intermediate_size == 0)
        {
            return Err(ConfigError::Invalid {
                key: "num_experts / top_k_experts / moe_intermediate_size".into(),
                expected: "at least one expert, top-k from 1 to the experts, a positive width"
                    .into(),
                found: format!(
                    "{} experts, top-k {}, width {}",
                    m.num_experts, m.top_k_experts, m.moe_intermediate_size
                ),
            });
        }
        let eps = r.f64_or("rms_norm_eps", 1e-6)?;
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(invalid("rms_norm_eps", "a finite number >= 0", &eps.into()));
        }
        if let Some(cap) = self.final_logit_softcapping
            && !(cap.is_finite() && cap > 0.0)
        {
            return Err(invalid(
                "final_logit_softcapping",
                "a finite number > 0",
                &cap.into(),
            ));
        }
        Ok(())
    }
}

/// Refuses the configuration features this crate does not implement, naming them.
fn refuse(r: &Reader) -> Result<(), ConfigError> {
    // Absent means the Hugging Face default, 256: per-layer inputs on.
    let ple = r.opt_usize("hidden_size_per_layer_input")?;
    let ple = if r.0.get("hidden_size_per_layer_input").is_some() {
        ple.unwrap_or(0)
    } else {
        256
    };
    if ple > 0 {
        return Err(ConfigError::Unsupported {
            feature: "per-layer input embeddings",
            key: "hidden_size_per_layer_input",
            value: ple.to_string(),
        });
    }
    let shared = r.usize_or("num_kv_shared_layers", 0)?;
    if shared > 0 {
        return Err(ConfigError::Unsupported {
            feature: "KV-shared layers",
            key: "num_kv_shared_layers",
            value: shared.to_string(),
        });
    }
    if r.bool_or("use_double_wide_mlp", false)? {
        return Err(ConfigError::Unsupported {
            feature: "the double-wide MLP",
            key: "use_double_wide_mlp",
            value: "true".into(),
        });
    }
    match r.0.get("use_bidirectional_attention") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "vision" => {}
        Some(other) => {
            return Err(ConfigError::Unsupported {
                feature: "bidirectional attention",
                key: "use_bidirectional_attention",
                value: other.to_string(),
            });
        }
    }
    Ok(())
}

fn layer_types(r: &Reader, n: usize) -> Result<Vec<Attention>, ConfigError> {
    match r.0.get("layer_types") {
        None | Some(Value::Null) => Ok((0..n)
            .map(|i| {
                if (i + 1) % 6 == 0 || i + 1 == n {
                    Attention::Full
                } else {
                    Attention::Sliding
                }
            })
            .collect()),
        Some(Value::Array(a)) if a.len() == n => a
            .iter()
            .enumerate()
            .map(|(i, x)| match x.as_str() {
                Some("sliding_attention") => Ok(Attention::Sliding),
                Some("full_attention") => Ok(Attention::Full),
                _ => Err(ConfigError::Invalid {
                    key: format!("layer_types[{i}]"),
                    expected: "`sliding_attention` or `full_attention`".into(),
                    found: x.to_string(),
                }),
            })
            .collect(),
        Some(other) => Err(ConfigError::Invalid {
            key: "layer_types".into(),
            expected: format!("a list of {n} layer types"),
            found: other.to_string(),
        }),
    }
}

/// `per_layer_config["05"]` (keys zero-padded to the widest index), or unpadded.
fn layer_override(p: &Value, i: usize, n: usize) -> Option<&Value> {
    let width = (n.max(1) - 1).to_string().len();
    p.get(format!("{i:0width$}"))
        .or_else(|| p.get(i.to_string()))
}

fn rope(t: &Value, kind: Attention, head_dim: usize) -> Result<Rope, ConfigError> {
    let key = match kind {
        Attention::Sliding => "sliding_attention",
        Attention::Full => "full_attention",
    };
    let params = t.get("rope_parameters").and_then(|p| p.get(key));
    let (default_theta, default_type) = match kind {
        Attention::Sliding => (1e4, "default"),
        Attention::Full => (1e6, "proportional"),
    };
    let p = Reader(params.unwrap_or(&Value::Null));
    let theta = p.f64_or("rope_theta", default_theta)?;
    let kind = params
        .and_then(|p| p.get("rope_type"))
        .and_then(Value::as_str)
        .unwrap_or(default_type);
    let half = head_dim / 2;
    let pairs = match kind {
        "default" => half,
        "proportional" => {
            let f = p.f64_or("partial_rotary_factor", 1.0)?;
            ((f * head_dim as f64) as usize / 2).min(half)
        }
        other => {
            return Err(ConfigError::Invalid {
                key: format!("rope_parameters.{key}.rope_type"),
                expected: "`default` or `proportional`".into(),
                found: format!("`{other}`"),
            });
        }
    };
    Ok(Rope {
        theta,
        pairs,
        factor: p.f64_or("factor", 1.0)?,
    })
}
