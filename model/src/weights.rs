//! The weights of a Gemma-4 text model, borrowed from a checkpoint (or owned, for the built-in
//! tiny model). Large matrices stay in the storage dtype `W`; norms and scales are f32.

use crate::checkpoint::{Checkpoint, LoadError, Residence};
use crate::config::{Config, Moe};
use moek_kernels::Elem;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::borrow::Cow;
use std::path::Path;

/// A layer's MoE block.
#[derive(Debug)]
pub struct MoeWeights<'c, W: Clone> {
    pub pre_norm_2: Vec<f32>,
    pub post_norm_1: Vec<f32>,
    pub post_norm_2: Vec<f32>,
    /// `[E, H]`.
    pub router: Cow<'c, [W]>,
    pub router_scale: Vec<f32>,
    pub per_expert_scale: Vec<f32>,
    /// `[E, 2F, H]`, gate rows first: the layout every MoE variant reads in place.
    pub gate_up: Cow<'c, [W]>,
    /// `[E, H, F]`.
    pub down: Cow<'c, [W]>,
}

#[derive(Debug)]
pub struct LayerWeights<'c, W: Clone> {
    pub input_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub pre_ffn_norm: Vec<f32>,
    pub post_ffn_norm: Vec<f32>,
    pub q: Cow<'c, [W]>,
    pub k: Cow<'c, [W]>,
    /// Absent on `k_eq_v` layers (V is the K projection).
    pub v: Option<Cow<'c, [W]>>,
    pub o: Cow<'c, [W]>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub gate: Cow<'c, [W]>,
    pub up: Cow<'c, [W]>,
    pub down: Cow<'c, [W]>,
    pub moe: Option<MoeWeights<'c, W>>,
    pub layer_scalar: f32,
}

#[derive(Debug)]
pub struct Weights<'c, W: Clone> {
    /// `[V, H]`: the embedding, and the LM head (tied).
    pub embed: Cow<'c, [W]>,
    /// An untied `lm_head.weight`, when the checkpoint has one.
    pub lm_head: Option<Cow<'c, [W]>>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerWeights<'c, W>>,
}

impl<W: Clone> Weights<'_, W> {
    /// The LM head matrix `[V, H]`.
    pub fn head(&self) -> &[W] {
        self.lm_head.as_deref().unwrap_or(&self.embed)
    }

    /// Bytes of every weight matrix (norms and scales are f32 vectors, left out).
    pub fn bytes(&self) -> usize {
        let mut n = self.embed.len() + self.lm_head.as_ref().map_or(0, |h| h.len());
        for l in &self.layers {
            n += [&l.q, &l.k, &l.o, &l.gate, &l.up, &l.down]
                .iter()
                .map(|m| m.len())
                .sum::<usize>();
            n += l.v.as_ref().map_or(0, |v| v.len());
            if let Some(m) = &l.moe {
                n += m.router.len() + m.gate_up.len() + m.down.len();
            }
        }
        n * std::mem::size_of::<W>()
    }
}

/// `model.NAME` and `model.language_model.NAME` (text-only and multimodal checkpoints).
pub fn names(suffix: &str) -> Vec<String> {
    vec![
        format!("model.{suffix}"),
        format!("model.language_model.{suffix}"),
    ]
}

/// Loads every weight `cfg` needs from `ck`, checking names, shapes and dtypes, the matrices
/// living where `residence` says; `progress` is called after each layer.
pub fn load<'c, W: Elem>(
    ck: &'c Checkpoint,
    cfg: &Config,
    residence: Residence,
    mut progress: impl FnMut(usize),
) -> Result<Weights<'c, W>, LoadError> {
    let (h, v) = (cfg.hidden, cfg.vocab);
    let embed = ck.matrix::<W>(&names("embed_tokens.weight"), &[v, h], residence)?;
    let head_names = vec!["lm_head.weight".to_string()];
    let lm_head = if ck.has(&head_names) {
        Some(ck.matrix::<W>(&head_names, &[v, h], residence)?)
    } else {
        None
    };
    let final_norm = ck.f32s(&names("norm.weight"), &[h])?;
    let mut layers = vec![];
    for (i, l) in cfg.layers.iter().enumerate() {
        let p = |s: &str| names(&format!("layers.{i}.{s}"));
        let norm = |s: &str| ck.f32s(&p(&format!("{s}.weight")), &[h]);
        let (d, kv, nh) = (l.head_dim, l.kv_heads, cfg.heads);
        let mat = |s: &str, shape: &[usize]| ck.matrix::<W>(&p(s), shape, residence);
        let moe = match cfg.moe {
            None => None,
            Some(Moe {
                experts: e,
                intermediate: f,
                ..
            }) => Some(MoeWeights {
                pre_norm_2: norm("pre_feedforward_layernorm_2")?,
                post_norm_1: norm("post_feedforward_layernorm_1")?,
                post_norm_2: norm("post_feedforward_layernorm_2")?,
                router: mat("router.proj.weight", &[e, h])?,
                router_scale: ck.f32s(&p("router.scale"), &[h])?,
                per_expert_scale: ck.f32s(&p("router.per_expert_scale"), &[e])?,
                gate_up: mat("experts.gate_up_proj", &[e, 2 * f, h])?,
                down: mat("experts.down_proj", &[e, h, f])?,
            }),
        };
        layers.push(LayerWeights {
            input_norm: norm("input_layernorm")?,
            post_attn_norm: norm("post_attention_layernorm")?,
            pre_ffn_norm: norm("pre_feedforward_layernorm")?,
            post_ffn_norm: norm("post_feedforward_layernorm")?,
            q: mat("self_attn.q_proj.weight", &[nh * d, h])?,
            k: mat("self_attn.k_proj.weight", &[kv * d, h])?,
            v: if l.k_eq_v {
                None
            } else {
                Some(mat("self_attn.v_proj.weight", &[kv * d, h])?)
            },
            o: mat("self_attn.o_proj.weight", &[h, nh * d])?,
            q_norm: ck.f32s(&p("self_attn.q_norm.weight"), &[d])?,
            k_norm: ck.f32s(&p("self_attn.k_norm.weight"), &[d])?,
            gate: mat("mlp.gate_proj.weight", &[cfg.intermediate, h])?,
            up: mat("mlp.up_proj.weight", &[cfg.intermediate, h])?,
            down: mat("mlp.down_proj.weight", &[h, cfg.intermediate])?,
            moe,
            layer_scalar: ck.f32s(&p("layer_scalar"), &[1])?[0],
        });
        progress(i + 1);
    }
    Ok(Weights {
        embed,
        lm_head,
        final_norm,
        layers,
    })
}

