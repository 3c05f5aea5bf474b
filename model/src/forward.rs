//! What every model family's forward pass shares: its errors, which logits it computes, the KV
//! cache, and the record of each kernel dispatch (`--explain` prints them). A family's own
//! forward lives in its module ([`crate::gemma4`]).

use crate::ops::to_w;
use crate::quantized::{DenseMlp, Stored};
use moek_kernels::backend::Uploaded;
use moek_kernels::dispatch::{self, Backend, Choice, DispatchError};
use moek_kernels::ir::DType;
use moek_kernels::ir::Target;
use moek_kernels::ir::reference::Biases;
use moek_kernels::ir::{Activation, Function};
use moek_kernels::{Element, Inputs, Registry, Shape};
use std::any::Any;
use std::sync::Arc;
use thiserror::Error;

/// Where a model's kernels run and what serves them: the backend, the registry dispatch chooses
/// from (the built-ins, or a user's specs ahead of them), and a forced MoE variant.
#[derive(Clone, Debug)]
pub struct Kernels {
    pub backend: Backend,
    pub registry: Arc<Registry>,
    /// Force this MoE variant (an ineligible one fails before any state changes).
    pub variant: Option<String>,
}

impl Kernels {
    /// The built-in specs on `backend`, no forced variant.
    pub fn new(backend: Backend) -> Kernels {
        Kernels {
            backend,
            registry: Arc::new(Registry::builtin()),
            variant: None,
        }
    }

    /// The same kernels chosen from `registry`.
    pub fn with_registry(mut self, registry: impl Into<Arc<Registry>>) -> Kernels {
        self.registry = registry.into();
        self
    }

    /// The same kernels with the MoE variant `variant` forced (none for `None`).
    pub fn with_variant(mut self, variant: Option<String>) -> Kernels {
        self.variant = variant;
        self
    }

    /// A forced MoE variant checked against what the model's banks ask of it (their storage
    /// format and block size, the family's activation) at `shape`, before anything changes: a
    /// variant that cannot serve the banks fails here, not inside layer 0 after attention has
    /// written the KV cache.
    pub(crate) fn check_variant<W: Element>(
        &self,
        banks: &Stored<'_, W>,
        function: Function,
        shape: &Shape,
    ) -> Result<(), ModelError> {
        let Some(name) = &self.variant else {
            return Ok(());
        };
        // Checkpoint banks are stored in blocks of 32 when quantized (`Storage::from` a dtype).
        dispatch::choose(
            &self.registry,
            &self.backend,
            function,
            banks.dtype(),
            shape,
            Some(name),
        )
        .map(drop)
        .map_err(|source| ModelError::Kernel {
            layer: 0,
            what: "moe",
            source,
        })
    }
}

impl From<Backend> for Kernels {
    fn from(backend: Backend) -> Kernels {
        Kernels::new(backend)
    }
}

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
    #[error("empty input: at least one token is needed")]
    Empty,
    #[error(
        "{positions} positions exceed the model's context of {context} (max_position_embeddings)"
    )]
    Context { positions: usize, context: usize },
    #[error(
        "the KV cache for {positions} positions needs {needed} bytes; {available} bytes of memory \
         are available (MemAvailable, or MOEK_MEMORY_LIMIT)"
    )]
    Memory {
        positions: usize,
        needed: u64,
        available: u64,
    },
    #[error("a prefill chunk of 0 tokens: a chunk is the prompt tokens per forward, at least 1")]
    Chunk,
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
    pub k: Runs,
    pub v: Runs,
    pub pos: Vec<usize>,
}

/// One layer's keys (or values): each KV head's `[n, d]` run in the model's type, the values
/// attention multiplies. A 16-bit model's cache holds half the bytes an f32 one would, and its
/// decode steps read half as much.
#[derive(Clone, Debug)]
pub enum Runs {
    F32(Vec<Vec<f32>>),
    F16(Vec<Vec<half::f16>>),
    Bf16(Vec<Vec<half::bf16>>),
}

impl Default for Runs {
    fn default() -> Runs {
        Runs::F32(Vec::new())
    }
}

/// `$body` with `$r` bound to `$runs`' heads, whichever type they hold.
macro_rules! each {
    ($runs:expr, $r:ident => $body:expr) => {
        match $runs {
            Runs::F32($r) => $body,
            Runs::F16($r) => $body,
            Runs::Bf16($r) => $body,
        }
    };
}

