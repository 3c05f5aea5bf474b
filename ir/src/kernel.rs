//! The validated kernel IR: the one home of a spec's meaning and the only input of the emitters.
//!
//! Everything here has passed validation (`moek_dsl::check`); the emitters may rely on the invariants
//! stated on each type. The macro embeds a spec's IR as JSON so run-time tools (`moek list`,
//! `moek emit`) see exactly what the macro saw.

use crate::tensors::{Optional, Optionals};
use serde::{Deserialize, Serialize};
use std::fmt;

/// One kernel spec after validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    /// The spec's doc comment, joined.
    pub doc: String,
    pub op: Op,
    /// Every dim of the op, in the op's canonical order.
    pub dims: Vec<Dim>,
    pub dtypes: Vec<DType>,
    pub targets: Vec<Target>,
    pub schedule: Schedule,
    pub requires: Vec<Capability>,
    /// The gated activation, for ops with a gate/up pair (`act(gate) * up`). Left out of the
    /// JSON when it is the default, so specs that do not name one serialise as before.
    #[serde(default, skip_serializing_if = "Activation::is_default")]
    pub activation: Activation,
    /// The optional tensors the spec reads (the op table's rows: gpt-oss's expert biases, a dense
    /// MLP's output gate); none by default, and then left out of the JSON.
    #[serde(default, skip_serializing_if = "no_optionals")]
    pub optional: Optionals,
    /// Values per block of quantized weights (`quant_block`; one of
    /// [`crate::quant::BLOCK_SIZES`], dividing every dim a weight row runs along): 32 unless a
    /// spec declares another, and then left out of the JSON.
    #[serde(default = "default_block", skip_serializing_if = "is_default_block")]
    pub quant_block: usize,
}

fn default_block() -> usize {
    crate::quant::BLOCK
}

fn is_default_block(b: &usize) -> bool {
    *b == crate::quant::BLOCK
}

fn no_optionals(o: &Optionals) -> bool {
    o.is_empty()
}

/// What a kernel computes apart from its sizes and storage: its op, the activation of its gated
/// pair, and the optional tensors it reads. A caller asks dispatch for one; a spec serves only
/// its own ([`Kernel::function`]), compared once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function {
    pub op: Op,
    /// The default for ops without a gated pair, so functions compare by what they compute.
    pub activation: Activation,
    pub optional: Optionals,
}

impl Function {
    /// `op` with `activation` (ignored by ops without a gated pair) and no optional tensors.
    pub fn new(op: Op, activation: Activation) -> Function {
        Function {
            op,
            activation: match op.has_activation() {
                true => activation,
                false => Activation::default(),
            },
            optional: Optionals::NONE,
        }
    }

    /// The same function reading the optional tensor `o` too.
    #[must_use]
    pub fn with(mut self, o: Optional) -> Function {
        self.optional = self.optional.with(o);
        self
    }
}

/// An op alone: its default activation (gelu_tanh), as a spec that names none has it.
impl From<Op> for Function {
    fn from(op: Op) -> Self {
        Function::new(op, Activation::default())
    }
}

impl fmt::Display for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.op)?;
        if self.op.has_activation() {
            write!(f, " with {}", self.activation)?;
        }
        for o in self.optional.iter() {
            write!(f, " + {o}")?;
        }
        Ok(())
    }
}

/// The activation of a gated pair, `gated(x . Wg, x . Wu)`: `act(g) * u` for the one-argument
/// activations, both halves for a clamped SwiGLU. Adding one is this enum, its f64 definition in
/// [`crate::reference`], and one function per backend (docs/dsl.md).
///
/// `Eq` holds because the checker admits only finite parameters (no NaN), so `==` is reflexive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// `gelu_tanh(g) * u`, `gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`: Gemma's.
    #[default]
    GeluTanh,
    /// `silu(g) * u`, `silu(x) = x / (1 + exp(-x))`: Qwen3-MoE's, Mixtral's, DeepSeek's.
    Silu,
    /// gpt-oss's: `g' = min(g, limit)`, `u' = clamp(u, -limit, limit)`, then
    /// `g' * sigmoid(alpha g') * (u' + 1)`. Both parameters are finite and positive.
    SwigluClamped { limit: f32, alpha: f32 },
}

impl Eq for Activation {}

