//! The weights of a Qwen3-MoE model, each field named after its checkpoint key
//! (`model.layers.{i}.mlp.gate.weight` is `layers[i].mlp` `Sparse(..).gate`). Each expert is
//! its own tensors in the checkpoint (`mlp.experts.{j}.gate_proj.weight`, ...); they are
//! gathered at load into the one bank layout every MoE variant reads: `gate_up_proj`
//! `[E, 2F, H]` (gate rows first) and `down_proj` `[E, H, F]`, with no second copy resident.

use super::config::{Config, Mlp as Kind};
use crate::checkpoint::{Checkpoint, LoadError, Residence};
use crate::quantized::{
    DenseMlp, Quantize, Scope, Stored, dense_in_blocks, for_rows, linear_tensor, read_bank,
};
use moek_kernels::Element;
use moek_kernels::ir::BlockFormat;
use std::borrow::Cow;

/// `self_attn.*`: the projections in `W` or in blocks ([`crate::quantized::Scope`]).
#[derive(Debug)]
pub struct SelfAttn<'c, W: Clone> {
    pub q_proj: Stored<'c, W>,
    pub k_proj: Stored<'c, W>,
    pub v_proj: Stored<'c, W>,
    pub o_proj: Stored<'c, W>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

/// The routed `mlp.*`: the router (`gate`) and the gathered expert banks.
#[derive(Debug)]
pub struct SparseMoe<'c, W: Clone> {
    /// `[E, H]`.
    pub gate: Cow<'c, [W]>,
    /// `[E, 2F, H]`, gate rows first; in `W`, or quantized at load (`--quantize`).
    pub gate_up_proj: Stored<'c, W>,
    /// `[E, H, F]`.
    pub down_proj: Stored<'c, W>,
}

/// A layer's feed-forward.
#[derive(Debug)]
pub enum Feedforward<'c, W: Clone> {
    Sparse(SparseMoe<'c, W>),
    /// A dense `mlp.*` (the layers of `mlp_only_layers`).
    Dense(DenseMlp<'c, W>),
}

/// `model.layers.{i}.*`.
#[derive(Debug)]
pub struct DecoderLayer<'c, W: Clone> {
    pub input_layernorm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    pub self_attn: SelfAttn<'c, W>,
    pub mlp: Feedforward<'c, W>,
}

/// The whole model.
#[derive(Debug)]
pub struct Weights<'c, W: Clone> {
    pub embed_tokens: Cow<'c, [W]>,
    /// `lm_head.weight`, in `W` or quantized at load; `None` when tied to the embedding (which
    /// stays in `W`).
    pub lm_head: Option<Stored<'c, W>>,
    pub norm: Vec<f32>,
    pub layers: Vec<DecoderLayer<'c, W>>,
}

impl<W: Element> Weights<'_, W> {
    /// The LM head matrix `[V, H]`.
    pub fn head(&self) -> Stored<'_, W> {
        match &self.lm_head {
            Some(head) => head.borrowed(),
            None => Stored::Plain(Cow::Borrowed(&self.embed_tokens)),
        }
    }

    /// Bytes of every matrix as stored (norms aside).
    pub fn bytes(&self) -> usize {
        let mut stored = self.lm_head.as_ref().map_or(0, |m| m.bytes());
        let mut n = self.embed_tokens.len();
        for l in &self.layers {
            let a = &l.self_attn;
            stored += [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj]
                .map(|m| m.bytes())
                .iter()
                .sum::<usize>();
            match &l.mlp {
                Feedforward::Sparse(m) => {
                    n += m.gate.len();
                    stored += m.gate_up_proj.bytes() + m.down_proj.bytes();
                }
                Feedforward::Dense(m) => stored += m.bytes(),
            }
        }
        n * size_of::<W>() + stored
    }
}

fn key(s: &str) -> Vec<String> {
    vec![s.to_string()]
}

/// Loads every weight `cfg` needs from `ck`, checking names, shapes and dtypes; `progress` is
/// called after each layer.
pub fn load<'c, W: Element>(
    ck: &'c Checkpoint,
    cfg: &Config,
    residence: Residence,
    progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    load_quantized(ck, cfg, residence, None, progress)
}

/// Whether `name` is a tensor a Qwen3-MoE checkpoint quantized to `scope` stores in blocks
/// (`moek quantize`): each expert's matrices, gathered into banks at load, an untied LM head,
/// and for the whole model attention's projections and the dense MLPs.
pub fn quantized_tensor(name: &str, scope: Scope) -> bool {
    name.contains(".mlp.experts.")
        || name == "lm_head.weight"
        || (scope == Scope::Whole && linear_tensor(name))
}

