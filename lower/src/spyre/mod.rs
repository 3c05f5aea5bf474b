//! The Spyre side of the DSL: the resource model the validator applies at macro time (sticks,
//! cores, what must stay resident in each core's LX scratchpad; docs/spyre-program.md) and the
//! lowering of a spec to a program ([`lower`]). The program format is `moek_ir::spyre`.

pub mod lower;

use moek_ir::spyre::{ACC_BYTES, ELEM_BYTES};
use moek_ir::{DimName, Kernel, Op, Phase};

/// An operand that stays in one core's LX for the whole kernel or loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resident {
    pub name: &'static str,
    pub bytes: usize,
}

/// Dims whose edges must fall on whole sticks (the innermost device dims).
pub fn is_stick_dim(dim: DimName) -> bool {
    matches!(dim, DimName::H | DimName::F)
}

/// Resident operands per core. Requires a fully fixed kernel (checked before this is called).
///
/// A core's token slice is `T / groups` around a persistent loop, else `T` over the largest token
/// split of any phase; route owners (a split of `R`) each hold their routes only.
pub fn resident(k: &Kernel) -> Vec<Resident> {
    let size = |d| k.size(d).unwrap_or(1);
    let split = |phase, d| {
        k.cores_for(phase)
            .iter()
            .find(|s| s.dim == d)
            .map_or(1, |s| s.parts)
    };
    let per_core = |d: DimName| {
        let parts = [Phase::All, Phase::GateUp, Phase::Down]
            .map(|p| split(p, d))
            .into_iter()
            .max()
            .unwrap_or(1);
        size(d).div_ceil(parts)
    };
    let tokens = match k.schedule.groups {
        Some(g) => size(DimName::T).div_ceil(g.parts),
        None => per_core(DimName::T),
    };
    let (h, f, r) = (size(DimName::H), size(DimName::F), per_core(DimName::R));
    match k.op {
        Op::GateUp => vec![
            Resident {
                name: "x",
                bytes: tokens * h * ELEM_BYTES,
            },
            Resident {
                name: "activation",
                bytes: tokens * r * f * ACC_BYTES,
            },
        ],
        Op::Down => vec![
            Resident {
                name: "activation",
                bytes: tokens * r * f * ELEM_BYTES,
            },
            Resident {
                name: "accumulator",
                bytes: tokens * h * ACC_BYTES,
            },
        ],
        Op::ExpertFfn | Op::DenseMlp => vec![
            Resident {
                name: "x",
                bytes: tokens * h * ELEM_BYTES,
            },
            Resident {
                name: "accumulator",
                bytes: tokens * h * ACC_BYTES,
            },
        ],
        Op::LmHeadRow => vec![
            Resident {
                name: "hidden row",
                bytes: h * ELEM_BYTES,
            },
            Resident {
                name: "logits",
                bytes: per_core(DimName::V) * ACC_BYTES,
            },
        ],
    }
}