impl Activation {
    fn is_default(&self) -> bool {
        *self == Activation::default()
    }

    /// The name used in specs (without parameters).
    pub fn name(self) -> &'static str {
        match self {
            Activation::GeluTanh => "gelu_tanh",
            Activation::Silu => "silu",
            Activation::SwigluClamped { .. } => "swiglu_clamped",
        }
    }

    /// The parameters a spec must give the activation named `name`, in order; `None` for an
    /// unknown name.
    pub fn parameters(name: &str) -> Option<&'static [&'static str]> {
        match name {
            "gelu_tanh" | "silu" => Some(&[]),
            "swiglu_clamped" => Some(&["limit", "alpha"]),
            _ => None,
        }
    }

    /// The activation named `name` with its parameters' values, in [`Activation::parameters`]
    /// order.
    pub fn from_parts(name: &str, values: &[f32]) -> Option<Self> {
        match (name, values) {
            ("gelu_tanh", []) => Some(Activation::GeluTanh),
            ("silu", []) => Some(Activation::Silu),
            ("swiglu_clamped", &[limit, alpha]) => Some(Activation::SwigluClamped { limit, alpha }),
            _ => None,
        }
    }

    /// Every valid spelling, for error messages.
    pub fn valid_names() -> String {
        "gelu_tanh, silu, swiglu_clamped(limit = L, alpha = A)".to_string()
    }
}

impl fmt::Display for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Activation::SwigluClamped { limit, alpha } => {
                write!(f, "swiglu_clamped(limit = {limit}, alpha = {alpha})")
            }
            a => f.write_str(a.name()),
        }
    }
}

/// The fixed op vocabulary. A new op is a change to this crate (see docs/dsl.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `a[t,r,:] = act(x[t] . Wg[e]) * (x[t] . Wu[e])`, `e = idx[t,r]` (act: [`Activation`]).
    GateUp,
    /// `out[t,:] = sum_r w[t,r] * (a[t,r] . Wd[e])`: the down projection and its K-axis combine.
    Down,
    /// `out[t,:] = sum_r w[t,r] * down(gate_up(x[t], e), e)`: the whole routed expert FFN.
    ExpertFfn,
    /// The shared dense MLP: `down(act(x . Wg) * (x . Wu))`.
    DenseMlp,
    /// `logits = softcap(h[T-1] . Emb^T)` for the final row only, and its argmax.
    LmHeadRow,
}

/// A named dim: the op's role name (`T`, `R`, `E`, `H`, `F`, `V`) and its size if fixed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dim {
    pub name: DimName,
    /// `None` for a free dim: the variant serves any size in `min..=max`.
    pub size: Option<usize>,
    /// Smallest size a free dim serves (1 unless bounded, e.g. `T = 2..` for prefill).
    pub min: usize,
    /// Largest size a free dim serves, if bounded.
    pub max: Option<usize>,
}

impl Dim {
    /// Whether this dim serves `n`.
    pub fn admits(&self, n: usize) -> bool {
        match self.size {
            Some(s) => s == n,
            None => n >= self.min && self.max.is_none_or(|m| n <= m),
        }
    }

