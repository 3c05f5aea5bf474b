//! A spec's schedule as the CPU's generic skeletons (moek-cpu's `skeleton`) read it: which
//! skeleton runs, its reduction and column blocks, each phase's core split, the token groups,
//! the activation and the optional tensors.
//!
//! The compiled CPU variant is these tables as a constant handed to the skeletons; a schedule
//! given at run time is [`Tables::of`] its IR, handed to the same skeletons. Nothing about a
//! schedule lives in generated loops, so trying a schedule needs no rebuild.

use crate::tensors::Optionals;
use crate::{Activation, DimName, Kernel, Op, Phase, Selection};
use std::borrow::Cow;

/// Which loop nest follows the schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Skeleton {
    /// Gate/up over gathered routes: units T x R x F x H.
    GateUp,
    /// Down over gathered routes (units T x R x H x F), then the K-axis combine.
    Down,
    /// A gathered expert FFN in two phases (gate/up, then down), each cut its own way.
    Gathered,
    /// A gathered expert FFN whose units own whole routes in both phases: each unit runs its
    /// routes' gate/up, activation and down back to back.
    RouteOwned,
    /// Tokens grouped by expert: a GEMM pair per expert, experts as work units.
    Grouped,
    /// Dense over experts in a persistent loop: x and the accumulator stay, a bank per trip.
    Persistent,
    /// The dense MLP: GEMM gate/up and down over all tokens.
    DenseMlp,
    /// The LM head on the final row, then its argmax.
    LmHeadRow,
}

impl Skeleton {
    /// The skeleton that follows `k`'s schedule.
    pub fn of(k: &Kernel) -> Skeleton {
        match (k.op, k.schedule.select) {
            (Op::GateUp, _) => Skeleton::GateUp,
            (Op::Down, _) => Skeleton::Down,
            (Op::ExpertFfn, Selection::Gather) if route_owned(k) => Skeleton::RouteOwned,
            (Op::ExpertFfn, Selection::Gather) => Skeleton::Gathered,
            (Op::ExpertFfn, Selection::Grouped) => Skeleton::Grouped,
            (Op::ExpertFfn, _) => Skeleton::Persistent,
            (Op::DenseMlp, _) => Skeleton::DenseMlp,
            (Op::LmHeadRow, _) => Skeleton::LmHeadRow,
        }
    }

    /// Whether the skeleton reads weight rows only through products (gathered routes,
    /// matrix-vector), never as GEMM operands (tokens grouped, the persistent loop, the dense
    /// MLP). Both run on any stored weight the spec declares, quantized blocks included.
    pub fn reads_weights_apart(self) -> bool {
        !matches!(
            self,
            Skeleton::Grouped | Skeleton::Persistent | Skeleton::DenseMlp
        )
    }
}

/// Whether both phases of a gathered expert FFN are cut only by tokens and routes, identically:
/// then each unit owns whole routes in both phases, and a route's down needs nothing but its own
/// activation.
fn route_owned(k: &Kernel) -> bool {
    let owned = |phase| {
        k.cores_for(phase)
            .iter()
            .all(|s| matches!(s.dim, DimName::T | DimName::R))
    };
    let parts = |phase| Parts::of(k.cores_for(phase));
    owned(Phase::GateUp)
        && owned(Phase::Down)
        && [DimName::T, DimName::R]
            .iter()
            .all(|&d| parts(Phase::GateUp).of_dim(d) == parts(Phase::Down).of_dim(d))
}

/// How many parts one phase's core split cuts each dim into (1 where it is not cut), indexed
/// in [`DimName`] order (T, R, E, H, F, V).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Parts(pub [usize; 6]);

impl Parts {
    /// Nothing cut.
    pub const ONE: Parts = Parts([1; 6]);

    /// The parts of a declared split.
    pub fn of(splits: &[crate::Split]) -> Parts {
        let mut p = Parts::ONE;
        for s in splits {
            p.0[s.dim as usize] = s.parts;
        }
        p
    }

    pub fn of_dim(&self, d: DimName) -> usize {
        self.0[d as usize]
    }
}

/// Ordered `(start, end)` blocks of a dim, or `None` for one block over the whole dim.
pub type Ranges<'a> = Option<Cow<'a, [(usize, usize)]>>;

/// A spec's schedule for the CPU skeletons. `'static` with borrowed slices as a generated
/// constant; owned when built at run time by [`Tables::of`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables<'a> {
    /// The spec's name, for messages.
    pub name: Cow<'a, str>,
    pub skeleton: Skeleton,
    /// Dims the spec fixes, with their sizes (a run at another size is refused).
    pub fixed: Cow<'a, [(DimName, usize)]>,
    pub activation: Activation,
    /// The optional tensors the spec reads (its biases, its output gate).
    pub optional: Optionals,
    /// Reduction blocks of H and of F, summed in declared order.
    pub reduce_h: Ranges<'a>,
    pub reduce_f: Ranges<'a>,
    /// Output column blocks of H, F and V.
    pub columns_h: Ranges<'a>,
    pub columns_f: Ranges<'a>,
    pub columns_v: Ranges<'a>,
    /// The core split of the first phase (gate/up, or the op's only phase) and of the second
    /// (down, or again the only phase).
    pub cores: [Parts; 2],
    /// Token groups of the persistent loop (1 when not declared).
    pub groups: usize,
}

impl Tables<'static> {
    /// The tables of `k`'s schedule.
    pub fn of(k: &Kernel) -> Tables<'static> {
        let ranges = |b: Option<&crate::Blocks>| b.map(|b| Cow::Owned(b.ranges()));
        let phases = match k.op.has_phases() {
            true => [Phase::GateUp, Phase::Down],
            false => [Phase::All, Phase::All],
        };
        Tables {
            name: Cow::Owned(k.name.clone()),
            skeleton: Skeleton::of(k),
            fixed: Cow::Owned(
                k.dims
                    .iter()
                    .filter_map(|d| d.size.map(|n| (d.name, n)))
                    .collect(),
            ),
            activation: k.activation,
            optional: k.optional,
            reduce_h: ranges(k.reduce_blocks(DimName::H)),
            reduce_f: ranges(k.reduce_blocks(DimName::F)),
            columns_h: ranges(k.column_blocks(DimName::H)),
            columns_f: ranges(k.column_blocks(DimName::F)),
            columns_v: ranges(k.column_blocks(DimName::V)),
            cores: phases.map(|p| Parts::of(k.cores_for(p))),
            groups: k.schedule.groups.map_or(1, |g| g.parts),
        }
    }
}

impl Tables<'_> {
    /// Panics, naming the spec and the dim, if `s` differs from a size the spec fixes.
    pub fn check_shape(&self, s: &crate::reference::Shape) {
        for &(d, n) in self.fixed.iter() {
            assert!(
                s.dim(d) == n,
                "kernel `{}` is fixed at {d}={n} but was given {}",
                self.name,
                s.dim(d)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_index_dims_in_declared_order() {
        let p = Parts::of(&[
            crate::Split {
                dim: DimName::T,
                parts: 8,
            },
            crate::Split {
                dim: DimName::H,
                parts: 4,
            },
        ]);
        assert_eq!(p.of_dim(DimName::T), 8);
        assert_eq!(p.of_dim(DimName::H), 4);
        assert_eq!(p.of_dim(DimName::F), 1);
    }
}
