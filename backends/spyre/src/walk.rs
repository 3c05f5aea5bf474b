//! One walk over a program's op tree, shared by the validator and the simulator: the leaf ops in
//! order, each with its index in the flattened op list (a loop counts as one op, then come its
//! preheader, body and drain: the numbering buffer live ranges use), and each loop's parts.

use moek_ir::spyre::{Advance, Instr, flat_len};

/// A loop op's parts, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct Loop<'p> {
    pub trips: usize,
    pub advancing: &'p [Advance],
    pub preheader: &'p [Instr],
    pub body: &'p [Instr],
    pub drain: &'p [Instr],
}

/// What a walk does at each op.
pub trait Visit<'p> {
    type Error;
    /// A leaf op (anything but a loop) at flattened index `at`.
    fn leaf(&mut self, op: &'p Instr, at: usize) -> Result<(), Self::Error>;
    /// A loop at flattened index `at`, before its preheader. Returns how many trips of its body
    /// to walk: the simulator runs every trip, the validator checks the body once.
    fn enter(&mut self, lp: &Loop<'p>, at: usize) -> Result<usize, Self::Error>;
    /// Before each walked trip of the body (after the preheader).
    fn trip(&mut self, lp: &Loop<'p>, trip: usize) -> Result<(), Self::Error>;
    /// After the last walked trip, before the drain.
    fn leave(&mut self, lp: &Loop<'p>) -> Result<(), Self::Error>;
}

/// Walks `ops` in program order.
pub fn walk<'p, V: Visit<'p>>(ops: &'p [Instr], v: &mut V) -> Result<(), V::Error> {
    walk_from(ops, 0, v).map(drop)
}

/// Walks `ops`, the first at flattened index `at`; returns the index after the last.
fn walk_from<'p, V: Visit<'p>>(
    ops: &'p [Instr],
    mut at: usize,
    v: &mut V,
) -> Result<usize, V::Error> {
    for op in ops {
        let Instr::Loop {
            trips,
            advancing,
            preheader,
            body,
            drain,
        } = op
        else {
            v.leaf(op, at)?;
            at += 1;
            continue;
        };
        let lp = Loop {
            trips: *trips,
            advancing,
            preheader,
            body,
            drain,
        };
        let walked = v.enter(&lp, at)?;
        let body_at = walk_from(preheader, at + 1, v)?;
        let mut after = body_at + flat_len(body);
        for trip in 0..walked {
            v.trip(&lp, trip)?;
            after = walk_from(body, body_at, v)?;
        }
        v.leave(&lp)?;
        at = walk_from(drain, after, v)?;
    }
    Ok(at)
}