    /// A free dim with a bound other than the default `1..`.
    pub fn is_bounded(&self) -> bool {
        self.size.is_none() && (self.min > 1 || self.max.is_some())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DimName {
    /// Tokens.
    T,
    /// Routes per token (top-k).
    R,
    /// Experts in the bank.
    E,
    /// Hidden size.
    H,
    /// Expert (or dense MLP) intermediate width.
    F,
    /// Vocabulary.
    V,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DType {
    F16,
    Bf16,
    F32,
    /// Weights in llama.cpp's Q8_0 blocks ([`crate::quant`]), activations in f32.
    #[serde(rename = "q8_0")]
    Q8_0,
    /// Weights in llama.cpp's Q4_0 blocks ([`crate::quant`]), activations in f32.
    #[serde(rename = "q4_0")]
    Q4_0,
    /// Weights in Q8_0 blocks, activations in bf16.
    #[serde(rename = "q8_0_bf16")]
    Q8_0Bf16,
    /// Weights in Q4_0 blocks, activations in bf16.
    #[serde(rename = "q4_0_bf16")]
    Q4_0Bf16,
    /// Weights in OCP MXFP4 blocks ([`crate::quant`]), activations in f32.
    Mxfp4,
    /// Weights in MXFP4 blocks, activations in bf16.
    Mxfp4Bf16,
}

/// A block-quantized weight format ([`crate::quant`]): values in blocks under one f16 scale,
/// at the block size a spec declares. Named as specs spell it; a spec dtype pairs it with the
/// activations beside it ([`DType::quantized`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockFormat {
    Q8_0,
    Q4_0,
    /// The OCP microscaling FP4 format gpt-oss ships: 32 e2m1 values under one e8m0 scale.
    Mxfp4,
}

impl BlockFormat {
    /// Bytes one block of `block` values takes, its scale included.
    pub const fn block_bytes(self, block: usize) -> usize {
        match self {
            BlockFormat::Q8_0 => 2 + block,
            BlockFormat::Q4_0 => 2 + block / 2,
            BlockFormat::Mxfp4 => 1 + block / 2,
        }
    }

    /// The one block size the format allows, where it fixes one (MXFP4: a scale per 32 values).
    pub const fn fixed_block(self) -> Option<usize> {
        match self {
            BlockFormat::Mxfp4 => Some(crate::quant::GROUP),
            BlockFormat::Q8_0 | BlockFormat::Q4_0 => None,
        }
    }
}

/// How an op's tensors are stored: a spec dtype (plain, or weights in blocks beside an
/// activation dtype) and the values one stored weight element holds (1 plain, the block size
/// for blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Storage {
    pub dtype: DType,
    pub values: usize,
}

impl Storage {
    /// `dtype` with weights of `block` values a block (ignored, 1, for a plain dtype).
    pub fn new(dtype: DType, block: usize) -> Storage {
        let values = if dtype.is_quantized() { block } else { 1 };
        Storage { dtype, values }
    }
}

/// A dtype as specs store it by default: plain, or in blocks of 32 values.
impl From<DType> for Storage {
    fn from(dtype: DType) -> Self {
        Storage::new(dtype, crate::quant::BLOCK)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    Cpu,
    Wgpu,
    Spyre,
}

/// Backend capabilities a spec can require; dispatch checks them against the backend's set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capability {
    /// Expert banks laid out so a route can read its expert (or a block of it) in place.
    IndexedSelectionLayout,
    /// Partial sums of a reduction split across cores are completed in local memory.
    LxCompletedSum,
    /// A read of selected weights is not preceded by a copy of them.
    ReadCopyElision,
    /// 16-bit float arithmetic in shaders.
    ShaderF16,
}

/// How a spec's work is cut. Invariants (checked): blocks cover their dim exactly, splits divide
/// fixed dims, the product of each phase's core splits is at most [`MAX_CORES`], at most one
/// reduction dim is split across cores per phase.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    pub select: Selection,
    /// Reduction blocks: partial products over each block, added in declared order.
    pub reduce: Vec<Blocks>,
    /// Output column blocks: each uses the full reduction; results are concatenated.
    pub columns: Vec<Blocks>,
    /// Core splits per phase, in declared order.
    pub cores: Vec<CoreSplit>,
    /// Token groups that own x and the accumulator around a persistent loop.
    pub groups: Option<Split>,
    /// A persistent loop over this dim (always `E`): one trip per expert bank.
    pub persistent: Option<DimName>,
    /// Streaming tiles fixed by the spec (otherwise a backend picks them).
    pub stream: Vec<Tile>,
}

/// Which experts a token's work touches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selection {
    /// No expert dim (dense MLP, LM head).
    #[default]
    None,
    /// Indexed selection: each route gathers its expert's bank (or blocks of it) in place.
    Gather,
    /// Dense over experts: every expert, weighted by a dense route matrix (0 when unselected).
    Dense,
    /// Tokens grouped by expert (data-dependent group sizes), one GEMM per expert.
    Grouped,
}

/// A dim cut into ordered blocks whose sizes sum to the dim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Blocks {
    pub dim: DimName,
    pub sizes: Vec<usize>,
}

impl Blocks {
    /// `(start, end)` of each block in order.
    pub fn ranges(&self) -> Vec<(usize, usize)> {
        let mut start = 0;
        self.sizes
            .iter()
            .map(|&s| {
                let r = (start, start + s);
                start += s;
                r
            })
            .collect()
    }
}

