//! The weights of a gpt-oss model, each field named after its checkpoint key
//! (`model.layers.{i}.mlp.router.bias` is `layers[i].mlp.router.bias`).
//!
//! The experts come in one of two layouts, and both are read into the one bank layout every
//! MoE variant reads: `gate_up_proj` `[E, 2F, H]` with the gate rows first, `down_proj`
//! `[E, H, F]`.
//! - bf16/f32 (transformers' parameters): `gate_up_proj` `[E, H, 2F]` and `down_proj` `[E, F, H]`,
//!   input by output (`x @ W`), gate and up interleaved along the output (gate even, up odd):
//!   transposed and de-interleaved at load (a copy; `--quantize` then puts it in blocks).
//! - MXFP4 (the checkpoints as shipped): `*_blocks` `[E, out, in / 32, 16]` (two e2m1 values a
//!   byte, element `2k` in byte `k`'s low nibble) beside `*_scales` `[E, out, in / 32]` (e8m0),
//!   output by input, gate and up rows interleaved: read into [`BlockMxfp4`]s (scale beside its
//!   nibbles, the nibbles reordered, the gate rows first). That is a copy too, 17/16 of the
//!   stored bytes: the kernels read a block's scale beside its values. The mapped pages of
//!   each tensor copied are released once read, so the resident set holds the copy alone.
//!
//! The experts' biases (interleaved likewise in `gate_up_proj_bias`) are f32 in every variant.

use super::config::Config;
use crate::checkpoint::{Checkpoint, LoadError, Residence};
use crate::quantized::{Quantize, Scope, Stored, for_rows, linear_tensor, read_bank};
use moek_kernels::Element;
use moek_kernels::ir::BlockFormat;
use moek_kernels::ir::quant::{BlockMxfp4, GROUP};
use rayon::prelude::*;
use safetensors::Dtype;
use std::borrow::Cow;

/// `self_attn.*`: projections with biases, and one sink logit per query head.
#[derive(Debug)]
pub struct SelfAttn<'c, W: Clone> {
    pub q_proj: Linear<'c, W>,
    pub k_proj: Linear<'c, W>,
    pub v_proj: Linear<'c, W>,
    pub o_proj: Linear<'c, W>,
    /// `[heads]`.
    pub sinks: Vec<f32>,
}

/// A projection: `weight` `[out, in]` (in `W`, or in blocks for attention's projections of a
/// model quantized whole) and `bias` `[out]`.
#[derive(Debug)]
pub struct Linear<'c, W: Clone> {
    pub weight: Stored<'c, W>,
    pub bias: Vec<f32>,
}

/// `mlp.experts.*`, in the bank layout (module doc).
#[derive(Debug)]
pub struct Experts<'c, W: Clone> {
    /// `[E, 2F, H]`, gate rows first.
    pub gate_up_proj: Stored<'c, W>,
    /// `[E, 2F]`, gate first.
    pub gate_up_proj_bias: Vec<f32>,
    /// `[E, H, F]`.
    pub down_proj: Stored<'c, W>,
    /// `[E, H]`.
    pub down_proj_bias: Vec<f32>,
}

/// `mlp.*`: the router (`[E, H]` with a bias) and the experts.
#[derive(Debug)]
pub struct Mlp<'c, W: Clone> {
    pub router: Linear<'c, W>,
    pub experts: Experts<'c, W>,
}

/// `model.layers.{i}.*`.
#[derive(Debug)]
pub struct DecoderLayer<'c, W: Clone> {
    pub input_layernorm: Vec<f32>,
    pub post_attention_layernorm: Vec<f32>,
    pub self_attn: SelfAttn<'c, W>,
    pub mlp: Mlp<'c, W>,
}

/// The whole model.
#[derive(Debug)]
pub struct Weights<'c, W: Clone> {
    pub embed_tokens: Cow<'c, [W]>,
    /// `lm_head.weight` `[V, H]` (gpt-oss does not tie it), in `W` or quantized at load.
    pub lm_head: Stored<'c, W>,
    pub norm: Vec<f32>,
    pub layers: Vec<DecoderLayer<'c, W>>,
}