impl Runs {
    /// `kv` empty runs of `dtype` (a plain type), each with room for `values` values.
    pub fn with_room(dtype: DType, kv: usize, values: usize) -> Runs {
        // (Not `vec![..; n]`: its clones of an empty `Vec` have no capacity.)
        fn runs<T>(kv: usize, values: usize) -> Vec<Vec<T>> {
            (0..kv).map(|_| Vec::with_capacity(values)).collect()
        }
        match dtype {
            DType::F32 => Runs::F32(runs(kv, values)),
            DType::F16 => Runs::F16(runs(kv, values)),
            DType::Bf16 => Runs::Bf16(runs(kv, values)),
            d => unreachable!("a KV cache holds a plain type, not {d}"),
        }
    }

    /// The runs as `W`'s. Panics where they hold another type's values (a cache is one
    /// model's); none held reads as none of any type.
    pub fn heads<W: Element>(&self) -> &[Vec<W>] {
        match each!(self, r => r as &dyn Any).downcast_ref::<Vec<Vec<W>>>() {
            Some(r) => r,
            None if self.is_empty() => &[],
            None => panic!("a KV cache of {self:?} read as {:?}", W::KIND),
        }
    }

    /// [`Runs::heads`] to append to: runs of another type holding nothing become `W`'s.
    fn heads_mut<W: Element>(&mut self) -> &mut Vec<Vec<W>> {
        if !each!(self, r => (r as &dyn Any).is::<Vec<Vec<W>>>()) {
            assert!(
                self.is_empty(),
                "a KV cache of {self:?} appended as {:?}",
                W::KIND
            );
            *self = Runs::with_room(W::DTYPE, 0, 0);
        }
        each!(self, r => r as &mut dyn Any)
            .downcast_mut()
            .expect("the runs were made W's")
    }

    /// Whether no run holds a value.
    pub fn is_empty(&self) -> bool {
        each!(self, r => r.iter().all(Vec::is_empty))
    }

    /// Drops each run's first `values` values.
    fn drop_front(&mut self, values: usize) {
        each!(self, r => r.iter_mut().for_each(|r| drop(r.drain(..values))))
    }

    /// Where each run's values start (they move only when a run outgrows its room).
    pub fn addresses(&self) -> Vec<*const u8> {
        each!(self, r => r.iter().map(|r| r.as_ptr().cast()).collect())
    }
}

impl LayerCache {
    /// Appends rows `k`, `v` (`[s, kv, d]`) at `positions`, rounded to the model's type `W`
    /// (what [`crate::ops::attention`] multiplies them as).
    pub(crate) fn append<W: Element>(
        &mut self,
        k: &[f32],
        v: &[f32],
        positions: &[usize],
        kv: usize,
        d: usize,
    ) {
        for (runs, rows) in [(&mut self.k, k), (&mut self.v, v)] {
            let heads = runs.heads_mut::<W>();
            heads.resize(kv, Vec::new());
            for t in 0..positions.len() {
                for (g, head) in heads.iter_mut().enumerate() {
                    let at = (t * kv + g) * d;
                    head.extend(rows[at..at + d].iter().map(|&x| W::from_f32(x)));
                }
            }
        }
        self.pos.extend_from_slice(positions);
    }

    /// Attention of queries `q` at `positions` over the keys and values held
    /// ([`crate::ops::attention`]).
    pub(crate) fn attend<W: Element>(
        &self,
        shape: crate::ops::Heads,
        q: &[f32],
        positions: &[usize],
        sinks: Option<&[f32]>,
    ) -> Vec<f32> {
        let (k, v) = (self.k.heads::<W>(), self.v.heads::<W>());
        crate::ops::attention::<W>(shape, q, positions, k, v, &self.pos, sinks)
    }

    /// After a forward on a layer whose queries see `window` positions (`None`: all), drops
    /// all but the last `window - 1` (what a later query sees besides itself) once more than
    /// that plus [`slack`] are held: a drop moves every kept row to the front, so it runs once
    /// per `slack` steps, not every step. Attention sees only the window, so the older rows
    /// held meanwhile change nothing.
    pub(crate) fn keep_window(&mut self, window: Option<usize>, d: usize) {
        let Some(keep) = window.map(kept) else {
            return;
        };
        if self.pos.len() <= keep + slack(keep) {
            return;
        }
        let drop = self.pos.len() - keep;
        self.pos.drain(..drop);
        self.k.drop_front(drop * d);
        self.v.drop_front(drop * d);
    }
}

