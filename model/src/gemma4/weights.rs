//! The weights of a Gemma-4 text model, each field named after its checkpoint key (candle's
//! habit: `layers.{i}.self_attn.q_proj.weight` is `layers[i].self_attn.q_proj`). Large matrices
//! stay in the storage dtype `W`; norms and scales are f32.
//!
//! [`build`] is the one table of the model's tensors (key, shape, field): loading from a
//! checkpoint, drawing the tiny model and writing a checkpoint are each a [`Source`] it reads.

use crate::checkpoint::{
    Checkpoint, LoadError, QUANTIZATION_KEY, Residence, block_shape, dtype_of,
};
use crate::gemma4::config::{Config, Moe};
use crate::quantized::{DenseMlp, Quantize, Stored, dense_in_blocks, for_rows};
use moek_kernels::Element;
use moek_kernels::ir::DType;
use moek_kernels::ir::quant::{BlockMxfp4, BlockQ4_0, BlockQ8_0};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::borrow::Cow;
use std::path::Path;

/// `self_attn.*`: the projections in `W` or in blocks ([`crate::quantized::Scope`]).
#[derive(Debug)]
pub struct SelfAttn<'c, W: Clone> {
    pub q_proj: Stored<'c, W>,
    pub k_proj: Stored<'c, W>,
    /// Absent on `k_eq_v` layers (V is the K projection).
    pub v_proj: Option<Stored<'c, W>>,
    pub o_proj: Stored<'c, W>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

/// `router.*`.
#[derive(Debug)]
pub struct Router<'c, W: Clone> {
    /// `[E, H]`.
    pub proj: Cow<'c, [W]>,
    pub scale: Vec<f32>,
    pub per_expert_scale: Vec<f32>,
}

/// `experts.*`, in `W` or both in one quantized format ([`crate::quantized`]).
#[derive(Debug)]
pub struct Experts<'c, W: Clone> {
    /// `[E, 2F, H]`, gate rows first: the layout every MoE variant reads in place.
    pub gate_up_proj: Stored<'c, W>,
    /// `[E, H, F]`.
    pub down_proj: Stored<'c, W>,
}

/// A layer's MoE block: its router, experts and the three norms around them.
#[derive(Debug)]
pub struct MoeBlock<'c, W: Clone> {
    pub pre_feedforward_layernorm_2: Vec<f32>,
    pub post_feedforward_layernorm_1: Vec<f32>,
    pub post_feedforward_layernorm_2: Vec<f32>,
    pub router: Router<'c, W>,
    pub experts: Experts<'c, W>,
}

/// `layers.{i}.*`.
#[derive(Debug)]
pub struct DecoderLayer<'c, W: Clone> {
    pub input_layernorm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    pub pre_feedforward_layernorm: Vec<f32>,
    pub post_feedforward_layernorm: Vec<f32>,
    pub self_attn: SelfAttn<'c, W>,
    /// `mlp.*`: the dense MLP beside the experts.
    pub mlp: DenseMlp<'c, W>,
    pub moe: Option<MoeBlock<'c, W>>,
    pub layer_scalar: f32,
}

/// The whole text model.
#[derive(Debug)]
pub struct Weights<'c, W: Clone> {
    /// `[V, H]`: the embedding, and the LM head (tied); in `W` or quantized blocks.
    pub embed_tokens: Stored<'c, W>,
    /// An untied `lm_head.weight`, when the checkpoint has one.
    pub lm_head: Option<Stored<'c, W>>,
    /// The final norm (`norm.weight`).
    pub norm: Vec<f32>,
    pub layers: Vec<DecoderLayer<'c, W>>,
}

impl<W: Element> Weights<'_, W> {
    /// The LM head matrix `[V, H]`.
    pub fn head(&self) -> &Stored<'_, W> {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    /// Bytes of every weight matrix as stored (norms and scales are f32 vectors, left out).
    pub fn bytes(&self) -> usize {
        let mut stored = self.embed_tokens.bytes() + self.lm_head.as_ref().map_or(0, |h| h.bytes());
        for l in &self.layers {
            let a = &l.self_attn;
            stored += [&a.q_proj, &a.k_proj, &a.o_proj]
                .into_iter()
                .chain(&a.v_proj)
                .map(|m| m.bytes())
                .sum::<usize>();
            stored += l.mlp.bytes();
            if let Some(m) = &l.moe {
                stored += m.router.proj.len() * size_of::<W>();
                stored += m.experts.gate_up_proj.bytes() + m.experts.down_proj.bytes();
            }
        }
        stored
    }
}

