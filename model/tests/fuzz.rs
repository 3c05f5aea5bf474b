//! Fuzzing what a checkpoint directory holds (docs/reliability.md): mutated config.json of every
//! family's layouts (Gemma-4's two, Qwen3-MoE's two spellings, gpt-oss's f32, bf16 and MXFP4) and mutated safetensors files, loaded and, where they load, run. Never a
//! panic: a refusal is a typed error naming the key, tensor or file.

use moek_kernels::dispatch::Backend;
use moek_model::checkpoint::{Checkpoint, Residence};
use moek_model::config::Family;
use moek_model::forward::{Cache, CausalLm, Head};
use moek_model::gemma4::config::Config;
use moek_model::gemma4::model::Model;
use moek_model::gemma4::weights;
use moek_tests::fuzz::{Fuzz, mutate_bytes, mutate_json};
use rand::Rng;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// Every family's fixtures: for each, the layout transformers 5 saves and the hub's.
const FIXTURES: [&str; 7] = [
    "tiny-gemma4-moe-f32",
    "tiny-gemma4-moe-bf16",
    "tiny-qwen3-moe-f32",
    "tiny-qwen3-moe-bf16",
    "tiny-gpt-oss-f32",
    "tiny-gpt-oss-bf16",
    "tiny-gpt-oss-mxfp4",
];

fn config_of(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap())
        .unwrap()
}

/// A config of either family.
enum AnyConfig {
    Gemma4(Config),
    Qwen3(moek_model::qwen3::config::Config),
    GptOss(moek_model::gpt_oss::config::Config),
}

/// `v` read as the family its `model_type` names.
fn parse(v: &Value) -> Result<AnyConfig, String> {
    let e = |e: moek_model::config::ConfigError| e.to_string();
    Ok(match Family::of(v).map_err(e)? {
        Family::Gemma4 => AnyConfig::Gemma4(Config::from_json(v).map_err(e)?),
        Family::Qwen3Moe => {
            AnyConfig::Qwen3(moek_model::qwen3::config::Config::from_json(v).map_err(e)?)
        }
        Family::GptOss => {
            AnyConfig::GptOss(moek_model::gpt_oss::config::Config::from_json(v).map_err(e)?)
        }
    })
}

/// Loads `cfg` against the checkpoint in `dir` and runs three tokens: `Ok(false)` at the first
/// refusal (with its message checked), `Ok(true)` if it ran.
fn load_and_run(dir: &Path, cfg: Result<AnyConfig, String>) -> Result<bool, String> {
    let refused = |msg: String| {
        if msg.is_empty() {
            Err("an error without a message".to_string())
        } else {
            Ok(false)
        }
    };
    let cfg = match cfg {
        Ok(c) => c,
        Err(msg) => return refused(msg),
    };
    let ck = match Checkpoint::open(dir) {
        Ok(c) => c,
        Err(e) => return refused(e.to_string()),
    };
    let names = [
        weights::names("embed_tokens.weight"),
        vec!["model.embed_tokens.weight".into()],
    ]
    .concat();
    let ran = match ck.dtype(&names) {
        Ok(safetensors::Dtype::BF16) => run::<half::bf16>(&ck, cfg),
        Ok(_) => run::<f32>(&ck, cfg),
        Err(e) => Err(e.to_string()),
    };
    match ran {
        Ok(()) => Ok(true),
        Err(msg) => refused(msg),
    }
}

