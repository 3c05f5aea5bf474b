//! Device plans: a generated compute program (today WGSL) with what its runtime needs to bind and
//! run it — the tensors, how each is cut into bindings, and the ordered dispatch steps. Nothing
//! here is WGSL-specific beyond the source text, so a CUDA or Metal emitter can produce the same
//! plan for its own runtime.

use serde::{Deserialize, Serialize};

/// Threads per workgroup.
pub const WORKGROUP: u32 = 64;

/// The most workgroups one dispatch dimension may have (WebGPU's default limit).
pub const MAX_GROUPS_PER_DIM: u32 = 65_535;

/// What the emitter must know of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Largest storage buffer binding, bytes.
    pub binding_limit: u64,
    /// Read f16 tensors as `array<f16>` (`enable f16;`) instead of packed pairs.
    pub f16: bool,
}

/// A generated device program and the plan its runtime follows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicePlan {
    pub source: String,
    /// In binding order; chunk `c` of tensor `i` is one binding.
    pub tensors: Vec<TensorPlan>,
    pub steps: Vec<Step>,
}

/// Where a tensor's contents come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BufferRole {
    /// `{ trip: u32, softcap: f32 }`, a uniform.
    Params,
    /// An input of the op (activations, routes): uploaded per run.
    Input,
    /// Weights (expert banks, dense matrices, the embedding): uploaded once and kept.
    Weight,
    /// Written and read by the program only.
    Scratch,
    /// The op's output (f32), read back.
    Output,
    /// Workgroup counts written by the program for its indirect dispatches.
    Indirect,
}

/// One tensor of the program: `elems` values stored `values_per_elem` to an element of
/// `elem_bytes` (one value for the plain dtypes; a block of 32 and its scale for quantized
/// weights), bound as `chunks` buffers of `chunk_rows` rows of `row_len` values (the last may be
/// shorter). Rows are whole stored elements.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorPlan {
    pub name: String,
    pub role: BufferRole,
    pub elems: usize,
    pub elem_bytes: usize,
    #[serde(default = "one")]
    pub values_per_elem: usize,
    /// u32 words read as they are (route indices, expert lists), never through a float loader.
    #[serde(default)]
    pub integer: bool,
    pub row_len: usize,
    pub chunk_rows: usize,
    pub chunks: usize,
}

fn one() -> usize {
    1
}

impl TensorPlan {
    /// Value range of chunk `c`.
    pub fn chunk(&self, c: usize) -> std::ops::Range<usize> {
        let per = self.chunk_rows * self.row_len;
        (c * per).min(self.elems)..((c + 1) * per).min(self.elems)
    }

    /// Bytes that `values` values (whole stored elements) take.
    pub fn bytes_of(&self, values: usize) -> usize {
        values / self.values_per_elem * self.elem_bytes
    }

    /// Bytes of the whole tensor as stored.
    pub fn bytes(&self) -> usize {
        self.bytes_of(self.elems)
    }

    /// Bytes of chunk `c` as bound: whole 32-bit words.
    pub fn chunk_bytes(&self, c: usize) -> u64 {
        let r = self.chunk(c);
        (self.bytes_of(r.end - r.start).div_ceil(4) * 4).max(4) as u64
    }
}

/// One step of a run, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Set `params.trip` (the persistent loop's expert) before the next dispatches.
    Trip(u32),
    /// Dispatch `entry` with one workgroup per row.
    Rows { entry: String, rows: u32 },
    /// Dispatch `entry` with one thread per element.
    Elems { entry: String, count: u32 },
    /// Copy tensor `0` (written by earlier steps) to the buffer later indirect dispatches read:
    /// a buffer cannot be bound for writing and read as dispatch arguments in one dispatch.
    IndirectArgs(String),
    /// Dispatch `entry` with the workgroup counts at byte `offset` of tensor `tensor`, as of
    /// the last [`Step::IndirectArgs`] of it.
    Indirect {
        entry: String,
        tensor: String,
        offset: u64,
    },
}

impl Step {
    /// Workgroups `(x, y)` for this step: rows (or element groups) laid out row-major.
    pub fn groups(&self) -> Option<(u32, u32)> {
        let n = match self {
            Step::Trip(_) | Step::IndirectArgs(_) | Step::Indirect { .. } => return None,
            Step::Rows { rows, .. } => *rows,
            Step::Elems { count, .. } => count.div_ceil(WORKGROUP),
        };
        let x = n.clamp(1, MAX_GROUPS_PER_DIM);
        Some((x, n.div_ceil(x)))
    }
}
