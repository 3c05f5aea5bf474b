//! The Gemma-4 forward pass. Attention, norms and the router run on the CPU; the dense MLP, the
//! routed experts and the LM head run as generated kernels through `moek_kernels::dispatch` on the
//! chosen backend, and every choice is recorded (`--explain` prints them). An op with no variant
//! for that backend at the model's sizes runs on the CPU, and the record says so and why.

use crate::config::{Attention, Config};
use crate::ops::Float;
use crate::ops::{self, linear, normed, rms_norm, to_w};
use crate::weights::{LayerWeights, Weights};
use moek_kernels::dispatch::{self, Backend, Choice, DispatchError};
use moek_kernels::ir::Target;
use moek_kernels::{Elem, Inputs, Shape, specs};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("token {token} is outside the vocabulary of {vocab}")]
    Token { token: u32, vocab: usize },
    #[error("layer {layer}, {what}: {source}")]
    Kernel {
        layer: usize,
        what: &'static str,
        source: DispatchError,
    },
    #[error("the model has no final_logit_softcapping; the LM head kernel applies one")]
    NoSoftcap,
    #[error("empty input: at least one token is needed")]
    Empty,
}

/// Which vocabulary rows a forward computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Head {
    /// The final row only (generation): one `[V]` row, no `[S, V]` logits.
    Last,
    /// Every row (`logits --all`).
    All,
}

/// Keys and values of one layer, post-norm and post-RoPE, with their positions. Each KV head's
/// keys (and values) are one `[n, d]` run, so attention streams a head's cache front to back.
#[derive(Clone, Debug, Default)]
pub struct LayerCache {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub pos: Vec<usize>,
}

impl LayerCache {
    /// Appends rows `k`, `v` (`[s, kv, d]`) at `positions`.
    fn append(&mut self, k: &[f32], v: &[f32], positions: &[usize], kv: usize, d: usize) {
        self.k.resize(kv, Vec::new());
        self.v.resize(kv, Vec::new());
        for t in 0..positions.len() {
            for g in 0..kv {
                let at = (t * kv + g) * d..(t * kv + g + 1) * d;
                self.k[g].extend_from_slice(&k[at.clone()]);
                self.v[g].extend_from_slice(&v[at]);
            }
        }
        self.pos.extend_from_slice(positions);
    }

    /// Keeps only the last `keep` positions.
    fn keep_last(&mut self, keep: usize, d: usize) {
        let drop = self.pos.len() - keep.min(self.pos.len());
        self.pos.drain(..drop);
        for x in self.k.iter_mut().chain(&mut self.v) {
            x.drain(..drop * d);
        }
    }
}

/// A sequence's state: sliding layers keep the last `window - 1` positions, full layers all.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    pub layers: Vec<LayerCache>,
    /// Tokens processed so far.
    pub len: usize,
}

/// One recorded dispatch: where in the model and what ran, and why.
#[derive(Clone, Debug)]
pub struct Trace {
    pub layer: usize,
    pub what: &'static str,
    pub tokens: usize,
    pub choice: Choice,
    /// Wall time of the kernel call.
    pub seconds: f64,
    /// Why the model's backend could not run it, when it ran on the CPU instead.
    pub fallback: Option<String>,
}

/// A model ready to run: config, weights and where its kernels run.
#[derive(Debug)]
pub struct Model<'c, W: Float> {
    pub cfg: Config,
    pub weights: Weights<'c, W>,
    pub backend: Backend,
    /// Force this MoE variant (an ineligible one fails before any state changes).
    pub variant: Option<String>,
}

