//! The Spyre program format: our own SDSC-like JSON, documented in docs/spyre-program.md.
//!
//! A program is SPMD: every phase runs one op list on each of its cores, each core on its work
//! slice. Addresses are affine in the core's slice coordinates (SDSC's per-core address folds).
//! Device tensors use stick layouts (the innermost device dim is one 128-byte stick); LX buffers
//! are planned per core with addresses and live ranges; weights reach LX by DMA in whole sticks,
//! expert banks by route (indexed loads). The validator and simulator live in `moek-spyre`.

use crate::Activation;
use serde::{Deserialize, Serialize};

/// Cores on one card.
pub const CORES: usize = 32;
/// Bytes of one stick, the unit of every device-memory <-> LX transfer.
pub const STICK_BYTES: usize = 128;
/// Elements of a 16-bit type (DL16 on the device) in one stick.
pub const STICK_ELEMS: usize = STICK_BYTES / 2;
/// LX bytes a core may plan: 2 MiB less the ~20% the backend reserves.
pub const LX_BUDGET: usize = 2 * 1024 * 1024 * 8 / 10;
/// Bytes of one device element (DL16).
pub const ELEM_BYTES: usize = 2;
/// Bytes of one f32 accumulator element.
pub const ACC_BYTES: usize = 4;

/// One kernel's program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Program {
    pub kernel: String,
    /// Host dtype of the weights and activations (f16 or bf16, both DL16 on the device).
    pub dtype: String,
    /// Cores any phase uses (SDSC numCoresUsed_).
    pub cores_used: usize,
    /// LX bytes each core may plan.
    pub lx_budget: usize,
    pub tensors: Vec<Tensor>,
    pub phases: Vec<Stage>,
}

/// What a device tensor holds, for the runtime that binds host data to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceRole {
    /// Activations in, `[T, H]` (or `[T, R, F]` for down).
    Input,
    /// Route indices `[T, R]` (int32 on the device).
    Routes,
    /// Route weights `[T, R]` (f32).
    RouteWeights,
    /// Dense routing `[T, E]`, one 64-lane stick per (token, expert) scalar.
    DenseRoutes,
    /// An expert bank in its stick layout.
    Bank,
    /// The result.
    Output,
    /// Device scratch between phases.
    Scratch,
}

/// A device tensor. `shape` is logical and row-major; on the device the last dim is split into
/// sticks: `[.., last/stick_elems (padded), stick_elems]`, sticks outermost (docs/spyre-program.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    pub name: String,
    pub role: DeviceRole,
    pub shape: Vec<usize>,
    /// Bytes per element on the device: 2 (DL16) or 4 (f32, int32).
    pub elem_bytes: usize,
    /// Elements per stick: 128 / elem_bytes.
    pub stick_elems: usize,
    /// Device address of the first byte.
    pub base: u64,
}

/// One phase: a work division and the op list every core of it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stage {
    pub name: String,
    /// Work slices per dim (SDSC numWkSlicesPerDim_): `[("R", 8), ("H", 4)]`.
    pub slices: Vec<(String, usize)>,
    /// Core id -> slice coordinates, one per dim of `slices` (SDSC coreIdToWkSlice_).
    pub core_slice: Vec<Vec<usize>>,
    /// Groups of slice dims that each form one work division of the phase's cores (each disjoint
    /// and covering); empty means all of `slices` form one. Slice dims outside every group are
    /// derived coordinates (e.g. which half of a gate/up token slice a down slice is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub divisions: Vec<Vec<String>>,
    /// The per-core LX plan (the same on every core).
    pub buffers: Vec<Buffer>,
    pub body: Vec<Instr>,
    /// Bytes of selected expert weights the device's compiler copies before this phase reads
    /// them: a selection of a whole (unblocked) bank matrix is materialized, a blocked one is
    /// read in place (docs/spyre-program.md, "Selected-weight copies"). The program's own reads
    /// are by route, of the same values; the copy is charged its bytes, read and written once.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub selected_copy: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// An LX buffer of one core: `bytes` at `addr`, live from op `live.0` to op `live.1` (inclusive,