fn run<W: moek_kernels::Element>(ck: &Checkpoint, cfg: AnyConfig) -> Result<(), String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let tokens = [1, 2, 3];
    let logits = match cfg {
        AnyConfig::Gemma4(cfg) => {
            let w = weights::load::<W>(ck, &cfg, Residence::Mapped, |_| {}).map_err(|x| e(&x))?;
            let m = Model::new(cfg, w, Backend::cpu());
            m.forward(&tokens, &mut Cache::default(), Head::Last, &mut vec![])
        }
        AnyConfig::Qwen3(cfg) => {
            use moek_model::qwen3;
            let w = qwen3::weights::load::<W>(ck, &cfg, Residence::Mapped, |_| {});
            let m = qwen3::model::Model::new(cfg, w.map_err(|x| e(&x))?, Backend::cpu());
            m.forward(&tokens, &mut Cache::default(), Head::Last, &mut vec![])
        }
        AnyConfig::GptOss(cfg) => {
            use moek_model::gpt_oss;
            let w =
                gpt_oss::weights::load_quantized::<W>(ck, &cfg, Residence::Mapped, None, |_| {});
            let m = gpt_oss::model::Model::new(cfg, w.map_err(|x| e(&x))?, Backend::cpu());
            m.forward(&tokens, &mut Cache::default(), Head::Last, &mut vec![])
        }
    };
    logits.map(|_| ()).map_err(|x| e(&x))
}

#[test]
fn mutated_configs_are_refused_by_key_or_run() {
    let fuzz = Fuzz::new("config.json", 300);
    let counts = fuzz.run(
        |rng| {
            let name = FIXTURES[rng.random_range(0..FIXTURES.len())];
            let mut v = config_of(name);
            let n = rng.random_range(1..=3);
            mutate_json(&mut v, n, rng);
            (name, v)
        },
        |(name, v)| load_and_run(&fixture(name), parse(v)),
    );
    assert!(counts.refused > 0 && counts.accepted > 0, "{counts:?}");
}

/// A safetensors file: its 8-byte header length, the JSON header, the data.
fn split(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        &bytes[8 + n..],
    )
}

#[test]
fn mutated_safetensors_are_refused_by_file_or_run() {
    let fuzz = Fuzz::new("safetensors", 200);
    let dir = std::env::temp_dir().join(format!("moek-fuzz-st-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let original: Vec<Vec<u8>> = FIXTURES
        .iter()
        .map(|f| std::fs::read(fixture(f).join("model.safetensors")).unwrap())
        .collect();
    let counts = fuzz.run(
        |rng| {
            let which = rng.random_range(0..FIXTURES.len());
            let bytes = &original[which];
            let mutated = match rng.random_range(0..3) {
                // The header's JSON: offsets, dtypes, shapes, names.
                0 | 1 => {
                    let (mut header, data) = split(bytes);
                    let n = rng.random_range(1..=2);
                    mutate_json(&mut header, n, rng);
                    let text = header.to_string();
                    let mut len = text.len() as u64;
                    if rng.random_bool(0.1) {
                        len = len.wrapping_add(rng.random_range(1..1u64 << 40)); // past the file
                    }
                    let mut out = len.to_le_bytes().to_vec();
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(data);
                    if rng.random_bool(0.2) {
                        let keep = rng.random_range(0..out.len()); // truncated data
                        out.truncate(keep);
                    }
                    out
                }
                // Raw bytes anywhere, maybe cut short.
                _ => {
                    let mut b = bytes.clone();
                    mutate_bytes(&mut b, rng);
                    b
                }
            };
            Case { which, mutated }
        },
        |case| {
            std::fs::write(dir.join("model.safetensors"), &case.mutated).unwrap();
            let v = moek_model::config::read(&fixture(FIXTURES[case.which])).unwrap();
            load_and_run(&dir, parse(&v))
        },
    );
    assert!(counts.refused > 0, "{counts:?}");
}

/// A mutated file, shown by its size (the bytes rebuild from the seed).
struct Case {
    which: usize,
    mutated: Vec<u8>,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = u64::from_le_bytes(
            self.mutated
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .unwrap_or([0; 8]),
        );
        let header = self
            .mutated
            .get(8..)
            .map(|h| String::from_utf8_lossy(&h[..h.len().min(600)]));
        write!(
            f,
            "{} bytes from {}, header length {n}, header {header:?}",
            self.mutated.len(),
            FIXTURES[self.which]
        )
    }
}
