//! The gpt-oss forward pass (docs/gpt-oss.md). Per layer: `h = x + attn(rms(x))`, then
//! `h + moe(rms(h))`. Attention is GQA with biases on every projection, YaRN RoPE (half-split
//! pairs, cosines and sines scaled by the attention factor), scores scaled by `head_dim^-0.5`,
//! one learned sink logit per head in each softmax's denominator, and every other layer (the
//! first included) seeing only the `sliding_window` latest positions. The router is a linear
//! layer with a bias; its top-k logits are softmaxed among themselves. The experts are clamped
//! SwiGLU with biases on gate/up and down.

use super::config::Config;
use super::weights::{DecoderLayer, Linear, Mlp, Weights};
use crate::forward::{
    Cache, CacheLayout, CausalLm, Head, Kernels, LayerCache, ModelError, Trace, check_tokens,
    embed, head_rows, routed_experts, step,
};
use crate::ops::{self, normed, rms_norm};
use moek_kernels::Element;
use moek_kernels::ir::reference::Biases;
use moek_kernels::ir::tensors::Optional;
use moek_kernels::ir::{Function, Op};

/// A gpt-oss model ready to run (see [`crate::gemma4::model::Model`]: the same contract).
#[derive(Debug)]
pub struct Model<'c, W: Element> {
    pub cfg: Config,
    pub weights: Weights<'c, W>,
    /// Where the kernels run, from which specs, and a forced MoE variant.
    pub kernels: Kernels,
}

impl<'c, W: Element> Model<'c, W> {
    /// A model whose device backend keeps its weights resident (as Gemma-4's).
    pub fn new(cfg: Config, weights: Weights<'c, W>, kernels: impl Into<Kernels>) -> Self {
        let mut kernels = kernels.into();
        kernels.backend = kernels.backend.with_resident_weights();
        Model {
            cfg,
            weights,
            kernels,
        }
    }

    /// What the MoE layers ask dispatch for: the expert FFN with the clamped SwiGLU and both
    /// biases.
    fn moe_function(&self) -> Function {
        Function::new(Op::ExpertFfn, self.cfg.activation())
            .with(Optional::GateUpBias)
            .with(Optional::DownBias)
    }
}

impl<W: Element> CausalLm for Model<'_, W> {
    fn context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn cache_layout(&self) -> Vec<CacheLayout> {
        let c = &self.cfg;
        (0..c.layers.len())
            .map(|i| CacheLayout {
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                dtype: W::DTYPE,
                window: c.window(i),
            })
            .collect()
    }

    fn check_variant(&self, tokens: usize) -> Result<(), ModelError> {
        let Some(layer) = self.weights.layers.first() else {
            return Ok(());
        };
        let banks = &layer.mlp.experts.gate_up_proj;
        self.kernels
            .check_variant(banks, self.moe_function(), &self.cfg.moe_shape(tokens))
    }

    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        step(cache, trace, |cache, trace| {
            self.forward_on_pool(tokens, cache, head, trace)
        })
    }
}

