//! What the hardware would refuse, checked before anything runs: work division (at most 32
//! cores; slices disjoint and covering), the LX plan (128 B aligned, within the budget, no two
//! live buffers overlapping), DMA in whole sticks and in bounds on every core, at most 256 MB
//! touched per core per view (per trip for advancing operands), operand sizes, ring reductions
//! over split dims, and the persistent loop contract.

use crate::walk::{Loop, Visit, walk};
use moek_ir::spyre::CORES;
use moek_ir::spyre::*;
use thiserror::Error;

/// One core addresses at most a 256 MB contiguous span.
pub const SPAN_LIMIT: usize = 256 << 20;

/// A program the hardware would refuse: where (the phase, empty for the program's tensors; the
/// op, by its index in the flattened op list; the core) and what ([`Invalid`]).
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{}{}{}: {kind}", place(phase), at("op", op), at("core", core))]
pub struct ValidationError {
    pub phase: String,
    pub op: Option<usize>,
    pub core: Option<usize>,
    pub kind: Invalid,
}

/// A phase by name; the program's tensors, which belong to no phase, when empty.
fn place(phase: &str) -> String {
    if phase.is_empty() {
        "the program's tensors".into()
    } else {
        format!("phase `{phase}`")
    }
}

fn at(what: &str, n: &Option<usize>) -> String {
    n.map_or(String::new(), |n| format!(", {what} {n}"))
}

/// What is wrong, with the numbers.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Invalid {
    #[error("uses {cores} cores; spyre has {max}")]
    TooManyCores { cores: usize, max: usize },
    #[error("tensor `{tensor}` has shape {shape:?}, more elements than an address can count")]
    TensorSize { tensor: String, shape: Vec<usize> },
    #[error("has {got} slice coordinates; the phase is sliced over {expected} dims")]
    Coords { expected: usize, got: usize },
    #[error("a region of `{tensor}` is empty (an extent of 0)")]
    EmptyRegion { tensor: String },
    #[error("tensor `{tensor}` is malformed: {why}")]
    Malformed { tensor: String, why: String },
    #[error("an op's parameters are out of range: {why}")]
    Parameters { why: String },
    #[error("maps {got} cores to slices, but its slices make {expected} work units")]
    SliceCount { expected: usize, got: usize },
    #[error("has slice {coord} of `{dim}`, which has {parts} slices")]
    SliceOutOfRange {
        dim: String,
        coord: usize,
        parts: usize,
    },
    #[error("cores {a} and {b} are given the same work slice")]
    SlicesOverlap { a: usize, b: usize },
    #[error("buffer `{buffer}` at {addr} is not 128-byte aligned")]
    Misaligned { buffer: String, addr: usize },
    #[error("buffer `{buffer}` has {bytes} bytes for {elems} elements")]
    BufferSize {
        buffer: String,
        bytes: usize,
        elems: usize,
    },
    #[error("LX peak {peak} bytes exceeds the budget of {budget}")]
    OverBudget { peak: usize, budget: usize },
    #[error("buffers `{a}` and `{b}` overlap in LX while both are live")]
    Overlap { a: String, b: String },
    #[error("no buffer `{name}`")]
    UnknownBuffer { name: String },
    #[error("no tensor `{name}`")]
    UnknownTensor { name: String },
    #[error("buffer `{buffer}` is used outside its live range {from}..={to}")]
    NotLive {
        buffer: String,
        from: usize,
        to: usize,
    },
    #[error("region of `{tensor}` has {got} dims; the tensor has {expected}")]
    Rank {
        tensor: String,
        expected: usize,
        got: usize,
    },
    #[error("`{tensor}` dim {dim} reaches {end}, beyond its size {size}")]
    OutOfBounds {
        tensor: String,
        dim: usize,
        end: usize,
        size: usize,
    },
    #[error(
        "`{tensor}` region {start}+{extent} of the stick dim is not whole {stick}-element sticks"
    )]
    NotWholeSticks {
        tensor: String,
        start: usize,
        extent: usize,
        stick: usize,
    },
    #[error("a region of {region} elements does not fit buffer `{buffer}` of {elems}")]
    RegionSize {
        buffer: String,
        region: usize,
        elems: usize,
    },
    #[error("an indexed load must read one expert of a bank (`{tensor}` is {why})")]
    NotABank { tensor: String, why: String },
    #[error("route slot {slot} is outside `{routes}` ({slots} slots)")]
    RouteSlot {
        routes: String,
        slot: usize,
        slots: usize,
    },
    #[error("one view of `{tensor}` spans {bytes} bytes; a core addresses at most {limit}")]
    Span {
        tensor: String,
        bytes: usize,
        limit: usize,
    },
    #[error("`{buffer}` holds {has} elements, the matmul needs {needs}")]
    Operand {
        buffer: String,
        needs: usize,
        has: usize,
    },
    #[error("`{dim}` is not split across this phase's cores")]
    NotSplit { dim: String },
    #[error("the persistent loop contract is broken: {why}")]
    Loop { why: String },
}

