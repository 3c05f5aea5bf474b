//! The cache of winners: one JSON file, entries keyed by everything that makes a winner valid:
//! the op, its sizes, dtype, activation and biases, the target, the device (the CPU's ISA level and
//! threads), moek's version, and a hash of the candidate space, so another shape, another
//! machine or one new candidate never reuses a stale pick. A corrupt file is a clear error
//! naming it; an entry of another key is a miss.

use super::Outcome;
use super::space::{Problem, Schedule};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// What a cached winner is valid for.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Key {
    pub op: String,
    pub dims: String,
    pub dtype: String,
    pub activation: String,
    pub bias: String,
    pub target: String,
    pub device: String,
    pub version: String,
    /// A hash of every candidate's text, in order.
    pub space: String,
}

impl Key {
    pub fn of(p: &Problem, space: &[Schedule]) -> Key {
        // FNV-1a: stable across builds and platforms, unlike the std hasher's seeds.
        struct Fnv(u64);
        impl Hasher for Fnv {
            fn finish(&self) -> u64 {
                self.0
            }
            fn write(&mut self, bytes: &[u8]) {
                for b in bytes {
                    self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
                }
            }
        }
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        for s in space {
            s.summary().hash(&mut h);
        }
        let device = match p.target {
            moek_kernels::ir::Target::Cpu => format!(
                "cpu {} x{}",
                moek_cpu::isa().name(),
                rayon::current_num_threads()
            ),
            t => format!("{t} (cost model)"),
        };
        Key {
            op: "expert_ffn".into(),
            dims: p.dims.text(),
            dtype: p.dtype.to_string(),
            activation: super::space::activation_text(p.activation),
            bias: super::space::bias_text(p.optional).unwrap_or_else(|| "none".into()),
            target: p.target.to_string(),
            device,
            version: env!("CARGO_PKG_VERSION").into(),
            space: format!("{:016x}", h.finish()),
        }
    }

    fn id(&self) -> String {
        serde_json::to_string(self).expect("a key serialises")
    }
}

/// `$XDG_CACHE_HOME/moek/tune.json`, or `~/.cache/moek/tune.json`.
pub fn default_path() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("moek").join("tune.json")
}

type File = BTreeMap<String, Outcome>;

fn load(path: &Path) -> Result<File, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            format!(
                "the tuning cache `{}` is not moek's (or is corrupt): {e}; remove it or pass `--no-cache`",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(File::new()),
        Err(e) => Err(format!("cannot read the tuning cache `{}`: {e}", path.display())),
    }
}

/// The cached outcome for `key`, if any.
pub fn read(path: &Path, key: &Key) -> Result<Option<Outcome>, String> {
    Ok(load(path)?.remove(&key.id()))
}

/// Adds `outcome` under `key` (written whole to a temporary file, then renamed over the cache).
pub fn write(path: &Path, key: &Key, outcome: &Outcome) -> Result<(), String> {
    let mut file = load(path)?;
    file.insert(key.id(), outcome.clone());
    let err =
        |e: std::io::Error| format!("cannot write the tuning cache `{}`: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(&file).expect("serialises"),
    )
    .map_err(err)?;
    std::fs::rename(&tmp, path).map_err(err)
}
