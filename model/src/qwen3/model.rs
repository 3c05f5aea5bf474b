//! The Qwen3-MoE forward pass (docs/qwen3.md). Per layer: `h = x + attn(rms(x))`, then
//! `h + mlp(rms(h))`, the MLP routed (router softmax -> top-k -> renormalised when
//! `norm_topk_prob`) or dense. Attention is GQA with RMSNorm on each head of q and k, RoPE, and
//! scores scaled by `head_dim^-0.5`; no softcap on the logits.

use super::config::Config;
use super::weights::{DecoderLayer, Feedforward, SparseMoe, Weights};
use crate::forward::{
    Cache, CacheLayout, CausalLm, Head, Kernels, LayerCache, ModelError, Trace, check_tokens,
    dense_mlp, embed, head_rows, routed_experts, step,
};
use crate::ops::{self, linear, normed, rms_norm};
use crate::quantized::Stored;
use moek_kernels::ir::reference::Biases;
use moek_kernels::ir::{Activation, Function, Op};
use moek_kernels::{Element, Shape};
use std::borrow::Cow;

/// A Qwen3-MoE model ready to run (see [`crate::gemma4::model::Model`]: the same contract).
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

    fn moe_shape(&self, t: usize) -> Shape {
        self.cfg.moe_shape(t)
    }
}

impl<W: Element> CausalLm for Model<'_, W> {
    fn context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn cache_layout(&self) -> Vec<CacheLayout> {
        let c = &self.cfg;
        let layer = CacheLayout {
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            dtype: W::DTYPE,
            window: None,
        };
        vec![layer; c.layers.len()]
    }

    fn check_variant(&self, tokens: usize) -> Result<(), ModelError> {
        let first_moe = self.weights.layers.iter().find_map(|l| match &l.mlp {
            Feedforward::Sparse(moe) => Some(&moe.gate_up_proj),
            Feedforward::Dense(_) => None,
        });
        let Some(banks) = first_moe else {
            return Ok(());
        };
        self.kernels.check_variant(
            banks,
            Function::new(Op::ExpertFfn, Activation::Silu),
            &self.moe_shape(tokens),
        )
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
        head_rows(
            &self.kernels,
            &x,
            shape,
            &self.weights.head(),
            None,
            head,
            trace,
        )
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
        let attn = self.attention(
            lw,
            &normed(x, hd, &lw.input_layernorm, eps),
            positions,
            cache,
        );
        let h: Vec<f32> = x.iter().zip(&attn).map(|(a, b)| a + b).collect();
        let hn = normed(&h, hd, &lw.post_attention_layernorm, eps);
        let m = match &lw.mlp {
            Feedforward::Sparse(moe) => self.moe_block(i, &hn, moe, trace)?,
            Feedforward::Dense(m) => dense_mlp(
                &self.kernels,
                i,
                &hn,
                (hd, self.cfg.intermediate_size),
                m,
                Activation::Silu,
                trace,
            )?,
        };
        Ok(h.iter().zip(&m).map(|(a, b)| a + b).collect())
    }

    /// The router and the experts of the normed residual `hn` (`[S, H]`).
    fn moe_block(
        &self,
        i: usize,
        hn: &[f32],
        moe: &SparseMoe<'_, W>,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let (hd, m) = (self.cfg.hidden_size, self.cfg.moe);
        let s = hn.len() / hd;
        let gate = Stored::Plain(Cow::Borrowed(&moe.gate[..]));
        let logits = linear(hn, s, &gate, m.num_experts, hd);
        let mut idx = Vec::with_capacity(s * m.num_experts_per_tok);
        let mut weights = Vec::with_capacity(s * m.num_experts_per_tok);
        for row in logits.chunks(m.num_experts) {
            let p = ops::softmax(row);
            let top = &ops::top_k(&p, m.num_experts_per_tok);
            let sum: f32 = if m.norm_topk_prob {
                top.iter().map(|&e| p[e]).sum()
            } else {
                1.0
            };
            for &e in top {
                idx.push(e as u32);
                // The routing weight in the model's dtype, as transformers casts it.
                weights.push(Element::to_f32(<W as Element>::from_f32(p[e] / sum)));
            }
        }
        let mut out = vec![0f32; s * hd];
        let shape = self.moe_shape(s);
        let forced = self.kernels.variant.as_deref();
        let banks = (&moe.gate_up_proj, &moe.down_proj);
        let (act, routes) = (Activation::Silu, (hn, &idx[..], &weights[..]));
        routed_experts(
            &self.kernels,
            (i, "moe"),
            act,
            &shape,
            routes,
            (banks, Biases::default()),
            &mut out,
            forced,
            trace,
        )?;
        Ok(out)
    }

    /// Attention of the new rows `xn` (`[S, H]`, normed) against the cache and themselves.
    fn attention(
        &self,
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
            (&a.q_proj, nh * d),
            (&a.k_proj, kv * d),
            (&a.v_proj, kv * d),
        ];
        let mut qkv = ops::linears(xn, s, &mats, hd).into_iter();
        let (mut q, mut k, v) = (
            qkv.next().expect("q"),
            qkv.next().expect("k"),
            qkv.next().expect("v"),
        );
        let inv = ops::inv_freq(&cfg.rope, d);
        rms_norm(&mut q, d, Some(&a.q_norm), cfg.rms_norm_eps);
        let rotation = ops::Rotation::new(positions, &inv);
        rotation.apply(&mut q, d);
        // The score scale, applied to the queries (`ops::attention` scores with scale 1).
        let scale = (d as f32).powf(-0.5);
        q.iter_mut().for_each(|x| *x *= scale);
        rms_norm(&mut k, d, Some(&a.k_norm), cfg.rms_norm_eps);
        rotation.apply(&mut k, d);
        cache.append::<W>(&k, &v, positions, kv, d);
        let heads = ops::Heads {
            heads: nh,
            kv_heads: kv,
            head_dim: d,
            window: None,
        };
        let o = cache.attend::<W>(heads, &q, positions, None);
        linear(&o, s, &a.o_proj, hd, nh * d)
    }
}