/// Every tensor is well formed and its bytes can be counted (the validator, the walk and the
/// simulator multiply shapes out). A program-level check: its errors name no phase.
fn tensors(p: &Program) -> Result<(), ValidationError> {
    let error = |kind| ValidationError {
        phase: String::new(),
        op: None,
        core: None,
        kind,
    };
    for t in &p.tensors {
        let malformed = |why: String| {
            Err(error(Invalid::Malformed {
                tensor: t.name.clone(),
                why,
            }))
        };
        if !matches!(t.elem_bytes, 2 | 4) || t.stick_elems != 128 / t.elem_bytes {
            return malformed(format!(
                "{} bytes per element and {} per stick; expected 2 or 4, and 128 bytes a stick",
                t.elem_bytes, t.stick_elems
            ));
        }
        if t.shape.is_empty() || t.shape.contains(&0) {
            return malformed(format!(
                "shape {:?}; expected at least one dim, none 0",
                t.shape
            ));
        }
        let bytes = t
            .shape
            .iter()
            .try_fold(t.elem_bytes, |n, &d| n.checked_mul(d));
        if bytes.is_none_or(|b| b > isize::MAX as usize) {
            return Err(error(Invalid::TensorSize {
                tensor: t.name.clone(),
                shape: t.shape.clone(),
            }));
        }
    }
    Ok(())
}

/// Checks `p`; the first problem found is the error.
pub fn validate(p: &Program) -> Result<(), ValidationError> {
    tensors(p)?;
    for phase in &p.phases {
        Checker {
            p,
            phase,
            op: 0,
            in_loop: None,
        }
        .phase()?;
    }
    Ok(())
}

struct Checker<'a> {
    p: &'a Program,
    phase: &'a Stage,
    /// Index of the op being checked in the flattened op list.
    op: usize,
    /// The advancing tensors of the enclosing loop body, with their rows per trip.
    in_loop: Option<Vec<(String, usize)>>,
}

type R = Result<(), ValidationError>;