/// Positions a sliding layer keeps for later queries: its window less the query's own.
fn kept(window: usize) -> usize {
    window.saturating_sub(1)
}

/// Positions a sliding layer holds past the `keep` it needs before it drops the oldest: a
/// quarter of them, so dropping moves a layer's cache once per `keep / 4` decode steps.
fn slack(keep: usize) -> usize {
    (keep / 4).max(1)
}

/// One layer's KV cache as its family lays it out: KV heads of `head_dim` values of `dtype`
/// (the model's type) for keys and values, and the positions its queries see.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLayout {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
    /// A sliding layer's window, its query's own position included; `None`: every position.
    pub window: Option<usize>,
}

impl CacheLayout {
    /// Positions held once `positions` tokens are in: every one, or at most what a sliding
    /// layer keeps with its slack (`LayerCache::keep_window`).
    pub fn held(&self, positions: usize) -> usize {
        self.window
            .map(kept)
            .map_or(positions, |keep| positions.min(keep + slack(keep)))
    }

    /// Bytes held once `positions` tokens are in.
    pub fn bytes(&self, positions: usize) -> u64 {
        (self.held(positions) * self.kv_heads * self.head_dim * 2 * self.dtype.bytes()) as u64
    }
}

/// A sequence's state: sliding layers keep the last `window - 1` positions (and hold up to a
/// quarter of that more between drops, `LayerCache::keep_window`), full layers all.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    pub layers: Vec<LayerCache>,
    /// Tokens processed so far.
    pub len: usize,
}

impl Cache {
    /// An empty cache with room for `positions` tokens in every layer of `layout` (a sliding
    /// layer what it holds of them): appending up to them copies no row, where growing past a
    /// `Vec`'s capacity would copy the whole cache, on the first decode step after a prompt.
    pub fn with_room(layout: &[CacheLayout], positions: usize) -> Cache {
        let layers = layout
            .iter()
            .map(|l| {
                // One step's row beyond what is held: it is appended before the drop.
                let room = l.held(positions) + 1;
                let runs = || Runs::with_room(l.dtype, l.kv_heads, room * l.head_dim);
                LayerCache {
                    k: runs(),
                    v: runs(),
                    pos: Vec::with_capacity(room),
                }
            })
            .collect();
        Cache { layers, len: 0 }
    }
}

/// One recorded dispatch: where in the model and what ran, and why.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The position of the first token of the forward call it belongs to (one per step).
    pub position: usize,
    pub layer: usize,
    pub what: &'static str,
    pub tokens: usize,
    pub choice: Choice,
    /// Wall time of the kernel call.
    pub seconds: f64,
    /// Why the model's backend could not run it, when it ran on the CPU instead.
    pub fallback: Option<String>,
    /// What the call sent to the device, on a device backend.
    pub uploaded: Option<Uploaded>,
}

/// A model that runs tokens after a cache: what generation needs of a family.
pub trait CausalLm {
    /// Positions a sequence may reach.
    fn context(&self) -> usize;
    /// Each layer's KV cache.
    fn cache_layout(&self) -> Vec<CacheLayout>;

    /// Bytes the KV cache holds after `positions` tokens.
    fn cache_bytes(&self, positions: usize) -> u64 {
        self.cache_layout().iter().map(|l| l.bytes(positions)).sum()
    }

    /// An empty cache with room for `positions` tokens ([`Cache::with_room`]).
    fn cache_for(&self, positions: usize) -> Cache {
        Cache::with_room(&self.cache_layout(), positions)
    }

    /// The forced MoE variant, if any, checked against a forward of `tokens` new rows (what the
    /// banks and the family ask of it): every forward does this before anything changes, and a
    /// caller about to run many can ask it of each shape first.
    fn check_variant(&self, tokens: usize) -> Result<(), ModelError>;

    /// Runs `tokens` after what `cache` holds, appending to it, and returns the logits of the
    /// final row (`Head::Last`) or of every row; with the dispatch records.
    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        head: Head,
        trace: &mut Vec<Trace>,
    ) -> Result<Vec<Vec<f32>>, ModelError>;
}

/// What the records sent to a device in all, if any ran on one.
pub fn uploaded(trace: &[Trace]) -> Option<Uploaded> {
    trace.iter().filter_map(|t| t.uploaded).reduce(|mut a, b| {
        a += b;
        a
    })
}

