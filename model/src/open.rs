//! Opening a checkpoint of any family as a model that runs: [`open`] reads config.json's
//! `model_type`, finds the family in [`FAMILIES`] (one row a family), loads the weights in the
//! checkpoint's storage dtype and returns a [`Model`] that runs forward and generation and records,
//! per step, which variant ran and why. The `moek` commands are users of it.

use crate::checkpoint::{Checkpoint, LoadError, Residence};
use crate::config::Family;
use crate::forward::{Cache, CacheLayout, CausalLm, Head, Kernels, ModelError, Trace};
use crate::quantized::{Quantize, Scope};
use crate::{gemma4, gpt_oss, qwen3};
use half::{bf16, f16};
use moek_kernels::ir::{Activation, DType};
use moek_kernels::{Backend, Registry, Shape};
use safetensors::Dtype;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// How to open a model: where its kernels run and from which specs, how its weights are held.
#[derive(Clone, Debug)]
pub struct Options {
    pub backend: Backend,
    /// The specs dispatch chooses from (`Registry::builtin()`, or a user's ahead of them).
    pub registry: Arc<Registry>,
    /// Quantize the matrices it covers (the whole model, or the experts, embedding and LM
    /// head) to its blocks as they are loaded.
    pub quantize: Option<Quantize>,
    /// Where the weight matrices live (`None`: huge pages on the CPU, mapped elsewhere).
    pub weights: Option<Residence>,
    /// Force this MoE variant; one that cannot serve the model fails before any state changes.
    pub variant: Option<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            backend: Backend::cpu(),
            registry: Arc::new(Registry::builtin()),
            quantize: None,
            weights: None,
            variant: None,
        }
    }
}

impl Options {
    /// `weights`, or the backend's default: huge pages on the CPU (streamed 4 KiB pages are
    /// slow on some machines), mapped on a device backend, whose kernels read what they uploaded.
    pub fn residence(&self) -> Residence {
        self.weights
            .unwrap_or(if self.backend.target == moek_kernels::ir::Target::Cpu {
                Residence::HugePages
            } else {
                Residence::Mapped
            })
    }

    fn kernels(&self) -> Kernels {
        Kernels::new(self.backend.clone())
            .with_registry(self.registry.clone())
            .with_variant(self.variant.clone())
    }
}

/// A family's loaded model, borrowing the checkpoint it was read from.
pub type Loaded<'c> = Box<dyn CausalLm + Send + Sync + 'c>;

/// Builds a family's model from a checkpoint, its config.json, the options and the storage
/// dtype, reporting layers loaded as it goes.
pub type LoadFn = for<'c> fn(
    &'c Checkpoint,
    &Value,
    &Options,
    Dtype,
    &mut dyn FnMut(usize),
) -> Result<Loaded<'c>, LoadError>;

/// One family (config.json's `model_type` names it, `Family::of`): the tensor whose dtype is the
/// model's storage dtype (one never quantized), its layer count, stop tokens, which tensors are
/// quantized, and how its model is built.
#[derive(Debug)]
pub struct FamilyRow {
    pub family: Family,
    /// Tensors (each by its names) whose dtype is the model's storage dtype unless quantized:
    /// the first present and plain decides.
    pub dtype_tensor: fn() -> Vec<Vec<String>>,
    pub layers: fn(&Value) -> Result<usize, LoadError>,
    pub eos: fn(&Value) -> Result<Vec<u32>, LoadError>,
    /// Whether the checkpoint tensor `name` is one `--quantize` and `moek quantize` of a scope
    /// put in blocks (the expert banks, and the matrices the family's loader reads as blocks).
    pub quantized: fn(&str, Scope) -> bool,
    /// The expert FFN its MoE layers dispatch, if any: E, R, H and F (T is free) and the
    /// experts' activation (what `moek tune --model` searches).
    pub moe: MoeFn,
    pub load: LoadFn,
}

/// Reads from config.json the expert FFN a family's MoE layers dispatch (sizes with T set to 1,
/// the experts' activation), or `None` when it has no MoE layer.
pub type MoeFn = fn(&Value) -> Result<Option<(Shape, Activation)>, LoadError>;