impl Checker<'_> {
    fn at_phase(&self, kind: Invalid) -> ValidationError {
        self.error(None, None, kind)
    }

    fn at_slice(&self, core: usize, kind: Invalid) -> ValidationError {
        self.error(None, Some(core), kind)
    }

    fn at_op(&self, kind: Invalid) -> ValidationError {
        self.error(Some(self.op), None, kind)
    }

    fn at_core(&self, core: usize, kind: Invalid) -> ValidationError {
        self.error(Some(self.op), Some(core), kind)
    }

    fn error(&self, op: Option<usize>, core: Option<usize>, kind: Invalid) -> ValidationError {
        ValidationError {
            phase: self.phase.name.clone(),
            op,
            core,
            kind,
        }
    }

    fn phase(&mut self) -> R {
        self.division()?;
        self.plan()?;
        let body = &self.phase.body;
        walk(body, self)
    }

    fn division(&self) -> R {
        let ph = self.phase;
        let cores = ph.core_slice.len();
        if cores > CORES || self.p.cores_used > CORES {
            return Err(self.at_phase(Invalid::TooManyCores { cores, max: CORES }));
        }
        for (core, coords) in ph.core_slice.iter().enumerate() {
            if coords.len() != ph.slices.len() {
                return Err(self.at_slice(
                    core,
                    Invalid::Coords {
                        expected: ph.slices.len(),
                        got: coords.len(),
                    },
                ));
            }
        }
        for (core, coords) in ph.core_slice.iter().enumerate() {
            for ((dim, parts), &coord) in ph.slices.iter().zip(coords) {
                if coord >= *parts {
                    return Err(self.at_slice(
                        core,
                        Invalid::SliceOutOfRange {
                            dim: dim.clone(),
                            coord,
                            parts: *parts,
                        },
                    ));
                }
            }
        }
        let all: Vec<String> = ph.slices.iter().map(|s| s.0.clone()).collect();
        let groups = if ph.divisions.is_empty() {
            vec![all]
        } else {
            ph.divisions.clone()
        };
        for group in &groups {
            let index: Vec<usize> = group
                .iter()
                .filter_map(|d| ph.slices.iter().position(|s| &s.0 == d))
                .collect();
            let expected = index
                .iter()
                .fold(1usize, |n, &i| n.saturating_mul(ph.slices[i].1));
            if expected != cores {
                return Err(self.at_phase(Invalid::SliceCount {
                    expected,
                    got: cores,
                }));
            }
            let mut seen: Vec<Vec<usize>> = Vec::new();
            for (core, coords) in ph.core_slice.iter().enumerate() {
                let key: Vec<usize> = index.iter().map(|&i| coords[i]).collect();
                if let Some(a) = seen.iter().position(|c| *c == key) {
                    return Err(self.at_phase(Invalid::SlicesOverlap { a, b: core }));
                }
                seen.push(key);
            }
        }
        Ok(())
    }

    fn plan(&self) -> R {
        let ph = self.phase;
        let mut peak_at = Vec::new();
        for b in &ph.buffers {
            if b.addr % 128 != 0 {
                return Err(self.at_phase(Invalid::Misaligned {
                    buffer: b.name.clone(),
                    addr: b.addr,
                }));
            }
            if b.bytes != b.elems.saturating_mul(if b.dl16 { 2 } else { 4 }) {
                return Err(self.at_phase(Invalid::BufferSize {
                    buffer: b.name.clone(),
                    bytes: b.bytes,
                    elems: b.elems,
                }));
            }
            peak_at.push(b.addr.saturating_add(b.bytes));
        }
        let peak = peak_at.into_iter().max().unwrap_or(0);
        if peak > self.p.lx_budget {
            return Err(self.at_phase(Invalid::OverBudget {
                peak,
                budget: self.p.lx_budget,
            }));
        }
        for (i, a) in ph.buffers.iter().enumerate() {
            for b in &ph.buffers[i + 1..] {
                let space = a.addr < b.addr.saturating_add(b.bytes)
                    && b.addr < a.addr.saturating_add(a.bytes);
                let time = a.live.0 <= b.live.1 && b.live.0 <= a.live.1;
                if space && time {
                    return Err(self.at_phase(Invalid::Overlap {
                        a: a.name.clone(),
                        b: b.name.clone(),
                    }));
                }
            }
        }
        Ok(())
    }

    fn one(&mut self, op: &Instr) -> R {
        match op {
            Instr::DmaIn { region, to } => {
                if let Some(adv) = &self.in_loop
                    && !adv.iter().any(|a| a.0 == region.tensor)
                {
                    let why = format!(
                        "the body loads `{}`, which does not advance: stage it in the preheader",
                        region.tensor
                    );
                    return Err(self.at_phase(Invalid::Loop { why }));
                }
                self.region(region, to, false)
            }
            Instr::IndexedLoad { region, route, to } => {
                self.region(region, to, true)?;
                self.route(route)
            }
            Instr::DmaOut {
                from,
                region,
                owner,
            } => {
                if self.in_loop.is_some() {
                    let why = format!(
                        "the body writes `{}` to device memory: drain after the loop",
                        region.tensor
                    );
                    return Err(self.at_phase(Invalid::Loop { why }));
                }
                for (dim, _) in owner {
                    self.split(dim)?;
                }
                self.region(region, from, false)
            }
            Instr::Matmul {
                a,
                a_at,
                b,
                out,
                m,
                k,
                n,
                ..
            } => {
                let at = self
                    .phase
                    .core_slice
                    .iter()
                    .map(|c| a_at.eval(&self.phase.slices, c))
                    .max()
                    .unwrap_or(0);
                self.operand(a, at.saturating_add(m.saturating_mul(*k)))?;
                self.operand(b, k.saturating_mul(*n))?;
                self.operand(out, m.saturating_mul(*n))
            }
            Instr::Sfp(sfp) => self.sfp(sfp),
            Instr::RingReduce { buffer, dim, elems } => {
                self.split(dim)?;
                self.operand(buffer, *elems)
            }
            Instr::Loop { .. } => unreachable!("the walk enters loops itself"),
        }
    }

    fn sfp(&self, sfp: &Sfp) -> R {
        match sfp {
            Sfp::Zero { out, elems } => self.operand(out, *elems),
            Sfp::Add { acc, part, elems } => {
                self.operand(acc, *elems)?;
                self.operand(part, *elems)
            }
            Sfp::SwigluClampedMul { limit, alpha, .. }
                if !(limit.is_finite() && *limit > 0.0 && alpha.is_finite() && *alpha > 0.0) =>
            {
                Err(self.at_op(Invalid::Parameters {
                    why: format!(
                        "swiglu_clamped needs a finite, positive limit and alpha, not {limit} and {alpha}"
                    ),
                }))
            }
            Sfp::GeluMul { g, u, out, elems }
            | Sfp::SiluMul { g, u, out, elems }
            | Sfp::SwigluClampedMul { g, u, out, elems, .. } => {
                self.operand(g, *elems)?;
                self.operand(u, *elems)?;
                self.operand(out, *elems)
            }
            Sfp::ScaleAcc {
                acc,
                acc_at,
                y,
                y_at,
                w,
                w_at,
                elems,
            } => {
                self.operand(acc, acc_at.saturating_add(*elems))?;
                self.operand(y, y_at.saturating_add(*elems))?;
                let at = self
                    .phase
                    .core_slice
                    .iter()
                    .map(|c| w_at.eval(&self.phase.slices, c))
                    .max()
                    .unwrap_or(0);
                self.operand(w, at.saturating_add(1))
            }
        }
    }

    fn tensor(&self, name: &str) -> Result<&Tensor, ValidationError> {
        self.p
            .tensor(name)
            .ok_or_else(|| self.at_op(Invalid::UnknownTensor { name: name.into() }))
    }

    fn buffer(&self, name: &str) -> Result<&Buffer, ValidationError> {
        let b = self
            .phase
            .buffer(name)
            .ok_or_else(|| self.at_op(Invalid::UnknownBuffer { name: name.into() }))?;
        if self.op < b.live.0 || self.op > b.live.1 {
            return Err(self.at_op(Invalid::NotLive {
                buffer: name.into(),
                from: b.live.0,
                to: b.live.1,
            }));
        }
        Ok(b)
    }

    fn operand(&self, name: &str, needs: usize) -> R {
        let b = self.buffer(name)?;
        if b.elems < needs {
            return Err(self.at_op(Invalid::Operand {
                buffer: name.into(),
                needs,
                has: b.elems,
            }));
        }
        Ok(())
    }

    fn split(&self, dim: &str) -> R {
        if self.phase.slices.iter().any(|(d, _)| d == dim) {
            Ok(())
        } else {
            Err(self.at_op(Invalid::NotSplit { dim: dim.into() }))
        }
    }

    /// A DMA region: rank, whole sticks, bounds and span on every core, size of the buffer.
    fn region(&self, region: &Region, buffer: &str, indexed: bool) -> R {
        let t = self.tensor(&region.tensor)?;
        let b = self.buffer(buffer)?;
        let rank = t.shape.len();
        if region.start.len() != rank || region.extent.len() != rank {
            return Err(self.at_op(Invalid::Rank {
                tensor: t.name.clone(),
                expected: rank,
                got: region.start.len(),
            }));
        }
        if indexed
            && (t.role != DeviceRole::Bank
                || region.extent[0] != 1
                || region.start[0] != Affine::constant(0))
        {
            let why = if t.role != DeviceRole::Bank {
                format!("{:?}", t.role).to_lowercase()
            } else {
                "not read one expert at a time".into()
            };
            return Err(self.at_op(Invalid::NotABank {
                tensor: t.name.clone(),
                why,
            }));
        }
        if region.extent.contains(&0) {
            return Err(self.at_op(Invalid::EmptyRegion {
                tensor: t.name.clone(),
            }));
        }
        let elems = region
            .extent
            .iter()
            .fold(1usize, |n, &e| n.saturating_mul(e));
        if elems > b.elems {
            return Err(self.at_op(Invalid::RegionSize {
                buffer: buffer.into(),
                region: elems,
                elems: b.elems,
            }));
        }
        let last = rank - 1;
        for coords in &self.phase.core_slice {
            let start: Vec<usize> = region
                .start
                .iter()
                .map(|a| a.eval(&self.phase.slices, coords))
                .collect();
            let core = self
                .phase
                .core_slice
                .iter()
                .position(|c| c == coords)
                .unwrap_or(0);
            let per_trip = self
                .in_loop
                .iter()
                .flatten()
                .find(|a| a.0 == t.name)
                .map(|a| a.1);
            for d in 0..rank {
                let end = start[d].saturating_add(region.extent[d]);
                let size = match (d, indexed, per_trip) {
                    (0, true, _) => 1,
                    (0, _, Some(rows)) => rows,
                    _ => t.shape[d],
                };
                if end > size {
                    return Err(self.at_core(
                        core,
                        Invalid::OutOfBounds {
                            tensor: t.name.clone(),
                            dim: d,
                            end,
                            size,
                        },
                    ));
                }
            }
            let (s, e) = (start[last], region.extent[last]);
            if s % t.stick_elems != 0 || (e % t.stick_elems != 0 && s + e != t.shape[last]) {
                return Err(self.at_op(Invalid::NotWholeSticks {
                    tensor: t.name.clone(),
                    start: s,
                    extent: e,
                    stick: t.stick_elems,
                }));
            }
            let bytes = span(t, &start, &region.extent);
            if bytes > SPAN_LIMIT {
                return Err(self.at_core(
                    core,
                    Invalid::Span {
                        tensor: t.name.clone(),
                        bytes,
                        limit: SPAN_LIMIT,
                    },
                ));
            }
        }
        Ok(())
    }

    fn route(&self, route: &RouteRef) -> R {
        let t = self.tensor(&route.routes)?;
        if t.role != DeviceRole::Routes {
            let why = format!(
                "route indices must come from a routes tensor, not {:?}",
                t.role
            );
            return Err(self.at_op(Invalid::NotABank {
                tensor: t.name.clone(),
                why,
            }));
        }
        let slots: usize = t.shape.iter().product();
        for (core, coords) in self.phase.core_slice.iter().enumerate() {
            let slot = route.slot.eval(&self.phase.slices, coords);
            if slot >= slots {
                return Err(self.at_core(
                    core,
                    Invalid::RouteSlot {
                        routes: t.name.clone(),
                        slot,
                        slots,
                    },
                ));
            }
        }
        Ok(())
    }
}