/// Writes `weights` to `path` as one safetensors file under the names [`load`] reads (the
/// text-only `model.` layout; matrices in `W`, norms and scales in f32), so that [`load`] with the
/// same `cfg` gives them back. The model bench writes its random weights with it to time decode
/// from a real file.
pub fn save<W: Elem>(weights: &Weights<'_, W>, cfg: &Config, path: &Path) -> Result<(), LoadError> {
    fn b<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
        bytemuck::cast_slice(v)
    }
    let (h, v, w, f32_) = (
        cfg.hidden,
        cfg.vocab,
        crate::checkpoint::dtype_of::<W>(),
        Dtype::F32,
    );
    let one = |s: &str| names(s).swap_remove(0);
    let mut list: Vec<(String, Dtype, Vec<usize>, &[u8])> = vec![
        (one("embed_tokens.weight"), w, vec![v, h], b(&weights.embed)),
        (one("norm.weight"), f32_, vec![h], b(&weights.final_norm)),
    ];
    if let Some(head) = &weights.lm_head {
        list.push(("lm_head.weight".into(), w, vec![v, h], b(head)));
    }
    for (i, (l, lc)) in weights.layers.iter().zip(&cfg.layers).enumerate() {
        let p = |s: &str| one(&format!("layers.{i}.{s}"));
        let (d, kv, nh, ff) = (lc.head_dim, lc.kv_heads, cfg.heads, cfg.intermediate);
        let mut norms = vec![
            ("input_layernorm", &l.input_norm),
            ("post_attention_layernorm", &l.post_attn_norm),
            ("pre_feedforward_layernorm", &l.pre_ffn_norm),
            ("post_feedforward_layernorm", &l.post_ffn_norm),
        ];
        if let Some(m) = &l.moe {
            norms.extend([
                ("pre_feedforward_layernorm_2", &m.pre_norm_2),
                ("post_feedforward_layernorm_1", &m.post_norm_1),
                ("post_feedforward_layernorm_2", &m.post_norm_2),
            ]);
        }
        for (s, n) in norms {
            list.push((p(&format!("{s}.weight")), f32_, vec![h], b(n)));
        }
        list.push((p("self_attn.q_proj.weight"), w, vec![nh * d, h], b(&l.q)));
        list.push((p("self_attn.k_proj.weight"), w, vec![kv * d, h], b(&l.k)));
        if let Some(vw) = &l.v {
            list.push((p("self_attn.v_proj.weight"), w, vec![kv * d, h], b(vw)));
        }
        list.push((p("self_attn.o_proj.weight"), w, vec![h, nh * d], b(&l.o)));
        list.push((p("self_attn.q_norm.weight"), f32_, vec![d], b(&l.q_norm)));
        list.push((p("self_attn.k_norm.weight"), f32_, vec![d], b(&l.k_norm)));
        list.push((p("mlp.gate_proj.weight"), w, vec![ff, h], b(&l.gate)));
        list.push((p("mlp.up_proj.weight"), w, vec![ff, h], b(&l.up)));
        list.push((p("mlp.down_proj.weight"), w, vec![h, ff], b(&l.down)));
        let scalar = std::slice::from_ref(&l.layer_scalar);
        list.push((p("layer_scalar"), f32_, vec![1], b(scalar)));
        if let (Some(m), Some(moe)) = (&l.moe, cfg.moe) {
            let (e, f) = (moe.experts, moe.intermediate);
            list.push((p("router.proj.weight"), w, vec![e, h], b(&m.router)));
            list.push((p("router.scale"), f32_, vec![h], b(&m.router_scale)));
            list.push((
                p("router.per_expert_scale"),
                f32_,
                vec![e],
                b(&m.per_expert_scale),
            ));
            list.push((
                p("experts.gate_up_proj"),
                w,
                vec![e, 2 * f, h],
                b(&m.gate_up),
            ));
            list.push((p("experts.down_proj"), w, vec![e, h, f], b(&m.down)));
        }
    }
    let format = |why: String| LoadError::Format {
        path: path.to_path_buf(),
        why,
    };
    let views = list
        .into_iter()
        .map(
            |(name, dtype, shape, data)| match TensorView::new(dtype, shape, data) {
                Ok(view) => Ok((name, view)),
                Err(e) => Err(format(format!(
                    "`{name}` does not match its config shape: {e}"
                ))),
            },
        )
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| format(e.to_string()))
}