impl<W: Element> Model<'_, W> {
    fn forward_on_pool(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cfg = &self.cfg;
        let (h, s) = (cfg.hidden_size, tokens.len());
        check_tokens(tokens, cache, cfg.vocab_size, cfg.max_position_embeddings)?;
        self.check_variant(s)?;
        let positions: Vec<usize> = (cache.len..cache.len + s).collect();
        let mut x = embed(&self.weights.embed_tokens, tokens, h);
        if cache.layers.is_empty() {
            cache.layers = vec![LayerCache::default(); cfg.layers.len()];
        }
        for (i, lw) in self.weights.layers.iter().enumerate() {
            x = self.layer(i, lw, &x, &positions, &mut cache.layers[i], trace)?;
        }
        cache.len += s;
        rms_norm(&mut x, h, Some(&self.weights.norm), cfg.rms_norm_eps);
        let shape = (h, cfg.vocab_size);
        let lm_head = self.weights.lm_head.borrowed();
        head_rows(&self.kernels, &x, shape, &lm_head, None, head, trace)
    }

    fn layer(
        &self,
        i: usize,
        lw: &DecoderLayer<'_, W>,
        x: &[f32],
        positions: &[usize],
        cache: &mut LayerCache,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let (hd, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let xn = normed(x, hd, &lw.input_layernorm, eps);
        let attn = self.attention(i, lw, &xn, positions, cache);
        let h: Vec<f32> = x.iter().zip(&attn).map(|(a, b)| a + b).collect();
        let hn = normed(&h, hd, &lw.post_attention_layernorm, eps);
        let m = self.moe_block(i, &hn, &lw.mlp, trace)?;
        Ok(h.iter().zip(&m).map(|(a, b)| a + b).collect())
    }

    /// The router and the experts of the normed residual `hn` (`[S, H]`).
    fn moe_block(
        &self,
        i: usize,
        hn: &[f32],
        mlp: &Mlp<'_, W>,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let (hd, m) = (self.cfg.hidden_size, self.cfg.moe);
        let s = hn.len() / hd;
        let logits = linear(hn, s, &mlp.router, m.num_local_experts, hd);
        let k = m.num_experts_per_tok;
        let mut idx = Vec::with_capacity(s * k);
        let mut weights = Vec::with_capacity(s * k);
        for row in logits.chunks(m.num_local_experts) {
            let top = ops::top_k(row, k);
            let chosen: Vec<f32> = top.iter().map(|&e| row[e]).collect();
            for (&e, p) in top.iter().zip(ops::softmax(&chosen)) {
                idx.push(e as u32);
                // The routing weight in the model's dtype, as transformers computes it.
                weights.push(Element::to_f32(<W as Element>::from_f32(p)));
            }
        }
        let mut out = vec![0f32; s * hd];
        let ex = &mlp.experts;
        let banks = (&ex.gate_up_proj, &ex.down_proj);
        let biases = Biases {
            gate_up: Some(&ex.gate_up_proj_bias),
            down: Some(&ex.down_proj_bias),
        };
        routed_experts(
            &self.kernels,
            (i, "moe"),
            self.cfg.activation(),
            &self.cfg.moe_shape(s),
            (hn, &idx, &weights),
            (banks, biases),
            &mut out,
            self.kernels.variant.as_deref(),
            trace,
        )?;
        Ok(out)
    }

    /// Attention of the new rows `xn` (`[S, H]`, normed) against the cache and themselves.
    fn attention(
        &self,
        i: usize,
        lw: &DecoderLayer<'_, W>,
        xn: &[f32],
        positions: &[usize],
        cache: &mut LayerCache,
    ) -> Vec<f32> {
        let cfg = &self.cfg;
        let (hd, d, kv, nh, s) = (
            cfg.hidden_size,
            cfg.head_dim,
            cfg.num_key_value_heads,
            cfg.num_attention_heads,
            positions.len(),
        );
        let a = &lw.self_attn;
        let mats = vec![
            (&a.q_proj.weight, nh * d),
            (&a.k_proj.weight, kv * d),
            (&a.v_proj.weight, kv * d),
        ];
        let mut qkv = ops::linears(xn, s, &mats, hd).into_iter();
        let (mut q, mut k, mut v) = (
            qkv.next().expect("q"),
            qkv.next().expect("k"),
            qkv.next().expect("v"),
        );
        add_bias(&mut q, &a.q_proj.bias);
        add_bias(&mut k, &a.k_proj.bias);
        add_bias(&mut v, &a.v_proj.bias);
        let inv = cfg.rope.inv_freq(d);
        let rotation = ops::Rotation::new(positions, &inv);
        rotation.apply(&mut q, d);
        rotation.apply(&mut k, d);
        // YaRN scales cosines and sines, so each rotated q and k; the score scale goes on q
        // (`ops::attention` scores with scale 1).
        let factor = cfg.rope.attention_factor as f32;
        let scale = factor * (d as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= scale);
        k.iter_mut().for_each(|x| *x *= factor);
        cache.append::<W>(&k, &v, positions, kv, d);
        let heads = ops::Heads {
            heads: nh,
            kv_heads: kv,
            head_dim: d,
            window: cfg.window(i),
        };
        let sinks = Some(&a.sinks[..]);
        let o = cache.attend::<W>(heads, &q, positions, sinks);
        cache.keep_window(heads.window, d);
        linear(&o, s, &a.o_proj, hd, nh * d)
    }
}

/// `x @ weight^T + bias` for `rows` rows of `x`.
fn linear<W: Element>(
    x: &[f32],
    rows: usize,
    l: &Linear<'_, W>,
    out: usize,
    inp: usize,
) -> Vec<f32> {
    let mut y = ops::linear(x, rows, &l.weight, out, inp);
    add_bias(&mut y, &l.bias);
    y
}

/// `bias` added to every row of `y`.
fn add_bias(y: &mut [f32], bias: &[f32]) {
    y.chunks_mut(bias.len())
        .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
}