impl<W: Float> Model<'_, W> {
    /// Runs `tokens` after what `cache` holds, appending to it, and returns the logits of the
    /// final row (`Head::Last`) or of every row; with the dispatch records.
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        // Every projection and kernel below is a parallel loop: joined from a worker, not from
        // a sleeping caller (see `moek_cpu::pool`).
        moek_cpu::on_pool(|| self.forward_on_pool(tokens, cache, head, trace))
    }

    fn forward_on_pool(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let cfg = &self.cfg;
        let (h, s) = (cfg.hidden, tokens.len());
        if s == 0 {
            return Err(ModelError::Empty);
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= cfg.vocab) {
            return Err(ModelError::Token {
                token,
                vocab: cfg.vocab,
            });
        }
        let softcap = cfg.softcap.ok_or(ModelError::NoSoftcap)?;
        // A forced variant is checked before anything changes.
        if let (Some(name), Some(moe)) = (&self.variant, cfg.moe) {
            let shape = self.moe_shape(s, moe);
            dispatch::choose(
                specs::all(),
                &self.backend,
                moek_kernels::ir::Op::ExpertFfn,
                W::DTYPE,
                &shape,
                Some(name),
            )
            .map_err(|source| ModelError::Kernel {
                layer: 0,
                what: "moe",
                source,
            })?;
        }
        let positions: Vec<usize> = (cache.len..cache.len + s).collect();
        // Embedding, scaled by sqrt(H) cast to the weight dtype (as the reference does).
        let scale = round::<W>((h as f32).sqrt());
        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| {
                let row = &self.weights.embed[t as usize * h..(t as usize + 1) * h];
                row.iter()
                    .map(move |&e| round::<W>(Elem::to_f32(e) * scale))
            })
            .collect();
        if cache.layers.is_empty() {
            cache.layers = vec![LayerCache::default(); cfg.layers.len()];
        }
        for (i, lw) in self.weights.layers.iter().enumerate() {
            x = self.layer(i, lw, &x, &positions, &mut cache.layers[i], trace)?;
        }
        cache.len += s;
        rms_norm(&mut x, h, Some(&self.weights.final_norm), cfg.eps);
        let rows: Vec<usize> = match head {
            Head::Last => vec![s - 1],
            Head::All => (0..s).collect(),
        };
        rows.into_iter()
            .map(|r| {
                let hidden = to_w::<W>(&x[r * h..(r + 1) * h]);
                let shape = Shape {
                    t: 1,
                    h,
                    v: cfg.vocab,
                    ..Shape::default()
                };
                let inputs = Inputs::LmHeadRow {
                    hidden: &hidden,
                    emb: self.weights.head(),
                    softcap,
                };
                let mut logits = vec![0f32; cfg.vocab];
                self.run(
                    usize::MAX,
                    "lm_head",
                    &shape,
                    &inputs,
                    &mut logits,
                    None,
                    trace,
                )?;
                Ok(logits)
            })
            .collect()
    }

    fn moe_shape(&self, t: usize, moe: crate::config::Moe) -> Shape {
        Shape {
            t,
            r: moe.top_k,
            e: moe.experts,
            h: self.cfg.hidden,
            f: moe.intermediate,
            v: 0,
        }
    }

    /// One kernel through dispatch, recorded.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        layer: usize,
        what: &'static str,
        shape: &Shape,
        inputs: &Inputs<'_, W>,
        out: &mut [f32],
        requested: Option<&str>,
        trace: &mut Vec<Trace>,
    ) -> Result<(), ModelError> {
        let start = std::time::Instant::now();
        let err = |source| ModelError::Kernel {
            layer,
            what,
            source,
        };
        let (choice, fallback) =
            match dispatch::run(specs::all(), &self.backend, shape, inputs, out, requested) {
                Ok((choice, _)) => (choice, None),
                // No variant of this op serves the backend: the CPU runs it, and the record says
                // why. (A refused dispatch wrote nothing, so the retry starts clean.) A requested
                // variant never falls back.
                Err(e @ DispatchError::NoneEligible { .. })
                    if requested.is_none() && self.backend.target != Target::Cpu =>
                {
                    let (choice, _) =
                        dispatch::run(specs::all(), &Backend::cpu(), shape, inputs, out, None)
                            .map_err(err)?;
                    (choice, Some(e.to_string()))
                }
                Err(e) => return Err(err(e)),
            };
        trace.push(Trace {
            layer,
            what,
            tokens: shape.t,
            choice,
            seconds: start.elapsed().as_secs_f64(),
            fallback,
        });
        Ok(())
    }

    /// One decoder layer (docs/gemma4.md); `x` is `[S, H]`.
    fn layer(
        &self,
        i: usize,
        lw: &LayerWeights<'_, W>,
        x: &[f32],
        positions: &[usize],
        cache: &mut LayerCache,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<f32>, ModelError> {
        let cfg = &self.cfg;
        let (hd, s) = (cfg.hidden, positions.len());
        let eps = cfg.eps;
        // Attention.
        let attn = self.attention(i, lw, &normed(x, hd, &lw.input_norm, eps), positions, cache);
        let attn = normed(&attn, hd, &lw.post_attn_norm, eps);
        let h: Vec<f32> = x.iter().zip(&attn).map(|(a, b)| a + b).collect();
        // Dense MLP (a kernel).
        let xin = to_w::<W>(&normed(&h, hd, &lw.pre_ffn_norm, eps));
        let mut d = vec![0f32; s * hd];
        let shape = Shape {
            t: s,
            h: hd,
            f: cfg.intermediate,
            ..Shape::default()
        };
        let inputs = Inputs::DenseMlp {
            x: &xin,
            gate: &lw.gate,
            up: &lw.up,
            down: &lw.down,
        };
        self.run(i, "dense_mlp", &shape, &inputs, &mut d, None, trace)?;
        if let Some(mw) = &lw.moe {
            let d1 = normed(&d, hd, &mw.post_norm_1, eps);
            let m = self.moe_block(i, &h, trace)?;
            let m = normed(&m, hd, &mw.post_norm_2, eps);
            d = d1.iter().zip(&m).map(|(a, b)| a + b).collect();
        }
        let d = normed(&d, hd, &lw.post_ffn_norm, eps);
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
        let (hd, eps) = (self.cfg.hidden, self.cfg.eps);
        let (Some(mw), Some(moe)) = (&self.weights.layers[i].moe, self.cfg.moe) else {
            return Ok(vec![0.0; h.len()]);
        };
        let s = h.len() / hd;
        let (idx, weights) = self.route(h, mw, moe);
        let xe = to_w::<W>(&normed(h, hd, &mw.pre_norm_2, eps));
        let mut m = vec![0f32; s * hd];
        let inputs = Inputs::ExpertFfn {
            x: &xe,
            idx: &idx,
            weights: &weights,
            gate_up: &mw.gate_up,
            down: &mw.down,
        };
        let shape = self.moe_shape(s, moe);
        let forced = self.variant.as_deref();
        self.run(i, "moe", &shape, &inputs, &mut m, forced, trace)?;
        Ok(m)
    }

    /// The router: `rms(h) * scale * H^-0.5 -> proj -> softmax (f32) -> top-k -> renormalise ->
    /// * per_expert_scale`. Returns `idx [S, K]`, `weights [S, K]`.
    fn route(
        &self,
        h: &[f32],
        mw: &crate::weights::MoeWeights<'_, W>,
        moe: crate::config::Moe,
    ) -> (Vec<u32>, Vec<f32>) {
        let hd = self.cfg.hidden;
        let mut r = h.to_vec();
        rms_norm(&mut r, hd, None, self.cfg.eps);
        let k = (hd as f32).powf(-0.5);
        r.chunks_mut(hd).for_each(|row| {
            row.iter_mut()
                .zip(&mw.router_scale)
                .for_each(|(v, s)| *v = *v * s * k)
        });
        let s = h.len() / hd;
        let logits = linear(&r, s, &mw.router, moe.experts, hd);
        let mut idx = Vec::with_capacity(s * moe.top_k);
        let mut weights = Vec::with_capacity(s * moe.top_k);
        for row in logits.chunks(moe.experts) {
            let p = ops::softmax(row);
            let mut order: Vec<usize> = (0..moe.experts).collect();
            // Largest first; ties to the lower expert index (stable).
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let top = &order[..moe.top_k];
            let sum: f32 = top.iter().map(|&e| p[e]).sum();
            for &e in top {
                idx.push(e as u32);
                weights.push(p[e] / sum * mw.per_expert_scale[e]);
            }
        }
        (idx, weights)
    }

    /// Attention of the new rows `xn` (`[S, H]`, normed) against the cache and themselves.
    fn attention(
        &self,
        i: usize,
        lw: &LayerWeights<'_, W>,
        xn: &[f32],
        positions: &[usize],
        cache: &mut LayerCache,
    ) -> Vec<f32> {
        let cfg = &self.cfg;
        let layer = &cfg.layers[i];
        let (hd, d, kv, nh, s) = (
            cfg.hidden,
            layer.head_dim,
            layer.kv_heads,
            cfg.heads,
            positions.len(),
        );
        let inv = ops::inv_freq(&layer.rope, d);
        // q, k and v (where the layer has its own) in one parallel loop.
        let mut mats: Vec<(&[W], usize)> = vec![(&lw.q, nh * d), (&lw.k, kv * d)];
        mats.extend(lw.v.as_deref().map(|wv| (wv, kv * d)));
        let mut qkv = ops::linears(xn, s, &mats, hd).into_iter();
        let (mut q, k_raw) = (qkv.next().expect("q"), qkv.next().expect("k"));
        let mut v = qkv.next().unwrap_or_else(|| k_raw.clone());
        rms_norm(&mut q, d, Some(&lw.q_norm), cfg.eps);
        ops::rope(&mut q, d, positions, &inv);
        rms_norm(&mut v, d, None, cfg.eps);
        let mut k = k_raw;
        rms_norm(&mut k, d, Some(&lw.k_norm), cfg.eps);
        ops::rope(&mut k, d, positions, &inv);
        cache.append(&k, &v, positions, kv, d);
        let o = ops::attention(cfg, layer, &q, positions, &cache.k, &cache.v, &cache.pos);
        if layer.attention == Attention::Sliding {
            // Keep the last window - 1 positions: all a later query can see besides itself.
            cache.keep_last(cfg.window.saturating_sub(1), d);
        }
        linear(&o, s, &lw.o, hd, nh * d)
    }
}

/// `v` rounded to the storage dtype and back.
fn round<W: Float>(v: f32) -> f32 {
    Elem::to_f32(<W as Elem>::from_f32(v))
}