impl<W: Element> Weights<'_, W> {
    /// Bytes of every matrix as stored, biases and norms aside.
    pub fn bytes(&self) -> usize {
        let mut stored = self.lm_head.bytes();
        let n = self.embed_tokens.len();
        for l in &self.layers {
            let a = &l.self_attn;
            for p in [&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj, &l.mlp.router] {
                stored += p.weight.bytes();
            }
            stored += l.mlp.experts.gate_up_proj.bytes() + l.mlp.experts.down_proj.bytes();
        }
        n * size_of::<W>() + stored
    }
}

fn key(s: &str) -> Vec<String> {
    vec![s.to_string()]
}

/// Whether `name` is a tensor `moek quantize` stores in blocks for gpt-oss: the untied LM head,
/// and for the whole model attention's projections. The experts' parameters are input by
/// output (blocks would run along the wrong extent), so they are quantized at load, after the
/// transpose (`--quantize`), or shipped in MXFP4.
pub fn quantized_tensor(name: &str, scope: Scope) -> bool {
    name == "lm_head.weight" || (scope == Scope::Whole && linear_tensor(name))
}

/// Loads every weight `cfg` needs from `ck`, checking names, shapes and dtypes; the expert
/// banks (if plain) and the LM head quantized to `quantize` as they are read; `progress` is
/// called after each layer.
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
    let (e, f) = (cfg.moe.num_local_experts, cfg.moe.intermediate_size);
    let matrix = |name: &str, shape: &[usize]| ck.matrix::<W>(&key(name), shape, residence);
    let vector = |name: &str, n: usize| ck.f32s(&key(name), &[n]);
    // `blocks`: the format a plain weight is quantized to as it is read.
    let linear = |name: &str, out: usize, inp: usize, blocks: Option<BlockFormat>| {
        let weight = key(&format!("{name}.weight"));
        Ok::<_, LoadError>(Linear {
            weight: read_bank(
                ck,
                &weight,
                &[out, inp],
                residence,
                for_rows(blocks, &[inp]),
            )?,
            bias: vector(&format!("{name}.bias"), out)?,
        })
    };
    let embed_tokens = matrix("model.embed_tokens.weight", &[v, h])?;
    let lm_head = read_bank(ck, &key("lm_head.weight"), &[v, h], residence, quantize)?;
    let norm = vector("model.norm.weight", h)?;
    let mut layers = vec![];
    for i in 0..cfg.layers.len() {
        let k = |s: &str| format!("model.layers.{i}.{s}");
        let ex = |s: &str| k(&format!("mlp.experts.{s}"));
        let (gate_up_proj, down_proj) = if ck.has(&key(&ex("gate_up_proj_blocks"))) {
            (
                Stored::Mxfp4(Cow::Owned(mxfp4_bank(
                    ck,
                    &ex("gate_up_proj"),
                    [e, 2 * f, h],
                    true,
                )?)),
                Stored::Mxfp4(Cow::Owned(mxfp4_bank(
                    ck,
                    &ex("down_proj"),
                    [e, h, f],
                    false,
                )?)),
            )
        } else {
            let gate_up = ck.tensor::<W>(&key(&ex("gate_up_proj")), &[e, h, 2 * f])?;
            let down = ck.tensor::<W>(&key(&ex("down_proj")), &[e, f, h])?;
            let banks = (
                Stored::quantize(
                    Cow::Owned(transposed(&gate_up, [e, h, 2 * f], true)),
                    quantize,
                ),
                Stored::quantize(Cow::Owned(transposed(&down, [e, f, h], false)), quantize),
            );
            ck.release_tensor(&ex("gate_up_proj"));
            ck.release_tensor(&ex("down_proj"));
            banks
        };
        let gate_up_bias = ck.f32s(&key(&ex("gate_up_proj_bias")), &[e, 2 * f])?;
        layers.push(DecoderLayer {
            input_layernorm: vector(&k("input_layernorm.weight"), h)?,
            post_attention_layernorm: vector(&k("post_attention_layernorm.weight"), h)?,
            self_attn: SelfAttn {
                q_proj: linear(&k("self_attn.q_proj"), nh * d, h, linears)?,
                k_proj: linear(&k("self_attn.k_proj"), kv * d, h, linears)?,
                v_proj: linear(&k("self_attn.v_proj"), kv * d, h, linears)?,
                o_proj: linear(&k("self_attn.o_proj"), h, nh * d, linears)?,
                sinks: vector(&k("self_attn.sinks"), nh)?,
            },
            mlp: Mlp {
                router: linear(&k("mlp.router"), e, h, None)?,
                experts: Experts {
                    gate_up_proj,
                    gate_up_proj_bias: gate_first(&gate_up_bias, e, f),
                    down_proj,
                    down_proj_bias: ck.f32s(&key(&ex("down_proj_bias")), &[e, h])?,
                },
            },
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

/// Row `r` of a bank whose `2F` rows interleave gate and up (`interleaved`) as the gate-first
/// layout orders them: row `r < F` is gate `r` (source row `2r`), row `F + j` is up `j`
/// (source row `2j + 1`); the identity otherwise.
fn source_row(r: usize, rows: usize, interleaved: bool) -> usize {
    match interleaved {
        false => r,
        true if r < rows / 2 => 2 * r,
        true => 2 * (r - rows / 2) + 1,
    }
}

/// `[E, 2F]` interleaved gate/up values, gate first.
fn gate_first(b: &[f32], e: usize, f: usize) -> Vec<f32> {
    (0..e * 2 * f)
        .map(|i| {
            let (x, r) = (i / (2 * f), i % (2 * f));
            b[x * 2 * f + source_row(r, 2 * f, true)]
        })
        .collect()
}

/// A transformers expert parameter `[E, in, out]` as the bank `[E, out, in]` (its output rows
/// gate first if `interleaved`), one output row per task.
fn transposed<W: Element>(w: &[W], [e, inp, out]: [usize; 3], interleaved: bool) -> Vec<W> {
    let mut bank: Vec<W> = moek_cpu::memory::huge_vec(e * out * inp);
    bank.par_chunks_mut(inp).enumerate().for_each(|(row, dst)| {
        let (x, r) = (row / out, row % out);
        let src = source_row(r, out, interleaved);
        let expert = &w[x * inp * out..(x + 1) * inp * out];
        for (i, v) in dst.iter_mut().enumerate() {
            *v = expert[i * out + src];
        }
    });
    bank
}

/// The MXFP4 tensors `{name}_blocks` `[E, out, in / 32, 16]` and `{name}_scales`
/// `[E, out, in / 32]` as the bank `[E, out, in]` in [`BlockMxfp4`]s, rows gate first if
/// `interleaved` (`in` is whole blocks: config sizes that are not fail the shape check).
fn mxfp4_bank(
    ck: &Checkpoint,
    name: &str,
    [e, out, inp]: [usize; 3],
    interleaved: bool,
) -> Result<Vec<BlockMxfp4>, LoadError> {
    let per_row = inp / GROUP;
    let raw = |suffix: &str, shape: Vec<usize>| {
        let tensor = format!("{name}_{suffix}");
        let (dtype, found, bytes) = ck.raw(&tensor).ok_or_else(|| LoadError::Missing {
            name: tensor.clone(),
            tried: tensor.clone(),
        })?;
        if dtype != Dtype::U8 {
            return Err(LoadError::DType {
                tensor,
                expected: "U8 (MXFP4)".into(),
                found: format!("{dtype:?}"),
            });
        }
        if found != shape {
            return Err(LoadError::Shape {
                tensor,
                expected: shape,
                found: found.to_vec(),
            });
        }
        Ok(bytes)
    };
    let blocks = raw("blocks", vec![e, out, per_row, GROUP / 2])?;
    let scales = raw("scales", vec![e, out, per_row])?;
    let mut bank: Vec<BlockMxfp4> = moek_cpu::memory::huge_vec(e * out * per_row);
    bank.par_chunks_mut(per_row)
        .enumerate()
        .for_each(|(row, dst)| {
            let (x, r) = (row / out, row % out);
            let src = x * out + source_row(r, out, interleaved);
            for (b, blk) in dst.iter_mut().enumerate() {
                let at = src * per_row + b;
                let bytes = &blocks[at * GROUP / 2..(at + 1) * GROUP / 2];
                // Value `i` is in byte `i / 2`, low nibble for even `i`.
                let nibble = |i: usize| (bytes[i / 2] >> (4 * (i % 2))) & 0x0f;
                blk.e = scales[at];
                for (j, q) in blk.qs.iter_mut().enumerate() {
                    *q = nibble(j) | (nibble(j + GROUP / 2) << 4);
                }
            }
        });
    ck.release_tensor(&format!("{name}_blocks"));
    ck.release_tensor(&format!("{name}_scales"));
    Ok(bank)
}