/// [`load`], the matrices `quantize` covers (the gathered expert banks, an untied LM head, and
/// for the whole model attention and the dense MLPs) quantized as they are read
/// (`--quantize`); a checkpoint `moek quantize` wrote holds them in blocks already, each
/// expert's matrices gathered as they are.
pub fn load_quantized<'c, W: Element>(
    ck: &'c Checkpoint,
    cfg: &Config,
    residence: Residence,
    quantize: Option<Quantize>,
    mut progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    let (quantize, linears) = Quantize::formats(quantize);
    let (h, v, d) = (cfg.hidden_size, cfg.vocab_size, cfg.head_dim);
    let (nh, kv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
    let matrix = |name: &str, shape: &[usize]| ck.matrix::<W>(&key(name), shape, residence);
    let linear = |name: &str, shape: &[usize]| {
        let m = read_bank(ck, &key(name), shape, residence, for_rows(linears, shape))?;
        Ok::<_, LoadError>((name.to_string(), m))
    };
    let embed_tokens = matrix("model.embed_tokens.weight", &[v, h])?;
    let lm_head = match cfg.tie_word_embeddings {
        true => None,
        false => Some(read_bank(
            ck,
            &key("lm_head.weight"),
            &[v, h],
            residence,
            quantize,
        )?),
    };
    let norm = ck.f32s(&key("model.norm.weight"), &[h])?;
    let mut layers = vec![];
    for (i, kind) in cfg.layers.iter().enumerate() {
        let k = |s: &str| format!("model.layers.{i}.{s}");
        let mlp = match kind {
            Kind::Dense => {
                let f = cfg.intermediate_size;
                // In blocks whole or not at all: one of odd width keeps all three in `W`.
                let part = |name: &str, shape: &[usize]| match dense_in_blocks(f, h) {
                    true => linear(name, shape),
                    false => Ok((name.to_string(), Stored::Plain(matrix(name, shape)?))),
                };
                Feedforward::Dense(DenseMlp::new([
                    part(&k("mlp.gate_proj.weight"), &[f, h])?,
                    part(&k("mlp.up_proj.weight"), &[f, h])?,
                    part(&k("mlp.down_proj.weight"), &[h, f])?,
                ])?)
            }
            Kind::Sparse => {
                let (e, f) = (cfg.moe.num_experts, cfg.moe.moe_intermediate_size);
                let expert = |j: usize, w: &str, shape: [usize; 2]| {
                    (
                        key(&k(&format!("mlp.experts.{j}.{w}.weight"))),
                        shape.to_vec(),
                    )
                };
                let gate_up: Vec<_> = (0..e)
                    .flat_map(|j| [expert(j, "gate_proj", [f, h]), expert(j, "up_proj", [f, h])])
                    .collect();
                let down: Vec<_> = (0..e).map(|j| expert(j, "down_proj", [h, f])).collect();
                let bank = |parts: &[(Vec<String>, Vec<usize>)]| match ck.quantized(&parts[0].0) {
                    Some(BlockFormat::Q8_0) => Ok(Stored::Q8_0(Cow::Owned(
                        ck.gather_blocks(parts, residence)?,
                    ))),
                    Some(BlockFormat::Q4_0) => Ok::<_, LoadError>(Stored::Q4_0(Cow::Owned(
                        ck.gather_blocks(parts, residence)?,
                    ))),
                    Some(BlockFormat::Mxfp4) => Ok(Stored::Mxfp4(Cow::Owned(
                        ck.gather_blocks(parts, residence)?,
                    ))),
                    None => Ok(Stored::quantize(
                        Cow::Owned(ck.gather(parts, residence)?),
                        quantize,
                    )),
                };
                Feedforward::Sparse(SparseMoe {
                    gate: matrix(&k("mlp.gate.weight"), &[e, h])?,
                    gate_up_proj: bank(&gate_up)?,
                    down_proj: bank(&down)?,
                })
            }
        };
        layers.push(DecoderLayer {
            input_layernorm: ck.f32s(&key(&k("input_layernorm.weight")), &[h])?,
            post_attention_layernorm: ck.f32s(&key(&k("post_attention_layernorm.weight")), &[h])?,
            self_attn: SelfAttn {
                q_proj: linear(&k("self_attn.q_proj.weight"), &[nh * d, h])?.1,
                k_proj: linear(&k("self_attn.k_proj.weight"), &[kv * d, h])?.1,
                v_proj: linear(&k("self_attn.v_proj.weight"), &[kv * d, h])?.1,
                o_proj: linear(&k("self_attn.o_proj.weight"), &[h, nh * d])?.1,
                q_norm: ck.f32s(&key(&k("self_attn.q_norm.weight")), &[d])?,
                k_norm: ck.f32s(&key(&k("self_attn.k_norm.weight")), &[d])?,
            },
            mlp,
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