/// `$body` with `$w` the element type of the safetensors dtype `$dtype`.
macro_rules! by_dtype {
    ($dtype:expr, $w:ident => $body:expr) => {
        match $dtype {
            Dtype::BF16 => Ok({
                type $w = bf16;
                $body
            }),
            Dtype::F16 => Ok({
                type $w = f16;
                $body
            }),
            Dtype::F32 => Ok({
                type $w = f32;
                $body
            }),
            other => unreachable!("storage dtype {other:?} was checked by `open`"),
        }
    };
}

/// Every family moek runs, one row each.
pub const FAMILIES: &[FamilyRow] = &[
    FamilyRow {
        family: Family::Gemma4,
        // q_proj is in blocks in a model quantized whole, the router never.
        dtype_tensor: || {
            [
                "layers.0.self_attn.q_proj.weight",
                "layers.0.router.proj.weight",
            ]
            .map(gemma4::weights::names)
            .to_vec()
        },
        layers: |v| Ok(gemma4::config::Config::from_json(v)?.layers.len()),
        eos: |v| Ok(gemma4::config::Config::from_json(v)?.eos_token_id),
        quantized: crate::quantized::quantized_tensor,
        moe: |v| {
            let cfg = gemma4::config::Config::from_json(v)?;
            let shape = cfg.moe.map(|m| m.shape(1, cfg.hidden_size));
            Ok(shape.map(|s| (s, Activation::GeluTanh)))
        },
        load: |ck, v, o, dtype, progress| {
            let cfg = gemma4::config::Config::from_json(v)?;
            by_dtype!(dtype, W => {
                let w = gemma4::weights::load_quantized::<W>(ck, &cfg, o.residence(), o.quantize, progress)?;
                Box::new(gemma4::model::Model::new(cfg, w, o.kernels()))
            })
        },
    },
    FamilyRow {
        family: Family::Qwen3Moe,
        dtype_tensor: || vec![vec!["model.embed_tokens.weight".to_string()]],
        layers: |v| Ok(qwen3::config::Config::from_json(v)?.layers.len()),
        eos: |v| Ok(qwen3::config::Config::from_json(v)?.eos_token_id),
        quantized: qwen3::weights::quantized_tensor,
        moe: |v| {
            let cfg = qwen3::config::Config::from_json(v)?;
            Ok(Some((cfg.moe_shape(1), Activation::Silu)))
        },
        load: |ck, v, o, dtype, progress| {
            let cfg = qwen3::config::Config::from_json(v)?;
            by_dtype!(dtype, W => {
                let w = qwen3::weights::load_quantized::<W>(ck, &cfg, o.residence(), o.quantize, progress)?;
                Box::new(qwen3::model::Model::new(cfg, w, o.kernels()))
            })
        },
    },
    FamilyRow {
        family: Family::GptOss,
        dtype_tensor: || vec![vec!["model.embed_tokens.weight".to_string()]],
        layers: |v| Ok(gpt_oss::config::Config::from_json(v)?.layers.len()),
        eos: |v| Ok(gpt_oss::config::Config::from_json(v)?.eos_token_id),
        quantized: gpt_oss::weights::quantized_tensor,
        moe: |v| {
            let cfg = gpt_oss::config::Config::from_json(v)?;
            Ok(Some((cfg.moe_shape(1), cfg.activation())))
        },
        load: |ck, v, o, dtype, progress| {
            let cfg = gpt_oss::config::Config::from_json(v)?;
            by_dtype!(dtype, W => {
                let w = gpt_oss::weights::load_quantized::<W>(ck, &cfg, o.residence(), o.quantize, progress)?;
                Box::new(gpt_oss::model::Model::new(cfg, w, o.kernels()))
            })
        },
    },
];

self_cell::self_cell!(
    struct Cell {
        owner: Checkpoint,
        #[covariant]
        dependent: Loaded,
    }
);

