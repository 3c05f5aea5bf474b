//! What the hardware would refuse, checked before anything runs: work division (at most 32
//! cores; slices disjoint and covering), the LX plan (128 B aligned, within the budget, no two
//! live buffers overlapping), DMA in whole sticks and in bounds on every core, at most 256 MB
//! touched per core per view (per trip for advancing operands), operand sizes, ring reductions
//! over split dims, and the persistent loop contract.

use moek_ir::spyre::CORES;
use moek_ir::spyre::*;
use thiserror::Error;

/// One core addresses at most a 256 MB contiguous span.
pub const SPAN_LIMIT: usize = 256 << 20;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("phase `{phase}` uses {cores} cores; spyre has {max}")]
    TooManyCores {
        phase: String,
        cores: usize,
        max: usize,
    },
    #[error(
        "phase `{phase}` maps {got} cores to slices, but its slices make {expected} work units"
    )]
    SliceCount {
        phase: String,
        expected: usize,
        got: usize,
    },
    #[error("phase `{phase}`: core {core} has slice {coord} of `{dim}`, which has {parts} slices")]
    SliceOutOfRange {
        phase: String,
        core: usize,
        dim: String,
        coord: usize,
        parts: usize,
    },
    #[error("phase `{phase}`: cores {a} and {b} are given the same work slice")]
    SlicesOverlap { phase: String, a: usize, b: usize },
    #[error("phase `{phase}`: buffer `{buffer}` at {addr} is not 128-byte aligned")]
    Misaligned {
        phase: String,
        buffer: String,
        addr: usize,
    },
    #[error("phase `{phase}`: buffer `{buffer}` has {bytes} bytes for {elems} elements")]
    BufferSize {
        phase: String,
        buffer: String,
        bytes: usize,
        elems: usize,
    },
    #[error("phase `{phase}`: LX peak {peak} bytes exceeds the budget of {budget}")]
    OverBudget {
        phase: String,
        peak: usize,
        budget: usize,
    },
    #[error("phase `{phase}`: buffers `{a}` and `{b}` overlap in LX while both are live")]
    Overlap { phase: String, a: String, b: String },
    #[error("phase `{phase}`, op {op}: no buffer `{name}`")]
    UnknownBuffer {
        phase: String,
        op: usize,
        name: String,
    },
    #[error("phase `{phase}`, op {op}: no tensor `{name}`")]
    UnknownTensor {
        phase: String,
        op: usize,
        name: String,
    },
    #[error(
        "phase `{phase}`, op {op}: buffer `{buffer}` is used outside its live range {from}..={to}"
    )]
    NotLive {
        phase: String,
        op: usize,
        buffer: String,
        from: usize,
        to: usize,
    },
    #[error(
        "phase `{phase}`, op {op}: region of `{tensor}` has {got} dims; the tensor has {expected}"
    )]
    Rank {
        phase: String,
        op: usize,
        tensor: String,
        expected: usize,
        got: usize,
    },
    #[error(
        "phase `{phase}`, op {op}, core {core}: `{tensor}` dim {dim} reaches {end}, beyond its size {size}"
    )]
    OutOfBounds {
        phase: String,
        op: usize,
        core: usize,
        tensor: String,
        dim: usize,
        end: usize,
        size: usize,
    },
    #[error(
        "phase `{phase}`, op {op}: `{tensor}` region {start}+{extent} of the stick dim is not whole {stick}-element sticks"
    )]
    NotWholeSticks {
        phase: String,
        op: usize,
        tensor: String,
        start: usize,
        extent: usize,
        stick: usize,
    },
    #[error(
        "phase `{phase}`, op {op}: a region of {region} elements does not fit buffer `{buffer}` of {elems}"
    )]
    RegionSize {
        phase: String,
        op: usize,
        buffer: String,
        region: usize,
        elems: usize,
    },
    #[error(
        "phase `{phase}`, op {op}: an indexed load must read one expert of a bank (`{tensor}` is {why})"
    )]
    NotABank {
        phase: String,
        op: usize,
        tensor: String,
        why: String,
    },
    #[error(
        "phase `{phase}`, op {op}, core {core}: route slot {slot} is outside `{routes}` ({slots} slots)"
    )]
    RouteSlot {
        phase: String,
        op: usize,
        core: usize,
        routes: String,
        slot: usize,
        slots: usize,
    },
    #[error(
        "phase `{phase}`, op {op}, core {core}: one view of `{tensor}` spans {bytes} bytes; a core addresses at most {limit}"
    )]
    Span {
        phase: String,
        op: usize,
        core: usize,
        tensor: String,
        bytes: usize,
        limit: usize,
    },
    #[error("phase `{phase}`, op {op}: `{buffer}` holds {has} elements, the matmul needs {needs}")]
    Operand {
        phase: String,
        op: usize,
        buffer: String,
        needs: usize,
        has: usize,
    },
    #[error("phase `{phase}`, op {op}: `{dim}` is not split across this phase's cores")]
    NotSplit {
        phase: String,
        op: usize,
        dim: String,
    },
    #[error("phase `{phase}`: the persistent loop contract is broken: {why}")]
    Loop { phase: String, why: String },
}