/// `model.NAME` and `model.language_model.NAME` (text-only and multimodal checkpoints).
pub fn names(suffix: &str) -> Vec<String> {
    vec![
        format!("model.{suffix}"),
        format!("model.language_model.{suffix}"),
    ]
}

/// Where [`build`] gets each tensor. `names` are a tensor's checkpoint names, the one to write
/// first; `shape` what the config says it is.
pub trait Source<'c, W: Clone> {
    /// A weight matrix in `W`.
    fn matrix(&mut self, names: &[String], shape: &[usize]) -> Result<Cow<'c, [W]>, LoadError>;
    /// A norm or scale vector, in f32.
    fn vector(&mut self, names: &[String], shape: &[usize]) -> Result<Vec<f32>, LoadError>;
    /// Whether an optional tensor is present.
    fn has(&self, names: &[String]) -> bool;
    /// A matrix that may be stored quantized (the expert banks, the embedding and LM head): in
    /// `W`, or in the blocks it is stored or asked in.
    fn bank(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'c, W>, LoadError>;
    /// One of attention's projections or a dense MLP's matrices: as [`Source::bank`], asked in
    /// blocks only when the whole model is quantized and its rows are whole blocks
    /// ([`for_rows`]).
    fn linear(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'c, W>, LoadError>;
}

/// The model's tensors, in one table: what `cfg` needs, by checkpoint key and shape, read from
/// `src`; `progress` is called after each layer. (Within each kind, matrices and vectors, the
/// order is the tiny model's draw order.)
pub fn build<'c, W: Element>(
    src: &mut impl Source<'c, W>,
    cfg: &Config,
    mut progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    let (h, v, ff) = (cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size);
    let embed_tokens = src.bank(&names("embed_tokens.weight"), &[v, h])?;
    let norm = src.vector(&names("norm.weight"), &[h])?;
    let head = vec!["lm_head.weight".to_string()];
    let lm_head = match src.has(&head) {
        true => Some(src.bank(&head, &[v, h])?),
        false => None,
    };
    let mut layers = vec![];
    for (i, l) in cfg.layers.iter().enumerate() {
        let key = |s: &str| names(&format!("layers.{i}.{s}"));
        let (d, kv, nh) = (l.head_dim, l.num_key_value_heads, cfg.num_attention_heads);
        let moe = match cfg.moe {
            None => None,
            Some(Moe {
                num_experts: e,
                moe_intermediate_size: f,
                ..
            }) => Some(MoeBlock {
                pre_feedforward_layernorm_2: src
                    .vector(&key("pre_feedforward_layernorm_2.weight"), &[h])?,
                post_feedforward_layernorm_1: src
                    .vector(&key("post_feedforward_layernorm_1.weight"), &[h])?,
                post_feedforward_layernorm_2: src
                    .vector(&key("post_feedforward_layernorm_2.weight"), &[h])?,
                router: Router {
                    proj: src.matrix(&key("router.proj.weight"), &[e, h])?,
                    scale: src.vector(&key("router.scale"), &[h])?,
                    per_expert_scale: src.vector(&key("router.per_expert_scale"), &[e])?,
                },
                experts: Experts {
                    gate_up_proj: src.bank(&key("experts.gate_up_proj"), &[e, 2 * f, h])?,
                    down_proj: src.bank(&key("experts.down_proj"), &[e, h, f])?,
                },
            }),
        };
        layers.push(DecoderLayer {
            input_layernorm: src.vector(&key("input_layernorm.weight"), &[h])?,
            post_attention_layernorm: src.vector(&key("post_attention_layernorm.weight"), &[h])?,
            pre_feedforward_layernorm: src
                .vector(&key("pre_feedforward_layernorm.weight"), &[h])?,
            post_feedforward_layernorm: src
                .vector(&key("post_feedforward_layernorm.weight"), &[h])?,
            self_attn: SelfAttn {
                q_proj: src.linear(&key("self_attn.q_proj.weight"), &[nh * d, h])?,
                k_proj: src.linear(&key("self_attn.k_proj.weight"), &[kv * d, h])?,
                v_proj: match l.attention_k_eq_v {
                    true => None,
                    false => Some(src.linear(&key("self_attn.v_proj.weight"), &[kv * d, h])?),
                },
                o_proj: src.linear(&key("self_attn.o_proj.weight"), &[h, nh * d])?,
                q_norm: src.vector(&key("self_attn.q_norm.weight"), &[d])?,
                k_norm: src.vector(&key("self_attn.k_norm.weight"), &[d])?,
            },
            mlp: {
                // In blocks whole or not at all: one of odd width keeps all three in `W`.
                let blocks = dense_in_blocks(ff, h);
                let mut part = |name: &str, shape: &[usize]| {
                    let names = key(name);
                    let m = match blocks {
                        true => src.linear(&names, shape)?,
                        false => Stored::Plain(src.matrix(&names, shape)?),
                    };
                    Ok::<_, LoadError>((names[0].clone(), m))
                };
                DenseMlp::new([
                    part("mlp.gate_proj.weight", &[ff, h])?,
                    part("mlp.up_proj.weight", &[ff, h])?,
                    part("mlp.down_proj.weight", &[h, ff])?,
                ])?
            },
            moe,
            layer_scalar: src.vector(&key("layer_scalar"), &[1])?[0],
        });
        progress(i + 1);
    }
    Ok(Weights {
        embed_tokens,
        lm_head,
        norm,
        layers,
    })
}