/// A model opened from a checkpoint directory: it owns the checkpoint (its memory maps) and the
/// model read from it, and runs as any [`CausalLm`].
pub struct Model {
    cell: Cell,
    family: Family,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("family", &self.family)
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Model {
    pub fn family(&self) -> Family {
        self.family
    }

    /// config.json's stop tokens.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// The checkpoint the model reads its weights from.
    pub fn checkpoint(&self) -> &Checkpoint {
        self.cell.borrow_owner()
    }
}

impl CausalLm for Model {
    fn context(&self) -> usize {
        self.cell.borrow_dependent().context()
    }

    fn cache_layout(&self) -> Vec<CacheLayout> {
        self.cell.borrow_dependent().cache_layout()
    }

    fn check_variant(&self, tokens: usize) -> Result<(), ModelError> {
        self.cell.borrow_dependent().check_variant(tokens)
    }

    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.cell
            .borrow_dependent()
            .forward(tokens, cache, head, trace)
    }
}

/// The row of `family`.
pub fn family(family: Family) -> &'static FamilyRow {
    FAMILIES
        .iter()
        .find(|r| r.family == family)
        .expect("every family has a row")
}

/// The expert FFN a checkpoint's MoE layers dispatch, without loading it: sizes (T set to 1),
/// the experts' activation and the storage dtype of its matrices; `None` for a model with no
/// MoE layer.
pub fn expert_ffn(dir: &Path) -> Result<Option<(Shape, Activation, DType)>, LoadError> {
    let json = crate::config::read(dir)?;
    let row = family(Family::of(&json)?);
    let Some((shape, activation)) = (row.moe)(&json)? else {
        return Ok(None);
    };
    let dtype = match storage_dtype(&Checkpoint::open(dir)?, row)? {
        Dtype::BF16 => DType::Bf16,
        Dtype::F16 => DType::F16,
        _ => DType::F32,
    };
    Ok(Some((shape, activation, dtype)))
}

/// The checkpoint's storage dtype: that of the first of the family's `dtype_tensor`s present
/// and not in blocks (bf16, f16 or f32).
fn storage_dtype(ck: &Checkpoint, row: &FamilyRow) -> Result<Dtype, LoadError> {
    let tensors = (row.dtype_tensor)();
    let mut last = None;
    for names in tensors.iter().filter(|names| ck.has(names)) {
        match ck.dtype(names)? {
            d @ (Dtype::BF16 | Dtype::F16 | Dtype::F32) => return Ok(d),
            other => last = Some((names[0].clone(), other)),
        }
    }
    let (tensor, found) = match last {
        Some((tensor, dtype)) => (tensor, format!("{dtype:?}")),
        None => (tensors[0][0].clone(), "no such tensor".into()),
    };
    Err(LoadError::DType {
        tensor,
        expected: "BF16, F16 or F32 (the model's storage dtype)".into(),
        found,
    })
}

/// Opens the checkpoint directory `dir` (config.json and safetensors) of any family in
/// [`FAMILIES`], by its `model_type`.
pub fn open(dir: &Path, options: &Options) -> Result<Model, LoadError> {
    open_with_progress(dir, options, |_, _| {})
}

/// [`open`], reporting `(layers loaded, layers)` as it goes.
pub fn open_with_progress(
    dir: &Path,
    options: &Options,
    mut progress: impl FnMut(usize, usize),
) -> Result<Model, LoadError> {
    if dir.is_file() {
        return Err(LoadError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    let json = crate::config::read(dir)?;
    let family = Family::of(&json)?;
    let row = self::family(family);
    let layers = (row.layers)(&json)?;
    let eos = (row.eos)(&json)?;
    let ck = Checkpoint::open(dir)?;
    // A copy needs the checkpoint's bytes in memory (its quantized tensors at their quantized
    // size with `quantize`); a mapped checkpoint larger than memory still runs, its pages read
    // again from the file as they are needed.
    if options.residence() == Residence::HugePages {
        let bytes = crate::quantized::resident_bytes(&ck, options.quantize, row.quantized) as u64;
        if let Some(available) = crate::limits::memory_available()
            && bytes > available
        {
            return Err(LoadError::Memory { bytes, available });
        }
    }
    let dtype = storage_dtype(&ck, row)?;
    let cell = Cell::try_new(ck, |ck| {
        (row.load)(ck, &json, options, dtype, &mut |n| progress(n, layers))
    })?;
    Ok(Model { cell, family, eos })
}