/// Checks `p`; the first problem found is the error.
pub fn validate(p: &Program) -> Result<(), ValidationError> {
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
    phase: &'a Phase,
    /// Index of the op being checked in the flattened op list.
    op: usize,
    /// The advancing tensors of the enclosing loop body, with their rows per trip.
    in_loop: Option<Vec<(String, usize)>>,
}

type R = Result<(), ValidationError>;

impl Checker<'_> {
    fn name(&self) -> String {
        self.phase.name.clone()
    }

    fn phase(&mut self) -> R {
        self.division()?;
        self.plan()?;
        let body = &self.phase.body;
        self.ops(body)
    }

    fn division(&self) -> R {
        let ph = self.phase;
        let cores = ph.core_slice.len();
        if cores > CORES || self.p.cores_used > CORES {
            return Err(ValidationError::TooManyCores {
                phase: self.name(),
                cores,
                max: CORES,
            });
        }
        for (core, coords) in ph.core_slice.iter().enumerate() {
            for ((dim, parts), &coord) in ph.slices.iter().zip(coords) {
                if coord >= *parts {
                    return Err(ValidationError::SliceOutOfRange {
                        phase: self.name(),
                        core,
                        dim: dim.clone(),
                        coord,
                        parts: *parts,
                    });
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
            let expected: usize = index.iter().map(|&i| ph.slices[i].1).product();
            if expected != cores {
                return Err(ValidationError::SliceCount {
                    phase: self.name(),
                    expected,
                    got: cores,
                });
            }
            let mut seen: Vec<Vec<usize>> = Vec::new();
            for (core, coords) in ph.core_slice.iter().enumerate() {
                let key: Vec<usize> = index.iter().map(|&i| coords[i]).collect();
                if let Some(a) = seen.iter().position(|c| *c == key) {
                    return Err(ValidationError::SlicesOverlap {
                        phase: self.name(),
                        a,
                        b: core,
                    });
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
                return Err(ValidationError::Misaligned {
                    phase: self.name(),
                    buffer: b.name.clone(),
                    addr: b.addr,
                });
            }
            if b.bytes != b.elems * if b.dl16 { 2 } else { 4 } {
                return Err(ValidationError::BufferSize {
                    phase: self.name(),
                    buffer: b.name.clone(),
                    bytes: b.bytes,
                    elems: b.elems,
                });
            }
            peak_at.push(b.addr + b.bytes);
        }
        let peak = peak_at.into_iter().max().unwrap_or(0);
        if peak > self.p.lx_budget {
            return Err(ValidationError::OverBudget {
                phase: self.name(),
                peak,
                budget: self.p.lx_budget,
            });
        }
        for (i, a) in ph.buffers.iter().enumerate() {
            for b in &ph.buffers[i + 1..] {
                let space = a.addr < b.addr + b.bytes && b.addr < a.addr + a.bytes;
                let time = a.live.0 <= b.live.1 && b.live.0 <= a.live.1;
                if space && time {
                    return Err(ValidationError::Overlap {
                        phase: self.name(),
                        a: a.name.clone(),
                        b: b.name.clone(),
                    });
                }
            }
        }
        Ok(())
    }

    fn ops(&mut self, body: &[Op]) -> R {
        for op in body {
            self.one(op)?;
            self.op += 1;
        }
        Ok(())
    }

    fn one(&mut self, op: &Op) -> R {
        match op {
            Op::DmaIn { region, to } => {
                if let Some(adv) = &self.in_loop
                    && !adv.iter().any(|a| a.0 == region.tensor)
                {
                    let why = format!(
                        "the body loads `{}`, which does not advance: stage it in the preheader",
                        region.tensor
                    );
                    return Err(ValidationError::Loop {
                        phase: self.name(),
                        why,
                    });
                }
                self.region(region, to, false)
            }
            Op::IndexedLoad { region, route, to } => {
                self.region(region, to, true)?;
                self.route(route)
            }
            Op::DmaOut {
                from,
                region,
                owner,
            } => {
                if self.in_loop.is_some() {
                    let why = format!(
                        "the body writes `{}` to device memory: drain after the loop",
                        region.tensor
                    );
                    return Err(ValidationError::Loop {
                        phase: self.name(),
                        why,
                    });
                }
                for (dim, _) in owner {
                    self.split(dim)?;
                }
                self.region(region, from, false)
            }
            Op::Matmul {
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
                self.operand(a, at + m * k)?;
                self.operand(b, k * n)?;
                self.operand(out, m * n)
            }
            Op::Sfp(sfp) => self.sfp(sfp),
            Op::RingReduce { buffer, dim, elems } => {
                self.split(dim)?;
                self.operand(buffer, *elems)
            }
            Op::Loop {
                trips,
                advancing,
                preheader,
                body,
                drain,
            } => self.looped(*trips, advancing, preheader, body, drain),
        }
    }

    fn sfp(&self, sfp: &Sfp) -> R {
        match sfp {
            Sfp::Zero { out, elems } => self.operand(out, *elems),
            Sfp::Add { acc, part, elems } => {
                self.operand(acc, *elems)?;
                self.operand(part, *elems)
            }
            Sfp::GeluMul { g, u, out, elems } | Sfp::SiluMul { g, u, out, elems } => {
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
                self.operand(acc, acc_at + elems)?;
                self.operand(y, y_at + elems)?;
                let at = self
                    .phase
                    .core_slice
                    .iter()
                    .map(|c| w_at.eval(&self.phase.slices, c))
                    .max()
                    .unwrap_or(0);
                self.operand(w, at + 1)
            }
        }
    }

    fn looped(
        &mut self,
        trips: usize,
        advancing: &[Advance],
        pre: &[Op],
        body: &[Op],
        drain: &[Op],
    ) -> R {
        if self.in_loop.is_some() {
            return Err(ValidationError::Loop {
                phase: self.name(),
                why: "loops do not nest".into(),
            });
        }
        if advancing.len() != 4 {
            let why = format!(
                "{} advancing operands; the contract has exactly four (gate, up, down, routing)",
                advancing.len()
            );
            return Err(ValidationError::Loop {
                phase: self.name(),
                why,
            });
        }
        for a in advancing {
            let t = self.tensor(&a.tensor)?;
            let first = t.shape.first().copied().unwrap_or(0);
            if trips * a.per_trip > first {
                let why = format!(
                    "`{}` advances {} x {} rows past its {first}",
                    a.tensor, trips, a.per_trip
                );
                return Err(ValidationError::Loop {
                    phase: self.name(),
                    why,
                });
            }
        }
        self.op += 1;
        self.ops(pre)?;
        self.in_loop = Some(
            advancing
                .iter()
                .map(|a| (a.tensor.clone(), a.per_trip))
                .collect(),
        );
        self.ops(body)?;
        self.in_loop = None;
        self.ops(drain)?;
        self.op -= 1;
        Ok(())
    }

    fn tensor(&self, name: &str) -> Result<&Tensor, ValidationError> {
        self.p
            .tensor(name)
            .ok_or_else(|| ValidationError::UnknownTensor {
                phase: self.name(),
                op: self.op,
                name: name.into(),
            })
    }

    fn buffer(&self, name: &str) -> Result<&Buffer, ValidationError> {
        let b = self
            .phase
            .buffer(name)
            .ok_or_else(|| ValidationError::UnknownBuffer {
                phase: self.name(),
                op: self.op,
                name: name.into(),
            })?;
        if self.op < b.live.0 || self.op > b.live.1 {
            return Err(ValidationError::NotLive {
                phase: self.name(),
                op: self.op,
                buffer: name.into(),
                from: b.live.0,
                to: b.live.1,
            });
        }
        Ok(b)
    }

    fn operand(&self, name: &str, needs: usize) -> R {
        let b = self.buffer(name)?;
        if b.elems < needs {
            return Err(ValidationError::Operand {
                phase: self.name(),
                op: self.op,
                buffer: name.into(),
                needs,
                has: b.elems,
            });
        }
        Ok(())
    }

    fn split(&self, dim: &str) -> R {
        if self.phase.slices.iter().any(|(d, _)| d == dim) {
            Ok(())
        } else {
            Err(ValidationError::NotSplit {
                phase: self.name(),
                op: self.op,
                dim: dim.into(),
            })
        }
    }

    /// A DMA region: rank, whole sticks, bounds and span on every core, size of the buffer.
    fn region(&self, region: &Region, buffer: &str, indexed: bool) -> R {
        let t = self.tensor(&region.tensor)?;
        let b = self.buffer(buffer)?;
        let rank = t.shape.len();
        if region.start.len() != rank || region.extent.len() != rank {
            return Err(ValidationError::Rank {
                phase: self.name(),
                op: self.op,
                tensor: t.name.clone(),
                expected: rank,
                got: region.start.len(),
            });
        }
        if indexed
            && (t.role != Role::Bank
                || region.extent[0] != 1
                || region.start[0] != Affine::constant(0))
        {
            let why = if t.role != Role::Bank {
                format!("{:?}", t.role).to_lowercase()
            } else {
                "not read one expert at a time".into()
            };
            return Err(ValidationError::NotABank {
                phase: self.name(),
                op: self.op,
                tensor: t.name.clone(),
                why,
            });
        }
        let elems: usize = region.extent.iter().product();
        if elems > b.elems {
            return Err(ValidationError::RegionSize {
                phase: self.name(),
                op: self.op,
                buffer: buffer.into(),
                region: elems,
                elems: b.elems,
            });
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
                let end = start[d] + region.extent[d];
                let size = match (d, indexed, per_trip) {
                    (0, true, _) => 1,
                    (0, _, Some(rows)) => rows,
                    _ => t.shape[d],
                };
                if end > size {
                    return Err(ValidationError::OutOfBounds {
                        phase: self.name(),
                        op: self.op,
                        core,
                        tensor: t.name.clone(),
                        dim: d,
                        end,
                        size,
                    });
                }
            }
            let (s, e) = (start[last], region.extent[last]);
            if s % t.stick_elems != 0 || (e % t.stick_elems != 0 && s + e != t.shape[last]) {
                return Err(ValidationError::NotWholeSticks {
                    phase: self.name(),
                    op: self.op,
                    tensor: t.name.clone(),
                    start: s,
                    extent: e,
                    stick: t.stick_elems,
                });
            }
            let bytes = span(t, &start, &region.extent);
            if bytes > SPAN_LIMIT {
                return Err(ValidationError::Span {
                    phase: self.name(),
                    op: self.op,
                    core,
                    tensor: t.name.clone(),
                    bytes,
                    limit: SPAN_LIMIT,
                });
            }
        }
        Ok(())
    }

    fn route(&self, route: &RouteRef) -> R {
        let t = self.tensor(&route.routes)?;
        if t.role != Role::Routes {
            let why = format!(
                "route indices must come from a routes tensor, not {:?}",
                t.role
            );
            return Err(ValidationError::NotABank {
                phase: self.name(),
                op: self.op,
                tensor: t.name.clone(),
                why,
            });
        }
        let slots: usize = t.shape.iter().product();
        for (core, coords) in self.phase.core_slice.iter().enumerate() {
            let slot = route.slot.eval(&self.phase.slices, coords);
            if slot >= slots {
                return Err(ValidationError::RouteSlot {
                    phase: self.name(),
                    op: self.op,
                    core,
                    routes: t.name.clone(),
                    slot,
                    slots,
                });
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
    let first: usize = (0..rank).map(|d| start[d] * strides[d]).sum();
    let last: usize = (0..rank)
        .map(|d| (start[d] + extent[d] - 1) * strides[d])
        .sum();
    last + t.elem_bytes - first
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