/// indices into the phase's flattened op list).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub name: String,
    pub addr: usize,
    pub bytes: usize,
    /// Elements and their device type: DL16 buffers round on write in DL16 mode.
    pub elems: usize,
    pub dl16: bool,
    pub live: (usize, usize),
}

/// `value = constant + sum(coeff * slice[dim])` (+ `trip * per_trip` inside a loop).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Affine {
    pub constant: usize,
    pub terms: Vec<(String, usize)>,
}

/// A rectangular block of a tensor: start (per dim, affine) and extent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Region {
    pub tensor: String,
    pub start: Vec<Affine>,
    pub extent: Vec<usize>,
}

/// Which route an indexed load follows: slot `token * R + route` of the `Routes` tensor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteRef {
    pub routes: String,
    pub slot: Affine,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Instr {
    /// Device -> LX, whole sticks: `region` into buffer `to` (row-major over the region).
    DmaIn { region: Region, to: String },
    /// Device -> LX by route: `region` of expert `routes[slot]` of bank `region.tensor` (whose
    /// first dim is the expert).
    IndexedLoad {
        region: Region,
        route: RouteRef,
        to: String,
    },
    /// LX -> device, whole sticks. Only cores whose slice coordinates match every `owner` entry
    /// write (the others hold the same completed values).
    DmaOut {
        from: String,
        region: Region,
        owner: Vec<(String, usize)>,
    },
    /// "pt": `out[m, n] (+)= a[a_at + (m, k)] . b[k, n]`, f32 accumulation.
    Matmul {
        a: String,
        #[serde(default)]
        a_at: Affine,
        b: String,
        out: String,
        m: usize,
        k: usize,
        n: usize,
        accumulate: bool,
    },
    /// "sfp": elementwise, activation, scaling, reduction.
    Sfp(Sfp),
    /// Ring: the completed sum of `buffer` over the cores that differ only in slice dim `dim`,
    /// added in slice order; every such core ends with the sum.
    RingReduce {
        buffer: String,
        dim: String,
        elems: usize,
    },
    /// A counted loop: `trips` times, with operands that advance by `stride` elements of their
    /// first dim per trip (an expert bank per trip). `preheader` runs once before, `drain` after.
    Loop {
        trips: usize,
        advancing: Vec<Advance>,
        preheader: Vec<Instr>,
        body: Vec<Instr>,
        drain: Vec<Instr>,
    },
}

/// An operand of a loop that advances per trip.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advance {
    pub tensor: String,
    /// Elements of the tensor's first dim per trip.
    pub per_trip: usize,
}

/// Elementwise ops on the SFU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sfp {
    /// `out = 0` over `elems`.
    Zero { out: String, elems: usize },
    /// `acc += part` over `elems` (a partial added in declared order).
    Add {
        acc: String,
        part: String,
        elems: usize,
    },
    /// `out[i] = gelu_tanh(g[i]) * u[i]`.
    GeluMul {
        g: String,
        u: String,
        out: String,
        elems: usize,
    },
    /// `out[i] = silu(g[i]) * u[i]`.
    SiluMul {
        g: String,
        u: String,
        out: String,
        elems: usize,
    },
    /// `out[i] = swiglu_clamped(g[i], u[i])` with the spec's `limit` and `alpha`: the clamps,
    /// the sigmoid and the products in one SFU pass, as the two 1-argument ops are.
    SwigluClampedMul {
        g: String,
        u: String,
        out: String,
        elems: usize,
        limit: f32,
        alpha: f32,
    },
    /// `acc[acc_at + i] += w[w_at] * y[y_at + i]` for `i < elems`: one route's weighted result
    /// added to the token's accumulator (the K-axis combine), `w` a buffer of route weights.
    ScaleAcc {
        acc: String,
        acc_at: usize,
        y: String,
        #[serde(default)]
        y_at: usize,
        w: String,
        w_at: Affine,
        elems: usize,
    },
}

