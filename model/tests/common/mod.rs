//! What the model's fixture tests share: reading a committed fixture's `expected.json`
//! (`scripts/make_fixtures.py`) into tokens and logits.

use std::path::PathBuf;

/// The fixture directory `tests/fixtures/NAME` and its `expected.json`.
pub fn fixture(name: &str) -> (PathBuf, serde_json::Value) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name);
    let v = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap());
    (dir, v.unwrap())
}

/// A JSON list of token ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A JSON list of numbers, as f32.
pub fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// A JSON list of rows of numbers (logits), as f32.
pub fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array().unwrap().iter().map(floats).collect()
}