/// Bytes between the first and the last byte a region touches (the last dim padded to sticks).
pub fn span(t: &Tensor, start: &[usize], extent: &[usize]) -> usize {
    let rank = t.shape.len();
    let mut strides = vec![0; rank];
    let mut s = t.elem_bytes;
    for d in (0..rank).rev() {
        strides[d] = s;
        let n = if d == rank - 1 {
            t.shape[d].div_ceil(t.stick_elems) * t.stick_elems
        } else {
            t.shape[d]
        };
        s *= n;
    }
    // Saturating: the bounds were checked before, but a loop's rows per trip are the program's
    // own number.
    let at = |pos: &dyn Fn(usize) -> usize| {
        (0..rank).fold(0usize, |n, d| {
            n.saturating_add(pos(d).saturating_mul(strides[d]))
        })
    };
    let first = at(&|d| start[d]);
    let last = at(&|d| (start[d] + extent[d]).saturating_sub(1));
    (last + t.elem_bytes).saturating_sub(first)
}

/// Why a program text was refused.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("not a Spyre program: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("invalid Spyre program: {0}")]
    Invalid(#[from] ValidationError),
}

/// Parses a program's JSON (docs/spyre-program.md) and validates it.
pub fn load(json: &str) -> Result<Program, LoadError> {
    let p: Program = serde_json::from_str(json)?;
    validate(&p)?;
    Ok(p)
}

