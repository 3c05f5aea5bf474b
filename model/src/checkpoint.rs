//! A safetensors checkpoint read in place: one file or shards listed by
//! `model.safetensors.index.json`, memory-mapped (`memmap2`) and parsed by `safetensors`. Tensors
//! are borrowed from the maps, so the experts exist once, in the page cache.

use half::{bf16, f16};
use memmap2::Mmap;
use moek_kernels::Element;
use moek_kernels::ir::BlockFormat;
use safetensors::{Dtype, SafeTensors};
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Why a checkpoint cannot be used; every variant names the file, tensor or key.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("`{path}` is not a valid safetensors file (truncated or corrupt?): {why}")]
    Format { path: PathBuf, why: String },
    #[error(
        "`{path}` has no safetensors files (model.safetensors or model.safetensors.index.json)"
    )]
    NoWeights { path: PathBuf },
    #[error("`{path}` is not a valid shard index: {why}")]
    Index { path: PathBuf, why: String },
    #[error("`{path}` is a file, not a checkpoint directory (config.json and safetensors files)")]
    NotADirectory { path: PathBuf },
    #[error(
        "--weights huge-pages copies {bytes} bytes of the checkpoint into memory, but {available} \
         bytes are available (MemAvailable, or MOEK_MEMORY_LIMIT); --weights mapped reads it in \
         place instead (slower when it does not fit the page cache)"
    )]
    Memory { bytes: u64, available: u64 },
    #[error("tensor `{name}` is in both `{first}` and `{second}`")]
    Duplicate {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("tensor `{name}` is missing (looked for {tried})")]
    Missing { name: String, tried: String },
    #[error("tensor `{tensor}` has shape {found:?}; expected {expected:?}")]
    Shape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{tensor}` is {found}; expected {expected}")]
    DType {
        tensor: String,
        expected: String,
        found: String,
    },
    #[error(
        "tensor `{tensor}` has rows of {row} values, which {format} cannot store: its blocks hold 32"
    )]
    Blocks {
        tensor: String,
        row: usize,
        format: BlockFormat,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
}

/// Where a loaded weight matrix lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Residence {
    /// Read in place from the memory-mapped file: nothing is copied, but it lives in 4 KiB pages,
    /// which some machines stream at half the rate of huge pages (docs/performance.md).
    Mapped,
    /// Copied into anonymous huge pages at load, 64 MiB at a time, each chunk's mapped pages
    /// released once it is copied (resident memory stays near the weights' bytes).
    HugePages,
}

/// `model.safetensors.index.json`: which shard holds each tensor, in the file's order (a map
/// would hide a tensor listed twice).
#[derive(serde::Deserialize)]
struct Index {
    weight_map: Pairs,
}

struct Pairs(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for Pairs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Pairs;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of tensor names to shard file names")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> Result<Pairs, A::Error> {
                let mut pairs = vec![];
                while let Some(pair) = m.next_entry()? {
                    pairs.push(pair);
                }
                Ok(Pairs(pairs))
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// Where one tensor lies.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range in the shard's map.
    bytes: std::ops::Range<usize>,
}

/// The tensors of a checkpoint directory.
#[derive(Debug)]
pub struct Checkpoint {
    shards: Vec<(PathBuf, Mmap)>,
    entries: HashMap<String, Entry>,
    /// The quantized format its `u8` tensors are stored in (`moek quantize` names it in each
    /// file's metadata, [`QUANTIZATION_KEY`]).
    quantization: Option<BlockFormat>,
}

/// The safetensors metadata key naming the block format of a checkpoint's quantized tensors
/// (`q8_0` or `q4_0`).
pub const QUANTIZATION_KEY: &str = "moek.quantization";

impl Checkpoint {
    /// Maps `dir/model.safetensors`, or every shard named in `dir/model.safetensors.index.json`
    /// (each tensor listed once, and found in the shard the index names).
    pub fn open(dir: &Path) -> Result<Checkpoint, LoadError> {
        if dir.is_file() {
            return Err(LoadError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        let index = dir.join("model.safetensors.index.json");
        if !index.exists() {
            if dir.join("model.safetensors").exists() {
                return Checkpoint::from_files(&[dir.join("model.safetensors")]);
            }
            return Err(LoadError::NoWeights {
                path: dir.to_path_buf(),
            });
        }
        let bad = |why: String| LoadError::Index {
            path: index.clone(),
            why,
        };
        let Index { weight_map } =
            serde_json::from_str(&read(&index)?).map_err(|e| bad(e.to_string()))?;
        let mut files: Vec<&str> = weight_map.0.iter().map(|(_, f)| f.as_str()).collect();
        files.sort_unstable();
        files.dedup();
        let paths: Vec<PathBuf> = files.iter().map(|f| dir.join(f)).collect();
        let ck = Checkpoint::from_files(&paths)?;
        let mut listed = std::collections::HashSet::new();
        for (tensor, file) in &weight_map.0 {
            if !listed.insert(tensor) {
                return Err(bad(format!("`weight_map` lists `{tensor}` twice")));
            }
            let shard = files.binary_search(&file.as_str()).expect("listed above");
            if ck.entries.get(tensor).is_none_or(|e| e.shard != shard) {
                return Err(bad(format!(
                    "`weight_map` puts `{tensor}` in `{file}`, which does not hold it"
                )));
            }
        }
        Ok(ck)
    }

    pub fn from_files(files: &[PathBuf]) -> Result<Checkpoint, LoadError> {
        let mut shards = vec![];
        let mut entries = HashMap::new();
        let mut quantization = None;
        for (i, path) in files.iter().enumerate() {
            let io = |source| LoadError::Io {
                path: path.clone(),
                source,
            };
            let file = File::open(path).map_err(io)?;
            // SAFETY: the map is read-only; a checkpoint changed on disk while we run is outside
            // what any reader can defend against (as with every mmap-based loader).
            let map = unsafe { Mmap::map(&file) }.map_err(io)?;
            let st = SafeTensors::deserialize(&map).map_err(|e| LoadError::Format {
                path: path.clone(),
                why: e.to_string(),
            })?;
            if let Some(named) = quantization_of(path, &map)? {
                if quantization.is_some_and(|q| q != named) {
                    return Err(LoadError::Format {
                        path: path.clone(),
                        why: format!("its shards name two quantized formats ({named} and another)"),
                    });
                }
                quantization = Some(named);
            }
            for (name, view) in st.tensors() {
                let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
                let entry = Entry {
                    shard: i,
                    dtype: view.dtype(),
                    shape: view.shape().to_vec(),
                    bytes: start..start + view.data().len(),
                };
                if let Some(first) = entries.get(&name) {
                    let first: &Entry = first;
                    return Err(LoadError::Duplicate {
                        name,
                        first: files[first.shard].clone(),
                        second: path.clone(),
                    });
                }
                entries.insert(name, entry);
            }
            shards.push((path.clone(), map));
        }
        Ok(Checkpoint {
            shards,
            entries,
            quantization,
        })
    }

    /// The block format the checkpoint's quantized tensors are in, if it has any.
    pub fn quantization(&self) -> Option<BlockFormat> {
        self.quantization
    }

    /// The block format of the first of `names` present, if it is stored quantized (a `u8`
    /// tensor in a checkpoint that names its format).
    pub fn quantized(&self, names: &[String]) -> Option<BlockFormat> {
        let (_, e) = self.find(names).ok()?;
        (e.dtype == Dtype::U8)
            .then_some(self.quantization)
            .flatten()
    }

    /// Tensor `names[0]` (or an alias) of `shape` values, stored in blocks of `Q`: a `u8` tensor
    /// of shape `[..shape without its last, last / 32, block bytes]`, living where `residence`
    /// says.
    pub fn blocks<Q: Element>(
        &self,
        names: &[String],
        shape: &[usize],
        residence: Residence,
    ) -> Result<Cow<'_, [Q]>, LoadError> {
        let (name, e) = self.find(names)?;
        if self.quantization != Some(Q::FORMAT) || e.dtype != Dtype::U8 {
            return Err(LoadError::DType {
                tensor: name.to_string(),
                expected: format!("U8 blocks of {}", Q::FORMAT),
                found: match self.quantization {
                    Some(q) => format!("{:?} in a {q} checkpoint", e.dtype),
                    None => format!("{:?} in a checkpoint with no quantized format", e.dtype),
                },
            });
        }
        check_shape(name, &e.shape, &block_shape::<Q>(shape))?;
        let bytes = &self.shards[e.shard].1[e.bytes.clone()];
        let mapped = match bytemuck::try_cast_slice(bytes) {
            Ok(v) => Cow::Borrowed(v),
            Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
        };
        Ok(self.resident(mapped, e, residence))
    }

    /// Tensor `names[0]` (in `W`, of `shape`) quantized to blocks of `Q` as it is read, a chunk
    /// at a time, each chunk's mapped pages released once it is quantized (`--quantize`).
    pub fn quantize<W: Element, Q: Element>(
        &self,
        names: &[String],
        shape: &[usize],
    ) -> Result<Vec<Q>, LoadError> {
        let mapped = self.tensor::<W>(names, shape)?;
        let row = shape.last().copied().unwrap_or(0);
        if !row.is_multiple_of(moek_kernels::ir::quant::BLOCK) {
            return Err(LoadError::Blocks {
                tensor: self.find(names)?.0.to_string(),
                row,
                format: Q::FORMAT,
            });
        }
        let e = self.find(names)?.1;
        const CHUNK: usize = 64 << 20;
        let per = CHUNK / size_of::<W>();
        let mut out = Vec::with_capacity(mapped.len() / moek_kernels::ir::quant::BLOCK);
        for (i, chunk) in mapped.chunks(per).enumerate() {
            out.extend_from_slice(&moek_kernels::blocks::quantize::<W, Q>(chunk));
            let start = e.bytes.start + i * CHUNK;
            self.release(e.shard, start..start + size_of_val(chunk));
        }
        Ok(out)
    }

    /// Bytes of every tensor.
    pub fn bytes(&self) -> usize {
        self.entries.values().map(|e| e.bytes.len()).sum()
    }

    /// Every tensor's name, stored dtype and bytes.
    pub fn sizes(&self) -> impl Iterator<Item = (&str, Dtype, usize)> {
        self.entries
            .iter()
            .map(|(name, e)| (name.as_str(), e.dtype, e.bytes.len()))
    }

    /// The first of `names` present.
    fn find(&self, names: &[String]) -> Result<(&str, &Entry), LoadError> {
        names
            .iter()
            .find_map(|n| self.entries.get_key_value(n.as_str()))
            .map(|(k, e)| (k.as_str(), e))
            .ok_or_else(|| LoadError::Missing {
                name: names[0].clone(),
                tried: names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// Tensor `name` as stored: its dtype, shape and bytes.
    pub fn raw(&self, name: &str) -> Option<(Dtype, &[usize], &[u8])> {
        let e = self.entries.get(name)?;
        Some((e.dtype, &e.shape, &self.shards[e.shard].1[e.bytes.clone()]))
    }

    /// Drops tensor `name`'s pages from this process's map once its bytes have been copied
    /// (the page cache keeps them; a later read faults them back): so a tensor rewritten at
    /// load does not count twice in the resident set. A no-op for a name not present.
    pub fn release_tensor(&self, name: &str) {
        if let Some(e) = self.entries.get(name) {
            self.release(e.shard, e.bytes.clone());
        }
    }

    /// Whether any of `names` is present.
    pub fn has(&self, names: &[String]) -> bool {
        names.iter().any(|n| self.entries.contains_key(n.as_str()))
    }

    /// The storage dtype of the first of `names` present.
    pub fn dtype(&self, names: &[String]) -> Result<Dtype, LoadError> {
        Ok(self.find(names)?.1.dtype)
    }

    /// Tensor `names[0]` (or an alias) with `shape`, in the checkpoint's dtype `W`, borrowed from
    /// the map (copied only if the file places it off `W`'s alignment).
    pub fn tensor<W: Element>(
        &self,
        names: &[String],
        shape: &[usize],
    ) -> Result<Cow<'_, [W]>, LoadError> {
        let (name, e) = self.find(names)?;
        check_shape(name, &e.shape, shape)?;
        if e.dtype != dtype_of::<W>() {
            return Err(LoadError::DType {
                tensor: name.to_string(),
                expected: format!("{:?}", dtype_of::<W>()),
                found: format!("{:?}", e.dtype),
            });
        }
        let bytes = &self.shards[e.shard].1[e.bytes.clone()];
        Ok(match bytemuck::try_cast_slice(bytes) {
            Ok(v) => Cow::Borrowed(v),
            Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
        })
    }

    /// [`Checkpoint::tensor`], living where `residence` says.
    pub fn matrix<W: Element>(
        &self,
        names: &[String],
        shape: &[usize],
        residence: Residence,
    ) -> Result<Cow<'_, [W]>, LoadError> {
        let mapped = self.tensor::<W>(names, shape)?;
        Ok(self.resident(mapped, self.find(names)?.1, residence))
    }

    /// `mapped` (entry `e`'s elements) where `residence` says: in place, or copied into huge
    /// pages a chunk at a time, each chunk's mapped pages released once copied (resident
    /// memory never holds more than one chunk twice).
    fn resident<'a, T: bytemuck::Pod>(
        &'a self,
        mapped: Cow<'a, [T]>,
        e: &Entry,
        residence: Residence,
    ) -> Cow<'a, [T]> {
        if residence == Residence::Mapped {
            return mapped;
        }
        const CHUNK_BYTES: usize = 64 << 20;
        let per = (CHUNK_BYTES / size_of::<T>()).max(1);
        let mut copy = moek_cpu::memory::huge_capacity::<T>(mapped.len());
        for (i, chunk) in mapped.chunks(per).enumerate() {
            copy.extend_from_slice(chunk);
            let start = e.bytes.start + i * per * size_of::<T>();
            self.release(e.shard, start..start + size_of_val(chunk));
        }
        Cow::Owned(copy)
    }

    /// The tensors `parts` (each its names and shape, all in `W`) copied one after another into
    /// one matrix, in huge pages when `residence` says so. Each part's mapped pages are released
    /// once it is copied, so the gathered matrix is the only copy left resident (per-expert
    /// checkpoint tensors gathered into one bank).
    pub fn gather<W: Element>(
        &self,
        parts: &[(Vec<String>, Vec<usize>)],
        residence: Residence,
    ) -> Result<Vec<W>, LoadError> {
        self.gather_with(parts, residence, |names, shape| {
            self.tensor::<W>(names, shape)
        })
    }

    /// [`Checkpoint::gather`] for parts stored in blocks of `Q` (each part's `shape` in values):
    /// a quantized checkpoint of a family whose banks are per-expert tensors.
    pub fn gather_blocks<Q: Element>(
        &self,
        parts: &[(Vec<String>, Vec<usize>)],
        residence: Residence,
    ) -> Result<Vec<Q>, LoadError> {
        self.gather_with(parts, residence, |names, shape| {
            self.blocks::<Q>(names, shape, Residence::Mapped)
        })
    }

    /// The parts as `read` finds them (shape and dtype checked), concatenated.
    fn gather_with<'a, T: bytemuck::Pod>(
        &'a self,
        parts: &[(Vec<String>, Vec<usize>)],
        residence: Residence,
        read: impl Fn(&[String], &[usize]) -> Result<Cow<'a, [T]>, LoadError>,
    ) -> Result<Vec<T>, LoadError> {
        // Every part is found, its shape and dtype checked, before anything is copied.
        let mapped = parts
            .iter()
            .map(|(names, shape)| Ok((read(names, shape)?, self.find(names)?.1)))
            .collect::<Result<Vec<_>, LoadError>>()?;
        let total = mapped.iter().map(|(part, _)| part.len()).sum();
        let mut out = match residence {
            Residence::HugePages => moek_cpu::memory::huge_capacity::<T>(total),
            Residence::Mapped => Vec::with_capacity(total),
        };
        for (part, e) in mapped {
            out.extend_from_slice(&part);
            self.release(e.shard, e.bytes.clone());
        }
        Ok(out)
    }

    /// Unmaps `bytes` of shard `shard`'s map from this process: the file's pages stay in the page
    /// cache, and a later read of the map faults the same bytes back in. A hint: if it fails, the
    /// pages merely stay mapped.
    fn release(&self, shard: usize, bytes: std::ops::Range<usize>) {
        #[cfg(unix)]
        {
            let map = &self.shards[shard].1;
            // SAFETY: the map is a read-only shared mapping of a file. MADV_DONTNEED only drops
            // its page-table entries; the next access reads the file's bytes again, unchanged (it
            // zeroes pages only in private or anonymous mappings, which this is not), so a slice
            // still borrowing them reads what it read before.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    bytes.start,
                    bytes.len(),
                )
            };
        }
        #[cfg(not(unix))]
        let _ = (shard, bytes);
    }

    /// Tensor `names[0]` (or an alias) with `shape`, widened to f32 from any float dtype (norm
    /// weights, scales: small tensors the CPU uses directly).
    pub fn f32s(&self, names: &[String], shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let (name, e) = self.find(names)?;
        check_shape(name, &e.shape, shape)?;
        let bytes = &self.shards[e.shard].1[e.bytes.clone()];
        Ok(match e.dtype {
            Dtype::F32 => bytemuck::pod_collect_to_vec(bytes),
            Dtype::BF16 => bytemuck::pod_collect_to_vec::<u8, bf16>(bytes)
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            Dtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(bytes)
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            other => {
                return Err(LoadError::DType {
                    tensor: name.to_string(),
                    expected: "F32, BF16 or F16".into(),
                    found: format!("{other:?}"),
                });
            }
        })
    }
}

fn check_shape(name: &str, found: &[usize], expected: &[usize]) -> Result<(), LoadError> {
    // A [1] scalar may also be stored as a 0-d tensor.
    let scalar = expected == [1] && found.is_empty();
    if found == expected || scalar {
        Ok(())
    } else {
        Err(LoadError::Shape {
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        })
    }
}

/// The safetensors dtype of a storage element.
pub fn dtype_of<W: Element>() -> Dtype {
    match W::DTYPE {
        moek_kernels::ir::DType::F16 => Dtype::F16,
        moek_kernels::ir::DType::Bf16 => Dtype::BF16,
        moek_kernels::ir::DType::F32 => Dtype::F32,
        q => unreachable!("{q} stores blocks, and no `Element` is one"),
    }
}

/// The stored shape of a tensor of `shape` values in blocks of `Q`: the last extent cut into
/// blocks, each its bytes.
pub fn block_shape<Q: Element>(shape: &[usize]) -> Vec<usize> {
    let (last, rest) = shape.split_last().expect("a matrix has extents");
    let mut out = rest.to_vec();
    out.extend([last / moek_kernels::ir::quant::BLOCK, size_of::<Q>()]);
    out
}

/// The quantized format `map`'s metadata names, if any (an unknown one is an error).
fn quantization_of(path: &Path, map: &[u8]) -> Result<Option<BlockFormat>, LoadError> {
    let (_, meta) = SafeTensors::read_metadata(map).map_err(|e| LoadError::Format {
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let Some(name) = meta
        .metadata()
        .as_ref()
        .and_then(|m| m.get(QUANTIZATION_KEY))
    else {
        return Ok(None);
    };
    match BlockFormat::from_name(name) {
        Some(b) => Ok(Some(b)),
        None => Err(LoadError::Format {
            path: path.to_path_buf(),
            why: format!(
                "its metadata names the quantized format `{name}`; known: {}",
                BlockFormat::valid_names()
            ),
        }),
    }
}

fn read(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })
}