/// Runs one forward call `f` on the pool (every projection and kernel in it is a parallel loop:
/// joined from a worker, not from a sleeping caller, see `moek_cpu::pool`), and marks the
/// records it adds with the position it starts from.
pub(crate) fn step<R: Send>(
    cache: &mut Cache,
    trace: &mut Vec<Trace>,
    f: impl FnOnce(&mut Cache, &mut Vec<Trace>) -> R + Send,
) -> R {
    let (from, position) = (trace.len(), cache.len);
    let out = moek_cpu::on_pool(|| f(cache, trace));
    trace[from..].iter_mut().for_each(|t| t.position = position);
    out
}

/// The rows of `table` (`[V, h]`) for `tokens`, widened to f32 (checked tokens: in the
/// vocabulary).
pub(crate) fn embed<W: Element>(table: &[W], tokens: &[u32], h: usize) -> Vec<f32> {
    tokens
        .iter()
        .flat_map(|&t| table[t as usize * h..(t as usize + 1) * h].iter())
        .map(|&e| e.to_f32())
        .collect()
}

/// What every family checks of a forward's tokens before anything changes: there are some, they
/// fit the context after what `cache` holds, and each is inside the vocabulary.
pub(crate) fn check_tokens(
    tokens: &[u32],
    cache: &Cache,
    vocab: usize,
    context: usize,
) -> Result<(), ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::Empty);
    }
    if cache.len + tokens.len() > context {
        return Err(ModelError::Context {
            positions: cache.len + tokens.len(),
            context,
        });
    }
    match tokens.iter().find(|&&t| t as usize >= vocab) {
        Some(&token) => Err(ModelError::Token { token, vocab }),
        None => Ok(()),
    }
}

/// A layer's dense MLP on the normed rows `xn` (`[S, H]`) of width `f`, through dispatch with
/// `activation`: plain, `xn` rounded to `W` for the dense kernel; in blocks, as the one expert
/// every row routes to with weight 1 ([`DenseMlp::Blocks`]).
pub(crate) fn dense_mlp<W: Element>(
    kernels: &Kernels,
    layer: usize,
    xn: &[f32],
    (h, f): (usize, usize),
    mlp: &DenseMlp<'_, W>,
    activation: Activation,
    trace: &mut Vec<Trace>,
) -> Result<Vec<f32>, ModelError> {
    let mut out = vec![0f32; xn.len()];
    let t = xn.len() / h;
    let what = "dense_mlp";
    // Through the dense kernel, the rows rounded to `W`.
    let mut dense = |gate: &[W], up: &[W], down: &[W], trace: &mut Vec<Trace>| {
        let shape = Shape {
            t,
            h,
            f,
            ..Shape::default()
        };
        let x = to_w::<W>(xn);
        let inputs = Inputs::dense_mlp(&x, gate, up, down);
        run_traced(
            kernels, layer, what, activation, &shape, &inputs, &mut out, None, trace,
        )
    };
    match mlp {
        DenseMlp::Plain {
            gate_proj,
            up_proj,
            down_proj,
        } => dense(gate_proj, up_proj, down_proj, trace)?,
        DenseMlp::Blocks {
            gate_up_proj,
            down_proj,
        } => {
            let shape = Shape {
                t,
                r: 1,
                e: 1,
                h,
                f,
                ..Shape::default()
            };
            let (idx, weights) = (vec![0u32; t], vec![1f32; t]);
            let banks = ((gate_up_proj, down_proj), Biases::default());
            let routes = (xn, &idx[..], &weights[..]);
            let at = (layer, what);
            routed_experts(
                kernels, at, activation, &shape, routes, banks, &mut out, None, trace,
            )?
        }
    }
    Ok(out)
}

