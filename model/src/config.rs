//! Reading a Hugging Face `config.json`, for every family: its errors, typed reads that name the
//! key, and which family a config is (`model_type`).

use serde_json::Value;
use std::path::Path;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read `{path}`: {why}")]
    Read { path: String, why: String },
    #[error("config key `{key}` is missing")]
    Missing { key: String },
    #[error("config key `{key}` is {found}; expected {expected}")]
    Invalid {
        key: String,
        expected: String,
        found: String,
    },
    #[error("config asks for {feature} (`{key}` = {value}), which moek does not implement")]
    Unsupported {
        feature: &'static str,
        key: &'static str,
        value: String,
    },
}

/// The model families moek runs, by `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `gemma4_text`, or `gemma4` with a `text_config`.
    Gemma4,
    /// `qwen3_moe`.
    Qwen3Moe,
    GptOss,
}

impl Family {
    /// The family `config.json` names; an unknown `model_type` names the ones there are.
    pub fn of(v: &Value) -> Result<Family, ConfigError> {
        match v.get("model_type").and_then(Value::as_str) {
            Some("gemma4_text" | "gemma4") => Ok(Family::Gemma4),
            Some("qwen3_moe") => Ok(Family::Qwen3Moe),
            Some("gpt_oss") => Ok(Family::GptOss),
            other => Err(ConfigError::Invalid {
                key: "model_type".into(),
                expected: "a family moek runs: `gemma4_text` or `gemma4` (Gemma-4), `qwen3_moe` \
                           (Qwen3-MoE), `gpt_oss` (gpt-oss)"
                    .into(),
                found: other.map_or("absent".into(), |s| format!("`{s}`")),
            }),
        }
    }
}

/// Stop tokens from an `eos_token_id` value: one id or a list of them (`None` for anything
/// else).
pub fn eos_tokens(v: &Value) -> Option<Vec<u32>> {
    match v {
        Value::Array(a) => Some(
            a.iter()
                .filter_map(Value::as_u64)
                .map(|x| x as u32)
                .collect(),
        ),
        x => x.as_u64().map(|x| vec![x as u32]),
    }
}

/// Each `(key, size)` is at least 1.
/// `Ok` when `v`'s `model_type` is `name`; else the error naming what it is.
pub(crate) fn expect_model_type(v: &Value, name: &str) -> Result<(), ConfigError> {
    match v.get("model_type").and_then(Value::as_str) {
        Some(t) if t == name => Ok(()),
        other => Err(ConfigError::Invalid {
            key: "model_type".into(),
            expected: format!("`{name}`"),
            found: other.map_or("absent".into(), |s| format!("`{s}`")),
        }),
    }
}

pub(crate) fn positive(sizes: &[(&str, usize)]) -> Result<(), ConfigError> {
    match sizes.iter().find(|(_, n)| *n == 0) {
        Some(&(key, n)) => Err(invalid(key, "at least 1", &n.into())),
        None => Ok(()),
    }
}

/// `dir/config.json` as JSON.
pub fn read(dir: &Path) -> Result<Value, ConfigError> {
    let path = dir.join("config.json");
    let read = |why: String| ConfigError::Read {
        path: path.display().to_string(),
        why,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| read(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| read(e.to_string()))
}

/// The largest size or count a config may give (2^24: above every real model's vocabulary,
/// widths and layer counts, and small enough that products of a few never overflow).
pub const MAX_SIZE: usize = 1 << 24;

/// Typed reads of one JSON object, errors naming the key.
pub(crate) struct Reader<'a>(pub(crate) &'a Value);

impl Reader<'_> {
    pub(crate) fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|&x| x <= MAX_SIZE as u64)
                .map(|x| Some(x as usize))
                .ok_or_else(|| invalid(key, &format!("an integer from 0 to {MAX_SIZE}"), v)),
        }
    }
    pub(crate) fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.opt_usize(key)?.ok_or_else(|| ConfigError::Missing {
            key: key.to_string(),
        })
    }
    pub(crate) fn usize_or(&self, key: &str, default: usize) -> Result<usize, ConfigError> {
        Ok(self.opt_usize(key)?.unwrap_or(default))
    }
    pub(crate) fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(key, "a number", v)),
        }
    }
    pub(crate) fn f64_or(&self, key: &str, default: f64) -> Result<f64, ConfigError> {
        Ok(self.opt_f64(key)?.unwrap_or(default))
    }
    pub(crate) fn bool_or(&self, key: &str, default: bool) -> Result<bool, ConfigError> {
        match self.0.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| invalid(key, "true or false", v)),
        }
    }
}

pub(crate) fn invalid(key: &str, expected: &str, found: &Value) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        expected: expected.to_string(),
        found: found.to_string(),
    }
}
