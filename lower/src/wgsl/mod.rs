//! IR -> the wgpu variant: one WGSL compute program per spec and problem size, with the plan the
//! runtime needs to bind and run it (tensors, their chunks, the ordered steps).
//!
//! The program follows the schedule:
//! - one workgroup computes one output row (a dot product per output element, or the gate and up
//!   pair); its threads stride over the reduction and a workgroup tree sum completes each
//!   **segment**: the reduction blocks of the phase, cut further where a core split divides the
//!   reduction dim. Segments are added in declared order, as on the CPU and on Spyre;
//! - column blocks are separate entry points, dispatched in order;
//! - route owners (a core split of `R` in a down phase) write one partial row each, and a combine
//!   step adds the routes on the device in route order (the K-axis combine); without route owners
//!   one workgroup adds its routes in route order itself;
//! - the persistent loop is one step pair per expert bank: the trip number is copied into a
//!   uniform before each trip; the accumulator is filled once before the first trip.
//!
//! Other core splits (of `T`, `R` in gate/up, output columns) and token groups only say how work
//! is cut; on a GPU every output row is already its own workgroup, so they change no sum.
//!
//! Every dim is baked into the source. Tensors larger than the device's binding limit are bound
//! as several buffers of whole rows (`gate_up_0`, `gate_up_1`, ...): a row never straddles two.
//! 16-bit tensors are read as packed `u32` pairs (`unpack2x16float`; bf16 by shifting), or as
//! `array<f16>` under `enable f16;` when the device has `SHADER_F16`. Quantized weights (Q8_0,
//! Q4_0) are read byte by byte from `u32` words of their blocks as stored and dequantized exactly
//! (`tensors.rs`), beside f32 activations: no activation is rounded, unlike the CPU's integer
//! dots. Arithmetic is f32.

use moek_ir::plan::{BufferRole, DeviceCaps, DevicePlan, Step, TensorPlan, WORKGROUP};
use moek_ir::reference::Shape;
use moek_ir::{DType, Kernel, Op, Phase, Selection};
use std::fmt::Write;

mod ops;
mod source;
mod sums;
mod tensors;

use source::{PARAMS, SOFTCAP, activation, workgroup_sum};

/// Tokens per workgroup in the persistent loop: each weight is loaded once per tile.
pub const TILE: u32 = 8;

/// Why a spec has no wgpu program for a problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WgslError {
    #[error("one row of `{tensor}` is {bytes} bytes, over the device's binding limit of {limit}")]
    RowTooLarge {
        tensor: String,
        bytes: u64,
        limit: u64,
    },
    #[error("`{tensor}` ({bytes} bytes) is bound whole and exceeds the binding limit of {limit}")]
    Whole {
        tensor: String,
        bytes: u64,
        limit: u64,
    },
    #[error("{what} has {n} elements; WGSL indices are 32-bit")]
    TooLarge { what: String, n: usize },
}

/// The program of `k` for `dtype` at shape `s` on `dev`.
pub fn program(
    k: &Kernel,
    dtype: DType,
    s: &Shape,
    dev: &DeviceCaps,
) -> Result<DevicePlan, WgslError> {
    let mut e = Emitter::new(k, dtype, *s, *dev);
    e.build()?;
    Ok(e.finish())
}

struct Emitter<'k> {
    k: &'k Kernel,
    dtype: DType,
    s: Shape,
    dev: DeviceCaps,
    tensors: Vec<TensorPlan>,
    steps: Vec<Step>,
    /// Helper functions (loads, partial dots), then entry points.
    helpers: String,
    entries: String,
    /// Partial-dot helpers already emitted, by name.
    parts: Vec<String>,
}

/// How a tensor's elements are stored: in the variant's dtype, as 32-bit f32 or u32 words, or
/// (weights of a quantized variant) in the dtype's blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    /// Elements of the spec's (plain) dtype.
    Dtype,
    /// Activations beside quantized weights: elements of the dtype's activation dtype.
    Activation,
    F32,
    U32,
    Blocks,
}