/// A dim divided into `parts` equal parts (work units).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Split {
    pub dim: DimName,
    pub parts: usize,
}

/// Phases of an op whose core splits may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// The whole op (single-phase ops, or every phase of a multi-phase op).
    All,
    GateUp,
    Down,
}

/// A streaming tile: `size` elements of `dim` at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tile {
    pub dim: DimName,
    pub size: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoreSplit {
    pub phase: Phase,
    pub splits: Vec<Split>,
}

/// Spyre has 32 cores; no spec may ask for more on any backend (it keeps specs portable).
pub const MAX_CORES: usize = 32;

impl Kernel {
    pub fn dim(&self, name: DimName) -> Option<&Dim> {
        self.dims.iter().find(|d| d.name == name)
    }

    /// The fixed size of `name`, if the dim exists and is fixed.
    pub fn size(&self, name: DimName) -> Option<usize> {
        self.dim(name).and_then(|d| d.size)
    }

    /// Core splits that apply to `phase` (phase-specific ones, else the `All` ones).
    pub fn cores_for(&self, phase: Phase) -> &[Split] {
        let find = |p| self.schedule.cores.iter().find(|c| c.phase == p);
        find(phase)
            .or_else(|| find(Phase::All))
            .map_or(&[][..], |c| &c.splits[..])
    }

    /// Reduction blocks declared on `dim`, if any.
    pub fn reduce_blocks(&self, dim: DimName) -> Option<&Blocks> {
        self.schedule.reduce.iter().find(|b| b.dim == dim)
    }

    /// Output column blocks declared on `dim`, if any.
    pub fn column_blocks(&self, dim: DimName) -> Option<&Blocks> {
        self.schedule.columns.iter().find(|b| b.dim == dim)
    }

    /// What the spec computes: the one thing dispatch compares with what a caller asks for.
    pub fn function(&self) -> Function {
        Function {
            optional: self.optional,
            ..Function::new(self.op, self.activation)
        }
    }

    /// One line for `moek list`: name, op, dims, dtypes, targets, schedule summary.
    pub fn summary(&self) -> String {
        let dims: Vec<String> = self.dims.iter().map(Dim::to_string).collect();
        let list = |v: Vec<String>| v.join(",");
        format!(
            "{:<36} {:<11} {:<34} {:<13} {:<15} {}",
            self.name,
            self.op.to_string(),
            dims.join(" "),
            list(self.dtypes.iter().map(ToString::to_string).collect()),
            list(self.targets.iter().map(ToString::to_string).collect()),
            self.schedule_summary()
        )
    }

    /// The schedule as a spec author would read it back.
    pub fn schedule_summary(&self) -> String {
        let s = &self.schedule;
        let mut parts = vec![format!("select {}", s.select)];
        if self.activation != Activation::default() {
            parts.insert(0, format!("activation {}", self.activation));
        }
        let biases: Vec<&str> = self
            .optional
            .iter()
            .filter_map(Optional::bias_name)
            .collect();
        if !biases.is_empty() {
            parts.push(format!("biases on {}", biases.join(" and ")));
        }
        if self.optional.has(Optional::OutputGate) {
            parts.push("output_gate sigmoid".into());
        }
        if self.quant_block != crate::quant::BLOCK {
            parts.push(format!("quant_block {}", self.quant_block));
        }
        for b in &s.reduce {
            parts.push(format!("reduce {}", b));
        }
        for b in &s.columns {
            parts.push(format!("columns {}", b));
        }
        for c in &s.cores {
            let names: Vec<String> = c.splits.iter().map(|x| x.dim.to_string()).collect();
            let parts_: Vec<String> = c.splits.iter().map(|x| x.parts.to_string()).collect();
            let phase = match c.phase {
                Phase::All => String::new(),
                p => format!("({p})"),
            };
            parts.push(format!(
                "cores{phase} {}={}",
                names.join("x"),
                parts_.join("x")
            ));
        }
        if let Some(g) = s.groups {
            parts.push(format!("groups {}/{}", g.dim, g.parts));
        }
        if let Some(d) = s.persistent {
            parts.push(format!("loop {d} persistent"));
        }
        for t in &s.stream {
            parts.push(format!("stream {}={}", t.dim, t.size));
        }
        if !self.requires.is_empty() {
            let r: Vec<String> = self.requires.iter().map(ToString::to_string).collect();
            parts.push(format!("requires {}", r.join(",")));
        }
        parts.join("; ")
    }
}