/// Reads a checkpoint, checking names, shapes and dtypes; matrices live where `residence` says.
/// Matrices are read as stored, quantized or not; plain ones `quantize` covers are quantized as
/// they are read.
#[derive(Debug)]
pub struct FromCheckpoint<'c> {
    pub checkpoint: &'c Checkpoint,
    pub residence: Residence,
    pub quantize: Option<Quantize>,
}

impl<'c, W: Element> Source<'c, W> for FromCheckpoint<'c> {
    fn matrix(&mut self, names: &[String], shape: &[usize]) -> Result<Cow<'c, [W]>, LoadError> {
        self.checkpoint.matrix::<W>(names, shape, self.residence)
    }
    fn vector(&mut self, names: &[String], shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        self.checkpoint.f32s(names, shape)
    }
    fn has(&self, names: &[String]) -> bool {
        self.checkpoint.has(names)
    }
    fn bank(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'c, W>, LoadError> {
        let (banks, _) = Quantize::formats(self.quantize);
        crate::quantized::read_bank(self.checkpoint, names, shape, self.residence, banks)
    }
    fn linear(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'c, W>, LoadError> {
        let linears = for_rows(Quantize::formats(self.quantize).1, shape);
        crate::quantized::read_bank(self.checkpoint, names, shape, self.residence, linears)
    }
}

/// Loads every weight `cfg` needs from `ck` ([`build`] over [`FromCheckpoint`]), expert banks
/// as stored.
pub fn load<'c, W: Element>(
    ck: &'c Checkpoint,
    cfg: &Config,
    residence: Residence,
    progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    load_quantized(ck, cfg, residence, None, progress)
}

/// [`load`], the plain matrices `quantize` covers quantized as they are read (`--quantize`).
pub fn load_quantized<'c, W: Element>(
    ck: &'c Checkpoint,
    cfg: &Config,
    residence: Residence,
    quantize: Option<Quantize>,
    progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    let mut src = FromCheckpoint {
        checkpoint: ck,
        residence,
        quantize,
    };
    build(&mut src, cfg, progress)
}

/// Passes another source's tensors through and keeps each, to write them out (the weights
/// [`build`] returns from it are empty).
struct Recorder<S, W> {
    inner: S,
    tensors: Vec<(String, Vec<usize>, Data<W>)>,
}

enum Data<W> {
    Matrix(Vec<W>),
    Vector(Vec<f32>),
    /// Quantized blocks, as bytes, in the format named.
    Blocks(Vec<u8>, DType),
}