/// The LM head on the rows `head` asks for of the final normed hidden states `x` (`[S, H]`):
/// each row run through dispatch against `emb` (`[V, H]`), rounded to `W` beside a plain
/// embedding, in f32 beside quantized blocks.
pub(crate) fn head_rows<W: Element>(
    kernels: &Kernels,
    x: &[f32],
    (h, vocab): (usize, usize),
    emb: &Stored<'_, W>,
    softcap: Option<f32>,
    head: Head,
    trace: &mut Vec<Trace>,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let s = x.len() / h;
    let rows: Vec<usize> = match head {
        Head::Last => vec![s - 1],
        Head::All => (0..s).collect(),
    };
    let shape = Shape {
        t: 1,
        h,
        v: vocab,
        ..Shape::default()
    };
    rows.into_iter()
        .map(|r| {
            let row = &x[r * h..(r + 1) * h];
            let mut logits = vec![0f32; vocab];
            // The LM head has no activation; the task's is the default.
            let (act, l, out) = (Activation::default(), usize::MAX, &mut logits);
            let (s, what) = (&shape, "lm_head");
            match emb {
                Stored::Plain(emb) => {
                    let hidden = to_w::<W>(row);
                    let inputs = Inputs::lm_head_row(&hidden, emb, softcap);
                    run_traced(kernels, l, what, act, s, &inputs, out, None, trace)?;
                }
                Stored::Q8_0(emb) => {
                    let hidden = row;
                    let inputs = Inputs::lm_head_row(hidden, emb, softcap);
                    run_traced_quantized(kernels, l, what, act, s, &inputs, out, None, trace)?;
                }
                Stored::Q4_0(emb) => {
                    let hidden = row;
                    let inputs = Inputs::lm_head_row(hidden, emb, softcap);
                    run_traced_quantized(kernels, l, what, act, s, &inputs, out, None, trace)?;
                }
                Stored::Mxfp4(emb) => {
                    let hidden = row;
                    let inputs = Inputs::lm_head_row(hidden, emb, softcap);
                    run_traced_quantized(kernels, l, what, act, s, &inputs, out, None, trace)?;
                }
            }
            Ok(logits)
        })
        .collect()
}

/// One kernel through dispatch on `backend`, recorded in `trace`. An op with no variant for
/// that backend at these sizes runs on the CPU, and the record says so and why; a `requested`
/// variant never falls back.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_traced<W: Element>(
    kernels: &Kernels,
    layer: usize,
    what: &'static str,
    activation: Activation,
    shape: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    requested: Option<&str>,
    trace: &mut Vec<Trace>,
) -> Result<(), ModelError> {
    let function = inputs.function(activation);
    traced(
        (layer, what),
        shape,
        out,
        requested,
        trace,
        kernels,
        |on, req, out| {
            dispatch::run_function(&kernels.registry, on, function, shape, inputs, out, req)
        },
    )
}

/// [`run_traced`] for weights in quantized blocks of `Q` (beside f32 activations).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_traced_quantized<Q: Element, A: Element>(
    kernels: &Kernels,
    layer: usize,
    what: &'static str,
    activation: Activation,
    shape: &Shape,
    inputs: &Inputs<'_, Q, A>,
    out: &mut [f32],
    requested: Option<&str>,
    trace: &mut Vec<Trace>,
) -> Result<(), ModelError> {
    let function = inputs.function(activation);
    traced(
        (layer, what),
        shape,
        out,
        requested,
        trace,
        kernels,
        |on, req, out| {
            dispatch::run_quantized(&kernels.registry, on, function, shape, inputs, out, req)
        },
    )
}

/// Routed experts over banks stored plain or quantized (one format for both), with the
/// experts' biases if they have them: `x` (`[T, H]`, f32) rounded to `W` beside plain banks and
/// beside MXFP4 in a bf16 model, as it is beside the other blocks. Every family's MoE block runs
/// its experts through this.
#[allow(clippy::too_many_arguments)]
pub(crate) fn routed_experts<W: Element>(
    kernels: &Kernels,
    (layer, what): (usize, &'static str),
    activation: Activation,
    shape: &Shape,
    (x, idx, weights): (&[f32], &[u32], &[f32]),
    (banks, biases): ((&Stored<'_, W>, &Stored<'_, W>), Biases<'_>),
    out: &mut [f32],
    requested: Option<&str>,
    trace: &mut Vec<Trace>,
) -> Result<(), ModelError> {
    fn inputs<'a, Q, A>(
        x: &'a [A],
        (idx, weights): (&'a [u32], &'a [f32]),
        gate_up: &'a [Q],
        down: &'a [Q],
        biases: Biases<'a>,
    ) -> Inputs<'a, Q, A> {
        Inputs::expert_ffn(x, idx, weights, gate_up, down).with_biases(biases)
    }
    let (b, l, a, routes) = (kernels, layer, activation, (idx, weights));
    match banks {
        (Stored::Plain(gate_up), Stored::Plain(down)) => {
            let xe = to_w::<W>(x);
            let inputs = inputs(&xe, routes, gate_up, down, biases);
            run_traced(b, l, what, a, shape, &inputs, out, requested, trace)
        }
        (Stored::Q8_0(gate_up), Stored::Q8_0(down)) => {
            let inputs = inputs(x, routes, gate_up, down, biases);
            run_traced_quantized(b, l, what, a, shape, &inputs, out, requested, trace)
        }
        (Stored::Q4_0(gate_up), Stored::Q4_0(down)) => {
            let inputs = inputs(x, routes, gate_up, down, biases);
            run_traced_quantized(b, l, what, a, shape, &inputs, out, requested, trace)
        }
        // A bf16 model's experts take its activation in bf16, as its plain banks do (and as
        // its framework computes it): beside MXFP4 that is exact on the bf16 tiles.
        (Stored::Mxfp4(gate_up), Stored::Mxfp4(down)) if W::KIND == half::bf16::KIND => {
            let xe = to_w::<half::bf16>(x);
            let inputs = inputs(&xe, routes, gate_up, down, biases);
            run_traced_quantized(b, l, what, a, shape, &inputs, out, requested, trace)
        }
        (Stored::Mxfp4(gate_up), Stored::Mxfp4(down)) => {
            let inputs = inputs(x, routes, gate_up, down, biases);
            run_traced_quantized(b, l, what, a, shape, &inputs, out, requested, trace)
        }
        (g, d) => unreachable!(
            "layer {layer}'s banks are {} and {}: a model's banks share one format",
            g.dtype(),
            d.dtype()
        ),
    }
}