impl Instr {
    /// Calls `f` on every instruction of `body` in program order, a loop's own instruction
    /// before its preheader, body and drain (each once, not once per trip).
    pub fn each<'a>(body: &'a [Instr], f: &mut impl FnMut(&'a Instr)) {
        for i in body {
            f(i);
            if let Instr::Loop {
                preheader,
                body,
                drain,
                ..
            } = i
            {
                for part in [preheader, body, drain] {
                    Instr::each(part, f);
                }
            }
        }
    }
}

impl Affine {
    pub fn constant(c: usize) -> Self {
        Affine {
            constant: c,
            terms: vec![],
        }
    }

    pub fn of(dim: &str, coeff: usize) -> Self {
        Affine {
            constant: 0,
            terms: vec![(dim.to_string(), coeff)],
        }
    }

    pub fn plus(mut self, dim: &str, coeff: usize) -> Self {
        self.terms.push((dim.to_string(), coeff));
        self
    }

    /// The value for a core whose slice coordinates are `slice` (named by `dims`).
    /// Saturating: a program's numbers are untrusted until validated, and a sum past `usize`
    /// is out of every bound the validator checks it against.
    pub fn eval(&self, dims: &[(String, usize)], slice: &[usize]) -> usize {
        self.terms.iter().fold(self.constant, |acc, (d, c)| {
            let i = dims.iter().position(|(n, _)| n == d).unwrap_or(usize::MAX);
            acc.saturating_add(c.saturating_mul(slice.get(i).copied().unwrap_or(0)))
        })
    }
}

impl Tensor {
    /// Bytes on the device, the last dim padded to whole sticks.
    pub fn device_bytes(&self) -> usize {
        let (last, outer) = self
            .shape
            .split_last()
            .map_or((1, &[][..]), |(l, o)| (*l, o));
        outer.iter().product::<usize>()
            * last.div_ceil(self.stick_elems)
            * self.stick_elems
            * self.elem_bytes
    }
}

impl Program {
    pub fn tensor(&self, name: &str) -> Option<&Tensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

impl Stage {
    pub fn buffer(&self, name: &str) -> Option<&Buffer> {
        self.buffers.iter().find(|b| b.name == name)
    }
}

impl Sfp {
    /// `out[i] = act(g[i]) * u[i]` over `elems`: the gated pair's op for the activation `act`
    /// (one SFU op per activation, as the device names them).
    pub fn act_mul(act: Activation, g: String, u: String, out: String, elems: usize) -> Sfp {
        match act {
            Activation::GeluTanh => Sfp::GeluMul { g, u, out, elems },
            Activation::Silu => Sfp::SiluMul { g, u, out, elems },
            Activation::SwigluClamped { limit, alpha } => Sfp::SwigluClampedMul {
                g,
                u,
                out,
                elems,
                limit,
                alpha,
            },
        }
    }

    /// The activation of a gated-pair op ([`Sfp::act_mul`]'s), `None` for the others.
    pub fn activation(&self) -> Option<Activation> {
        match self {
            Sfp::GeluMul { .. } => Some(Activation::GeluTanh),
            Sfp::SiluMul { .. } => Some(Activation::Silu),
            Sfp::SwigluClampedMul { limit, alpha, .. } => Some(Activation::SwigluClamped {
                limit: *limit,
                alpha: *alpha,
            }),
            Sfp::Zero { .. } | Sfp::Add { .. } | Sfp::ScaleAcc { .. } => None,
        }
    }
}

/// Ops in `ops`, loops flattened (a loop is one op, then its preheader, body and drain): the
/// numbering of buffer live ranges.
pub fn flat_len(ops: &[Instr]) -> usize {
    ops.iter()
        .map(|op| match op {
            Instr::Loop {
                preheader,
                body,
                drain,
                ..
            } => 1 + flat_len(preheader) + flat_len(body) + flat_len(drain),
            _ => 1,
        })
        .sum()
}
