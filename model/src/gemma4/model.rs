//! The Gemma-4 forward pass. Attention, norms and the router run on the CPU; the dense MLP, the
//! routed experts and the LM head run as generated kernels through `moek_kernels::dispatch` on the
//! chosen backend, and every choice is recorded (`--explain` prints them). An op with no variant
//! for that backend at the model's sizes runs on the CPU, and the record says so and why. The
//! decoder layer is [`super::layer`].

use super::config::{Config, Moe};
use super::weights::Weights;
use crate::forward::{
    Cache, CacheLayout, CausalLm, Head, Kernels, LayerCache, ModelError, Trace, check_tokens,
    head_rows, step,
};
use crate::ops::rms_norm;
use moek_kernels::ir::{Activation, Function, Op};
use moek_kernels::{Element, Shape};

/// A model ready to run: config, weights and where its kernels run. It is `Sync`: several
/// generations can share one loaded model from threads, each with its own [`Cache`].
#[derive(Debug)]
pub struct Model<'c, W: Element> {
    pub cfg: Config,
    pub weights: Weights<'c, W>,
    /// Where the kernels run, from which specs, and a forced MoE variant; [`Model::new`] has the
    /// backend keep the weights resident on a device.
    pub kernels: Kernels,
}

impl<'c, W: Element> Model<'c, W> {
    /// A model whose device backend keeps its weights resident: each is uploaded on first use
    /// and read from the device by every later step. (The weights are read-only and live as
    /// long as the model, which is what [`Backend::with_resident_weights`] asks.)
    pub fn new(cfg: Config, weights: Weights<'c, W>, kernels: impl Into<Kernels>) -> Self {
        let mut kernels = kernels.into();
        kernels.backend = kernels.backend.with_resident_weights();
        Model {
            cfg,
            weights,
            kernels,
        }
    }
}

impl<W: Element> CausalLm for Model<'_, W> {
    fn context(&self) -> usize {
        self.cfg.max_position_embeddings
    }

    fn cache_layout(&self) -> Vec<CacheLayout> {
        let cfg = &self.cfg;
        cfg.layers
            .iter()
            .map(|l| CacheLayout {
                kv_heads: l.num_key_value_heads,
                head_dim: l.head_dim,
                dtype: W::DTYPE,
                window: cfg.window(l),
            })
            .collect()
    }

    fn check_variant(&self, tokens: usize) -> Result<(), ModelError> {
        let first_moe = self.weights.layers.iter().find_map(|l| l.moe.as_ref());
        let (Some(mw), Some(moe)) = (first_moe, self.cfg.moe) else {
            return Ok(());
        };
        self.kernels.check_variant(
            &mw.experts.gate_up_proj,
            Function::new(Op::ExpertFfn, Activation::GeluTanh),
            &self.moe_shape(tokens, moe),
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
        // Embedding, scaled by sqrt(H) cast to the weight dtype (as the reference does).
        let scale = round::<W>((h as f32).sqrt());
        let mut x: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| {
                let row = self.weights.embed_tokens.row(t as usize, h);
                row.into_iter().map(move |e| round::<W>(e * scale))
            })
            .collect();
        if cache.layers.is_empty() {
            cache.layers = vec![LayerCache::default(); cfg.layers.len()];
        }
        for (i, lw) in self.weights.layers.iter().enumerate() {
            x = self.layer(i, lw, &x, &positions, &mut cache.layers[i], trace)?;
        }
        cache.len += s;
        rms_norm(&mut x, h, Some(&self.weights.norm), cfg.rms_norm_eps);
        let shape = (h, cfg.vocab_size);
        let emb = self.weights.head();
        head_rows(
            &self.kernels,
            &x,
            shape,
            emb,
            cfg.final_logit_softcapping,
            head,
            trace,
        )
    }

    pub(super) fn moe_shape(&self, t: usize, moe: Moe) -> Shape {
        moe.shape(t, self.cfg.hidden_size)
    }
}

/// `v` rounded to the storage dtype and back.
pub(super) fn round<W: Element>(v: f32) -> f32 {
    Element::to_f32(<W as Element>::from_f32(v))
}