macro_rules! names {
    ($ty:ident { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),*];

            /// The name used in specs.
            pub fn name(self) -> &'static str {
                match self { $($ty::$variant => $name),* }
            }

            /// Parses the name used in specs.
            pub fn from_name(s: &str) -> Option<Self> {
                match s { $($name => Some($ty::$variant),)* _ => None }
            }

            /// Every valid name, for error messages.
            pub fn valid_names() -> String {
                Self::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

names!(Op { GateUp => "gate_up", Down => "down", ExpertFfn => "expert_ffn", DenseMlp => "dense_mlp", LmHeadRow => "lm_head_row" });
names!(DimName { T => "T", R => "R", E => "E", H => "H", F => "F", V => "V" });
names!(DType {
    F16 => "f16",
    Bf16 => "bf16",
    F32 => "f32",
    Q8_0 => "q8_0",
    Q4_0 => "q4_0",
    Q8_0Bf16 => "q8_0_bf16",
    Q4_0Bf16 => "q4_0_bf16",
    Mxfp4 => "mxfp4",
    Mxfp4Bf16 => "mxfp4_bf16",
});
names!(BlockFormat { Q8_0 => "q8_0", Q4_0 => "q4_0", Mxfp4 => "mxfp4" });
names!(Target { Cpu => "cpu", Wgpu => "wgpu", Spyre => "spyre" });
names!(Capability {
    IndexedSelectionLayout => "indexed_selection_layout",
    LxCompletedSum => "lx_completed_sum",
    ReadCopyElision => "read_copy_elision",
    ShaderF16 => "shader_f16",
});
names!(Selection { None => "none", Gather => "gather", Dense => "dense", Grouped => "grouped" });
names!(Phase { All => "all", GateUp => "gate_up", Down => "down" });

impl Op {
    /// The op's dims in canonical order; a spec must declare exactly these.
    pub fn dims(self) -> &'static [DimName] {
        use DimName::*;
        match self {
            Op::GateUp | Op::Down | Op::ExpertFfn => &[T, R, E, H, F],
            Op::DenseMlp => &[T, H, F],
            Op::LmHeadRow => &[T, H, V],
        }
    }

    /// Dims summed over, per phase.
    pub fn reduction_dims(self, phase: Phase) -> &'static [DimName] {
        use DimName::*;
        match (self, phase) {
            (Op::GateUp, _) | (Op::ExpertFfn | Op::DenseMlp, Phase::GateUp) => &[H],
            (Op::Down, _) | (Op::ExpertFfn | Op::DenseMlp, Phase::Down) => &[F, R],
            (Op::ExpertFfn | Op::DenseMlp, Phase::All) => &[H, F, R],
            (Op::LmHeadRow, _) => &[H],
        }
    }

    /// The dim whose outputs column blocks may cut.
    pub fn column_dim(self) -> DimName {
        match self {
            Op::GateUp => DimName::F,
            Op::Down | Op::ExpertFfn | Op::DenseMlp => DimName::H,
            Op::LmHeadRow => DimName::V,
        }
    }

    /// Whether the op has separate gate/up and down phases (`cores(gate_up)`, `cores(down)`).
    pub fn has_phases(self) -> bool {
        matches!(self, Op::ExpertFfn | Op::DenseMlp)
    }

    /// Whether the op computes a gated pair, and so takes an `activation`.
    pub fn has_activation(self) -> bool {
        matches!(self, Op::GateUp | Op::ExpertFfn | Op::DenseMlp)
    }

    /// Dims a phase's work units may be cut along (what the emitters map onto cores).
    pub fn splittable_dims(self, select: Selection, phase: Phase) -> Vec<DimName> {
        use DimName::*;
        let of = |p: Phase| -> &'static [DimName] {
            match (self, p) {
                (Op::ExpertFfn, Phase::GateUp) if select == Selection::Dense => &[T, F, H],
                (Op::ExpertFfn, Phase::Down) if select == Selection::Dense => &[T, H, F],
                (Op::GateUp, _) => &[T, R, F, H],
                (Op::Down, _) => &[T, R, H, F],
                (Op::ExpertFfn, Phase::GateUp) => &[T, R, F, H],
                (Op::ExpertFfn, Phase::Down) => &[T, R, H, F],
                (Op::DenseMlp, Phase::GateUp) => &[T, F, H],
                (Op::DenseMlp, Phase::Down) => &[T, H, F],
                (Op::LmHeadRow, _) => &[V],
                (Op::ExpertFfn | Op::DenseMlp, Phase::All) => unreachable!("resolved below"),
            }
        };
        match (self.has_phases(), phase) {
            (true, Phase::All) => of(Phase::GateUp)
                .iter()
                .copied()
                .filter(|d| of(Phase::Down).contains(d))
                .collect(),
            _ => of(phase).to_vec(),
        }
    }

    /// Whether the op reads an expert bank (and so needs a `select`).
    pub fn uses_experts(self) -> bool {
        matches!(self, Op::GateUp | Op::Down | Op::ExpertFfn)
    }
}

