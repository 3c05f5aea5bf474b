//! Lowering a validated spec to a Spyre [`Program`], at macro time: work division from the core
//! splits, an LX plan (resident operands, streamed weight tiles, partial sums) that must fit the
//! budget, DMA in whole sticks, indexed loads of expert banks by route, ring reductions for
//! reductions split across cores.
//!
//! Lowered: gate_up, down and expert_ffn with `select: gather` (the decode variants), and
//! expert_ffn with `select: dense` in a persistent loop (the prefill). One module each:
//! [`gather`], [`persistent`], and what both use, [`plan`].

mod gather;
mod persistent;
mod plan;

use gather::{down, gate_up};
use moek_ir::spyre::*;
use moek_ir::spyre::{LX_BUDGET, STICK_BYTES};
use moek_ir::{Blocks, DType, DimName, Kernel, Op, Phase, Selection};
use persistent::persistent;
use plan::*;

/// Bytes of a DL16 element and of an f32 element in LX.
const DL16: usize = 2;
const F32: usize = 4;

/// Why a spec has no program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LowerError {
    /// The lowering of this schedule is not written yet (drop `spyre` from the spec's targets).
    NotYet(String),
    /// The schedule cannot run on Spyre (a compile error on the spec).
    Refused(String),
    /// No streamed weight tile fits LX: the rows along `reduction` are too long (a compile error
    /// at that dim, saying what blocking fits).
    Streamed { reduction: DimName, why: String },
}

impl std::fmt::Display for LowerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LowerError::NotYet(m) => write!(
                f,
                "the lowering of {m} is not written yet: drop `spyre` from the targets"
            ),
            LowerError::Refused(m) | LowerError::Streamed { why: m, .. } => f.write_str(m),
        }
    }
}

/// Whether a Spyre lowering of `op` under `select` exists (the others are refused by the
/// rules, on the `spyre` target).
pub fn lowered(op: Op, select: Selection) -> bool {
    matches!(
        (op, select),
        (Op::GateUp | Op::Down, _) | (Op::ExpertFfn, Selection::Gather | Selection::Dense)
    )
}

/// The program of `k` for `dtype` (the dtype only names the host type: both are DL16 on the device),
/// planned within the device's LX budget.
pub fn program(k: &Kernel, dtype: DType) -> Result<Program, LowerError> {
    program_within(k, dtype, LX_BUDGET)
}

/// The program of `k` planned within `lx` bytes of LX per core instead of the device's budget:
/// how a plan the checker refuses is forced through to another tool (the KTIR interpreter, whose
/// own cap then refuses it), never what a run uses. The program records the budget it was
/// planned within.
pub fn program_within(k: &Kernel, dtype: DType, lx: usize) -> Result<Program, LowerError> {
    if !lowered(k.op, k.schedule.select) {
        return Err(LowerError::NotYet(format!(
            "`{}` with `select: {}`",
            k.op, k.schedule.select
        )));
    }
    let s = Sizes::of(k, lx)?;
    let mut tensors = vec![];
    let mut add = |name: &str, role: DeviceRole, shape: Vec<usize>, elem_bytes: usize| {
        let base = tensors
            .iter()
            .map(|t: &Tensor| t.base + t.device_bytes() as u64)
            .max()
            .unwrap_or(0);
        let base = base.next_multiple_of(STICK_BYTES as u64);
        tensors.push(Tensor {
            name: name.into(),
            role,
            shape,
            elem_bytes,
            stick_elems: STICK_BYTES / elem_bytes,
            base,
        });
    };
    let phases = match (k.op, k.schedule.select) {
        (Op::GateUp, _) => {
            add("x", DeviceRole::Input, vec![s.t, s.h], DL16);
            add("idx", DeviceRole::Routes, vec![s.t, s.r], F32);
            add("gate", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("out", DeviceRole::Output, vec![s.t, s.r, s.f], F32);
            vec![gate_up(k, &s, Phase::All, "out")?]
        }
        (Op::Down, _) => {
            add("act", DeviceRole::Input, vec![s.t, s.r, s.f], DL16);
            add("idx", DeviceRole::Routes, vec![s.t, s.r], F32);
            add("weights", DeviceRole::RouteWeights, vec![s.t, s.r], F32);
            add("down", DeviceRole::Bank, vec![s.e, s.f, s.h], DL16);
            add("out", DeviceRole::Output, vec![s.t, s.h], F32);
            vec![down(k, &s, Phase::All, "act")?]
        }
        (Op::ExpertFfn, Selection::Gather) => {
            add("x", DeviceRole::Input, vec![s.t, s.h], DL16);
            add("idx", DeviceRole::Routes, vec![s.t, s.r], F32);
            add("weights", DeviceRole::RouteWeights, vec![s.t, s.r], F32);
            add("gate", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("down", DeviceRole::Bank, vec![s.e, s.f, s.h], DL16);
            add("act", DeviceRole::Scratch, vec![s.t, s.r, s.f], DL16);
            add("out", DeviceRole::Output, vec![s.t, s.h], F32);
            vec![
                gate_up(k, &s, Phase::GateUp, "act")?,
                down(k, &s, Phase::Down, "act")?,
            ]
        }
        (Op::ExpertFfn, Selection::Dense) => {
            add("x", DeviceRole::Input, vec![s.t, s.h], DL16);
            add(
                "routes",
                DeviceRole::DenseRoutes,
                vec![s.e, s.t, STICK_BYTES / F32],
                F32,
            );
            add("gate", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", DeviceRole::Bank, vec![s.e, s.h, s.f], DL16);
            add("down", DeviceRole::Bank, vec![s.e, s.f, s.h], DL16);
            add("out", DeviceRole::Output, vec![s.t, s.h], F32);
            vec![persistent(k, &s)?]
        }
        _ => unreachable!("checked by `lowered`"),
    };
    let cores_used = phases.iter().map(|p| p.core_slice.len()).max().unwrap_or(0);
    Ok(Program {
        kernel: k.name.clone(),
        dtype: dtype.to_string(),
        cores_used,
        lx_budget: lx,
        tensors,
        phases,
    })
}