/// The validator's walk: each leaf op checked at its flattened index; a loop's contract checked
/// on entry and its body once, as the body of a loop.
impl<'a> Visit<'a> for Checker<'a> {
    type Error = ValidationError;

    fn leaf(&mut self, op: &'a Instr, at: usize) -> R {
        self.op = at;
        self.one(op)
    }

    fn enter(&mut self, lp: &Loop<'a>, at: usize) -> Result<usize, ValidationError> {
        self.op = at;
        let (trips, advancing) = (lp.trips, lp.advancing);
        if self.in_loop.is_some() {
            return Err(self.at_phase(Invalid::Loop {
                why: "loops do not nest".into(),
            }));
        }
        if advancing.len() != 4 {
            let why = format!(
                "{} advancing operands; the contract has exactly four (gate, up, down, routing)",
                advancing.len()
            );
            return Err(self.at_phase(Invalid::Loop { why }));
        }
        for a in advancing {
            let t = self.tensor(&a.tensor)?;
            let first = t.shape.first().copied().unwrap_or(0);
            if a.per_trip == 0 {
                let why = format!("`{}` advances 0 rows a trip", a.tensor);
                return Err(self.at_phase(Invalid::Loop { why }));
            }
            if trips.saturating_mul(a.per_trip) > first {
                let why = format!(
                    "`{}` advances {} x {} rows past its {first}",
                    a.tensor, trips, a.per_trip
                );
                return Err(self.at_phase(Invalid::Loop { why }));
            }
        }
        Ok(1)
    }

    fn trip(&mut self, lp: &Loop<'a>, _: usize) -> R {
        let advancing = lp.advancing.iter().map(|a| (a.tensor.clone(), a.per_trip));
        self.in_loop = Some(advancing.collect());
        Ok(())
    }

    fn leave(&mut self, _: &Loop<'a>) -> R {
        self.in_loop = None;
        Ok(())
    }
}