impl DType {
    /// Bytes per element in device memory, for the plain dtypes (a quantized weight's storage is
    /// [`DType::block_bytes`] per block).
    pub fn bytes(self) -> usize {
        match self {
            DType::F16 | DType::Bf16 => 2,
            DType::F32 => 4,
            d => unreachable!("{d} stores blocks, not elements"),
        }
    }

    /// Whether weights of this dtype are stored in quantized blocks.
    pub fn is_quantized(self) -> bool {
        self.blocks().is_some()
    }

    /// The block format a quantized dtype stores its weights in, whatever its activations;
    /// `None` for the plain dtypes.
    pub const fn blocks(self) -> Option<BlockFormat> {
        match self {
            DType::Q8_0 | DType::Q8_0Bf16 => Some(BlockFormat::Q8_0),
            DType::Q4_0 | DType::Q4_0Bf16 => Some(BlockFormat::Q4_0),
            DType::Mxfp4 | DType::Mxfp4Bf16 => Some(BlockFormat::Mxfp4),
            DType::F16 | DType::Bf16 | DType::F32 => None,
        }
    }

    /// The dtype of weights in `blocks` beside activations `act` (`F32` or `Bf16`); `None` for
    /// other activations.
    pub const fn quantized(blocks: BlockFormat, act: DType) -> Option<DType> {
        match (blocks, act) {
            (BlockFormat::Q8_0, DType::F32) => Some(DType::Q8_0),
            (BlockFormat::Q4_0, DType::F32) => Some(DType::Q4_0),
            (BlockFormat::Q8_0, DType::Bf16) => Some(DType::Q8_0Bf16),
            (BlockFormat::Q4_0, DType::Bf16) => Some(DType::Q4_0Bf16),
            (BlockFormat::Mxfp4, DType::F32) => Some(DType::Mxfp4),
            (BlockFormat::Mxfp4, DType::Bf16) => Some(DType::Mxfp4Bf16),
            _ => None,
        }
    }

    /// Bytes one block of `block` values takes in a quantized dtype (its scale included);
    /// `None` for the plain ones.
    pub fn block_bytes(self, block: usize) -> Option<usize> {
        Some(self.blocks()?.block_bytes(block))
    }

    /// The dtype activations are in: f32 or bf16 beside quantized weights (as the dtype says),
    /// else the dtype itself.
    pub fn activation(self) -> DType {
        match self {
            DType::Q8_0 | DType::Q4_0 | DType::Mxfp4 => DType::F32,
            DType::Q8_0Bf16 | DType::Q4_0Bf16 | DType::Mxfp4Bf16 => DType::Bf16,
            d => d,
        }
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.size, self.max) {
            (Some(n), _) => write!(f, "{}={}", self.name, n),
            (None, Some(max)) => write!(f, "{}={}..={}", self.name, self.min, max),
            (None, None) if self.min > 1 => write!(f, "{}={}..", self.name, self.min),
            (None, None) => write!(f, "{}=*", self.name),
        }
    }
}

impl fmt::Display for Blocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all_same = self.sizes.windows(2).all(|w| w[0] == w[1]);
        if all_same && self.sizes.len() > 1 {
            write!(f, "{}={}x{}", self.dim, self.sizes[0], self.sizes.len())
        } else {
            let s: Vec<String> = self.sizes.iter().map(ToString::to_string).collect();
            write!(f, "{}=[{}]", self.dim, s.join(","))
        }
    }
}