impl<'c, W: Element, S: Source<'c, W>> Source<'c, W> for Recorder<S, W> {
    fn matrix(&mut self, names: &[String], shape: &[usize]) -> Result<Cow<'c, [W]>, LoadError> {
        let m = self.inner.matrix(names, shape)?.into_owned();
        self.tensors
            .push((names[0].clone(), shape.to_vec(), Data::Matrix(m)));
        Ok(Cow::Owned(Vec::new()))
    }
    fn vector(&mut self, names: &[String], shape: &[usize]) -> Result<Vec<f32>, LoadError> {
        let v = self.inner.vector(names, shape)?;
        self.tensors
            .push((names[0].clone(), shape.to_vec(), Data::Vector(v.clone())));
        Ok(v)
    }
    fn has(&self, names: &[String]) -> bool {
        self.inner.has(names)
    }
    fn bank(&mut self, names: &[String], shape: &[usize]) -> Result<Stored<'static, W>, LoadError> {
        let m = self.inner.bank(names, shape)?;
        Ok(self.record(names, shape, m))
    }
    fn linear(
        &mut self,
        names: &[String],
        shape: &[usize],
    ) -> Result<Stored<'static, W>, LoadError> {
        let m = self.inner.linear(names, shape)?;
        Ok(self.record(names, shape, m))
    }
}

impl<S, W: Element> Recorder<S, W> {
    /// Keeps `m` (plain or in blocks) under `names[0]`; returns an empty stand-in.
    fn record(
        &mut self,
        names: &[String],
        shape: &[usize],
        m: Stored<'_, W>,
    ) -> Stored<'static, W> {
        let (stored_shape, data) = match m {
            Stored::Plain(m) => (shape.to_vec(), Data::Matrix(m.into_owned())),
            Stored::Q8_0(b) => (
                block_shape::<BlockQ8_0>(shape),
                Data::Blocks(bytemuck::cast_slice(&b).to_vec(), DType::Q8_0),
            ),
            Stored::Q4_0(b) => (
                block_shape::<BlockQ4_0>(shape),
                Data::Blocks(bytemuck::cast_slice(&b).to_vec(), DType::Q4_0),
            ),
            Stored::Mxfp4(b) => (
                block_shape::<BlockMxfp4>(shape),
                Data::Blocks(bytemuck::cast_slice(&b).to_vec(), DType::Mxfp4),
            ),
        };
        self.tensors.push((names[0].clone(), stored_shape, data));
        Stored::Plain(Cow::Owned(Vec::new()))
    }
}

/// Writes the tensors `src` gives for `cfg` to `path` as one safetensors file, under the names
/// [`load`] reads (the text-only `model.` layout; matrices in `W`, norms and scales in f32,
/// quantized expert banks as `u8` blocks with their format in the metadata). The model bench
/// writes its random weights with it to time decode from a real file; `moek quantize` writes
/// quantized checkpoints with it.
pub fn save<'c, W: Element>(
    src: impl Source<'c, W>,
    cfg: &Config,
    path: &Path,
) -> Result<(), LoadError> {
    let mut rec = Recorder {
        inner: src,
        tensors: vec![],
    };
    build(&mut rec, cfg, |_| {})?;
    let format = |why: String| LoadError::Format {
        path: path.to_path_buf(),
        why,
    };
    let mut quantization = None;
    let views = rec
        .tensors
        .iter()
        .map(|(name, shape, data)| {
            let (dtype, bytes) = match data {
                Data::Matrix(m) => (dtype_of::<W>(), bytemuck::cast_slice::<W, u8>(m)),
                Data::Vector(v) => (Dtype::F32, bytemuck::cast_slice::<f32, u8>(v)),
                Data::Blocks(b, format) => {
                    quantization = Some(*format);
                    (Dtype::U8, &b[..])
                }
            };
            match TensorView::new(dtype, shape.clone(), bytes) {
                Ok(view) => Ok((name.as_str(), view)),
                Err(e) => Err(format(format!(
                    "`{name}` does not match its config shape: {e}"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = quantization.map(|q| {
        std::collections::HashMap::from([(QUANTIZATION_KEY.to_string(), q.name().to_string())])
    });
    safetensors::serialize_to_file(views, metadata, path).map_err(|e| format(e.to_string()))
}