/// Reduction segments `(start, end)`, in order.
type Segs = Vec<(usize, usize)>;

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel, dtype: DType, s: Shape, dev: DeviceCaps) -> Self {
        Emitter {
            k,
            dtype,
            s,
            dev,
            tensors: vec![],
            steps: vec![],
            helpers: String::new(),
            entries: String::new(),
            parts: vec![],
        }
    }

    fn native_f16(&self) -> bool {
        self.dev.f16 && self.dtype == DType::F16
    }

    fn build(&mut self) -> Result<(), WgslError> {
        let (s, k) = (self.s, self.k);
        self.tensor("params", BufferRole::Params, 4, Store::F32, 4)?;
        self.op_tensors()?;
        match k.op {
            Op::GateUp => {
                self.tensor("out", BufferRole::Output, s.t * s.r * s.f, Store::F32, s.f)?;
                self.gather_gate_up(Phase::All, "out");
            }
            Op::Down => {
                self.tensor("out", BufferRole::Output, s.t * s.h, Store::F32, s.h)?;
                self.gather_down(Phase::All)?;
            }
            Op::ExpertFfn => {
                self.tensor("out", BufferRole::Output, s.t * s.h, Store::F32, s.h)?;
                if k.schedule.select == Selection::Dense {
                    self.tensor("act", BufferRole::Scratch, s.t * s.f, Store::F32, s.f)?;
                    self.dense_persistent()?;
                } else {
                    self.tensor("act", BufferRole::Scratch, s.t * s.r * s.f, Store::F32, s.f)?;
                    self.gather_gate_up(Phase::GateUp, "act");
                    self.gather_down(Phase::Down)?;
                }
            }
            Op::DenseMlp => {
                self.tensor("act", BufferRole::Scratch, s.t * s.f, Store::F32, s.f)?;
                self.tensor("out", BufferRole::Output, s.t * s.h, Store::F32, s.h)?;
                self.dense_mlp()?;
            }
            Op::LmHeadRow => {
                self.tensor("out", BufferRole::Output, s.v, Store::F32, 1)?;
                self.lm_head_row();
            }
        }
        Ok(())
    }

    fn finish(self) -> DevicePlan {
        let k = self.k;
        let s = self.s;
        let dims: Vec<String> =
            k.op.dims()
                .iter()
                .map(|d| format!("{d}={}", s.dim(*d)))
                .collect();
        let mode = match (self.dtype, self.native_f16()) {
            (DType::F32, _) => "f32 loads",
            (_, true) => "f16 loads (enable f16)",
            (DType::Bf16, _) => "bf16 from packed u32 pairs",
            (DType::F16, _) => "f16 from packed u32 pairs (unpack2x16float)",
            (DType::Q8_0 | DType::Q4_0 | DType::Mxfp4, _) => {
                "weights in blocks read from u32 words and dequantized exactly, f32 activations"
            }
            (DType::Q8_0Bf16 | DType::Q4_0Bf16 | DType::Mxfp4Bf16, _) => {
                "weights in blocks read from u32 words and dequantized exactly, bf16 activations from packed u32 pairs"
            }
        };
        let mut src = String::new();
        let _ = writeln!(
            src,
            "// moek: `{}` ({}, {}), {}; f32 arithmetic.\n// schedule: {}",
            k.name,
            k.op,
            self.dtype,
            mode,
            k.schedule_summary()
        );
        let _ = writeln!(src, "// sizes: {}", dims.join(" "));
        if self.native_f16() {
            src.push_str("enable f16;\n");
        }
        let _ = writeln!(
            src,
            "\nconst WG: u32 = {WORKGROUP}u;\nconst TILE: u32 = {TILE}u;\n"
        );
        src.push_str(PARAMS);
        src.push_str(&activation(self.k.activation));
        src.push_str(SOFTCAP);
        src.push_str(&workgroup_sum("wg_sum", "red1", "f32"));
        src.push_str(&workgroup_sum("wg_sum2", "red2", "vec2<f32>"));
        src.push_str(&self.declarations());
        src.push('\n');
        src.push_str(&self.loaders());
        src.push_str(&self.helpers);
        src.push('\n');
        src.push_str(&self.entries);
        DevicePlan {
            source: src,
            tensors: self.tensors,
            steps: self.steps,
        }
    }
}
