//! One Gemma-4 decoder layer (docs/gemma4.md): attention, the dense MLP, and the MoE block
//! beside it (router on the CPU, experts through dispatch).

use super::config::Moe;
use super::model::Model;
use super::weights::{DecoderLayer, MoeBlock};
use crate::forward::{LayerCache, ModelError, Trace, dense_mlp, routed_experts};
use crate::ops::{self, linear, normed, rms_norm};
use crate::quantized::Stored;
use moek_kernels::Element;
use moek_kernels::ir::Activation;
use moek_kernels::ir::reference::Biases;
use std::borrow::Cow;

impl<W: Element> Model<'_, W> {
    /// One decoder layer (docs/gemma4.md); `x` is `[S, H]`.
    pub(super) fn layer(
        &self,
        i: usize,
        lw: &DecoderLayer<'_, W>,
        x: &[f32],
        positions: &[usize],
        cache: &mut LayerCache,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.cfg;
        let hd = cfg.hidden_size;
        let eps = cfg.rms_norm_eps;
        // Attention.
        let attn = self.attention(
            i,
            lw,
            &normed(x, hd, &lw.input_layernorm, eps),
            positions,
            cache,
        );
        let attn = normed(&attn, hd, &lw.post_attention_layernorm, eps);
        let h: Vec<f32> = x.iter().zip(&attn).map(|(a, b)| a + b).collect();
        // Dense MLP (a kernel).
        let m = &lw.mlp;
        let mut d = dense_mlp(
            &self.kernels,
            i,
            &normed(&h, hd, &lw.pre_feedforward_layernorm, eps),
            (hd, cfg.intermediate_size),
            m,
            Activation::GeluTanh,
            trace,
        )?;
        if let Some(mw) = &lw.moe {
            let d1 = normed(&d, hd, &mw.post_feedforward_layernorm_1, eps);
            let m = self.moe_block(i, &h, trace)?;
            let m = normed(&m, hd, &mw.post_feedforward_layernorm_2, eps);
            d = d1.iter().zip(&m).map(|(a, b)| a + b).collect();
        }
        let d = normed(&d, hd, &lw.post_feedforward_layernorm, eps);
        Ok(h.iter()
            .zip(&d)
            .map(|(a, b)| (a + b) * lw.layer_scalar)
            .collect())
    }

    /// Layer `i`'s MoE block on the residual `h` (`[S, H]`): the router, then the experts of
    /// `pre_feedforward_layernorm_2(h)` through dispatch (the forced variant, if any).
    pub fn moe_block(
        &self,
        i: usize,
        h: &[f32],
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let (hd, eps) = (self.cfg.hidden_size, self.cfg.rms_norm_eps);
        let (Some(mw), Some(moe)) = (&self.weights.layers[i].moe, self.cfg.moe) else {
            return Ok(vec![0.0; h.len()]);
        };
        let s = h.len() / hd;
        let (idx, weights) = self.route(h, mw, moe);
        let xn = normed(h, hd, &mw.pre_feedforward_layernorm_2, eps);
        let mut m = vec![0f32; s * hd];
        let shape = self.moe_shape(s, moe);
        let forced = self.kernels.variant.as_deref();
        let banks = (&mw.experts.gate_up_proj, &mw.experts.down_proj);
        let (act, routes) = (Activation::GeluTanh, (&xn[..], &idx[..], &weights[..]));
        routed_experts(
            &self.kernels,
            (i, "moe"),
            act,
            &shape,
            routes,
            (banks, Biases::default()),
            &mut m,
            forced,
            trace,
        )?;
        Ok(m)
    }

    /// The router: `rms(h) * scale * H^-0.5 -> proj -> softmax (f32) -> top-k -> renormalise ->
    /// * per_expert_scale`. Returns `idx [S, K]`, `weights [S, K]`.
    fn route(&self, h: &[f32], mw: &MoeBlock<'_, W>, moe: Moe) -> (Vec<u32>, Vec<f32>) {
        let hd = self.cfg.hidden_size;
        let mut r = h.to_vec();
        rms_norm(&mut r, hd, None, self.cfg.rms_norm_eps);
        let k = (hd as f32).powf(-0.5);
        r.chunks_mut(hd).for_each(|row| {
            row.iter_mut()
                .zip(&mw.router.scale)
                .for_each(|(v, s)| *v = *v * s * k)
        });
        let s = h.len() / hd;
        let proj = Stored::Plain(Cow::Borrowed(&mw.router.proj[..]));
        let logits = linear(&r, s, &proj, moe.num_experts, hd);
        let mut idx = Vec::with_capacity(s * moe.top_k_experts);
        let mut weights = Vec::with_capacity(s * moe.top_k_experts);
        for row in logits.chunks(moe.num_experts) {
            let p = ops::softmax(row);
            let top = &ops::top_k(&p, moe.top_k_experts);
            let sum: f32 = top.iter().map(|&e| p[e]).sum();
            for &e in top {
                idx.push(e as u32);
                weights.push(p[e] / sum * mw.router.per_expert_scale[e]);
            }
        }
        (idx, weights)
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
        let layer = &cfg.layers[i];
        let (hd, d, kv, nh, s) = (
            cfg.hidden_size,
            layer.head_dim,
            layer.num_key_value_heads,
            cfg.num_attention_heads,
            positions.len(),
        );
        let inv = ops::inv_freq(&layer.rope, d);
        // q, k and v (where the layer has its own) in one parallel loop.
        let mut mats = vec![
            (&lw.self_attn.q_proj, nh * d),
            (&lw.self_attn.k_proj, kv * d),
        ];
        mats.extend(lw.self_attn.v_proj.as_ref().map(|wv| (wv, kv * d)));
        let mut qkv = ops::linears(xn, s, &mats, hd).into_iter();
        let (mut q, k_raw) = (qkv.next().expect("q"), qkv.next().expect("k"));
        let mut v = qkv.next().unwrap_or_else(|| k_raw.clone());
        rms_norm(&mut q, d, Some(&lw.self_attn.q_norm), cfg.rms_norm_eps);
        let rotation = ops::Rotation::new(positions, &inv);
        rotation.apply(&mut q, d);
        rms_norm(&mut v, d, None, cfg.rms_norm_eps);
        let mut k = k_raw;
        rms_norm(&mut k, d, Some(&lw.self_attn.k_norm), cfg.rms_norm_eps);
        rotation.apply(&mut k, d);
        cache.append::<W>(&k, &v, positions, kv, d);
        let shape = ops::Heads {
            heads: nh,
            kv_heads: kv,
            head_dim: d,
            window: cfg.window(layer),
        };
        let o = cache.attend::<W>(shape, &q, positions, None);
        cache.keep_window(shape.window, d);
        linear(&o, s, &lw.self_attn.o_proj, hd, nh * d)
    }
}