/// Runs `run` on `backend` (on the CPU, recorded as a fallback, where no variant serves
/// `backend`) and records the choice.
fn traced(
    (layer, what): (usize, &'static str),
    shape: &Shape,
    out: &mut [f32],
    requested: Option<&str>,
    trace: &mut Vec<Trace>,
    kernels: &Kernels,
    run: impl Fn(
        &Backend,
        Option<&str>,
        &mut [f32],
    ) -> Result<(Choice, moek_kernels::backend::Ran), DispatchError>,
) -> Result<(), ModelError> {
    let start = std::time::Instant::now();
    let err = |source| ModelError::Kernel {
        layer,
        what,
        source,
    };
    let backend = &kernels.backend;
    let (choice, fallback, uploaded) = match run(backend, requested, out) {
        Ok((choice, ran)) => (choice, None, ran.uploaded),
        // No variant of this op serves the backend: the CPU runs it, and the record says
        // why. (A refused dispatch wrote nothing, so the retry starts clean.) A requested
        // variant never falls back.
        Err(e @ DispatchError::NoneEligible { .. })
            if requested.is_none() && backend.target != Target::Cpu =>
        {
            let (choice, _) = run(&Backend::cpu(), None, out).map_err(err)?;
            (choice, Some(e.to_string()), None)
        }
        Err(e) => return Err(err(e)),
    };
    trace.push(Trace {
        position: 0,
        layer,
        what,
        tokens: shape.t,
        choice,
        seconds: start.elapsed().as_secs_f64(),
        fallback,
        uploaded,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// A bf16 model's cache holds bf16: the values attention multiplies (each rounded once, as
    /// it goes in), in half the bytes an f32 one takes, the layout's count saying so; read as
    /// another type it panics rather than reinterpret.
    #[test]
    fn a_cache_holds_the_models_type() {
        let layout = |dtype| CacheLayout {
            kv_heads: 2,
            head_dim: 4,
            dtype,
            window: None,
        };
        assert_eq!(
            2 * layout(DType::Bf16).bytes(10),
            layout(DType::F32).bytes(10)
        );
        let mut cache = Cache::with_room(&[layout(DType::Bf16)], 3);
        let rows: Vec<f32> = (0..16).map(|i| 1.0 + i as f32 / 1000.0).collect();
        let layer = &mut cache.layers[0];
        layer.append::<bf16>(&rows, &rows, &[0, 1], 2, 4);
        let k = layer.k.heads::<bf16>();
        assert_eq!(k.len(), 2);
        // Head 1 of position 1 is rows 12..16.
        let want: Vec<bf16> = rows[12..16].iter().map(|&x| bf16::from_f32(x)).collect();
        assert_eq!(&k[1][4..], &want[..]);
        assert!(matches!(layer.v, Runs::Bf16(_)));
        let read = std::panic::catch_unwind(|| cache.layers[0].k.heads::<f32>().len());
        assert!(read.is_err(), "bf16 runs read as f32");
        // A fresh default cache takes the type of its first rows.
        let mut fresh = LayerCache::default();
        fresh.append::<bf16>(&rows[..8], &rows[..8], &[0], 2, 4);
        assert!(matches!(fresh.k, Runs::Bf16(_)));
        assert_eq!(fresh.k.heads::<bf16>()[0].len(), 4);
    }
}
