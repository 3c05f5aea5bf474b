//! Lowering a validated spec to a Spyre [`Program`], at macro time: work division from the core
//! splits, an LX plan (resident operands, streamed weight tiles, partial sums) that must fit the
//! budget, DMA in whole sticks, indexed loads of expert banks by route, ring reductions for
//! reductions split across cores.
//!
//! Lowered: gate_up, down and expert_ffn with `select: gather` (the decode variants), and
//! expert_ffn with `select: dense` in a persistent loop (the prefill).

use moek_ir::spyre::*;
use moek_ir::spyre::{CORES, LX_BUDGET, STICK_BYTES};
use moek_ir::{Blocks, DType, DimName, Kernel, Op as IrOp, Phase as IrPhase, Selection};

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
}

impl std::fmt::Display for LowerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LowerError::NotYet(m) => write!(
                f,
                "the lowering of {m} is not written yet: drop `spyre` from the targets"
            ),
            LowerError::Refused(m) => f.write_str(m),
        }
    }
}

/// The program of `k` for `dtype` (the dtype only names the host type: both are DL16 on the device).
pub fn program(k: &Kernel, dtype: DType) -> Result<Program, LowerError> {
    let s = Sizes::of(k)?;
    let mut tensors = vec![];
    let mut add = |name: &str, role: Role, shape: Vec<usize>, elem_bytes: usize| {
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
        (IrOp::GateUp, _) => {
            add("x", Role::Input, vec![s.t, s.h], DL16);
            add("idx", Role::Routes, vec![s.t, s.r], F32);
            add("gate", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("out", Role::Output, vec![s.t, s.r, s.f], F32);
            vec![gate_up(k, &s, IrPhase::All, "out")?]
        }
        (IrOp::Down, _) => {
            add("act", Role::Input, vec![s.t, s.r, s.f], DL16);
            add("idx", Role::Routes, vec![s.t, s.r], F32);
            add("weights", Role::RouteWeights, vec![s.t, s.r], F32);
            add("down", Role::Bank, vec![s.e, s.f, s.h], DL16);
            add("out", Role::Output, vec![s.t, s.h], F32);
            vec![down(k, &s, IrPhase::All, "act")?]
        }
        (IrOp::ExpertFfn, Selection::Gather) => {
            add("x", Role::Input, vec![s.t, s.h], DL16);
            add("idx", Role::Routes, vec![s.t, s.r], F32);
            add("weights", Role::RouteWeights, vec![s.t, s.r], F32);
            add("gate", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("down", Role::Bank, vec![s.e, s.f, s.h], DL16);
            add("act", Role::Scratch, vec![s.t, s.r, s.f], DL16);
            add("out", Role::Output, vec![s.t, s.h], F32);
            vec![
                gate_up(k, &s, IrPhase::GateUp, "act")?,
                down(k, &s, IrPhase::Down, "act")?,
            ]
        }
        (IrOp::ExpertFfn, Selection::Dense) => {
            add("x", Role::Input, vec![s.t, s.h], DL16);
            add(
                "routes",
                Role::DenseRoutes,
                vec![s.e, s.t, STICK_BYTES / F32],
                F32,
            );
            add("gate", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("up", Role::Bank, vec![s.e, s.h, s.f], DL16);
            add("down", Role::Bank, vec![s.e, s.f, s.h], DL16);
            add("out", Role::Output, vec![s.t, s.h], F32);
            vec![persistent(k, &s)?]
        }
        (op, select) => {
            return Err(LowerError::NotYet(format!(
                "`{op}` with `select: {select}`"
            )));
        }
    };
    let cores_used = phases.iter().map(|p| p.core_slice.len()).max().unwrap_or(0);
    Ok(Program {
        kernel: k.name.clone(),
        dtype: dtype.to_string(),
        cores_used,
        lx_budget: LX_BUDGET,
        tensors,
        phases,
    })
}

/// The fixed sizes of a Spyre spec (validation guarantees they are fixed).
struct Sizes {
    t: usize,
    r: usize,
    e: usize,
    h: usize,
    f: usize,
}

impl Sizes {
    fn of(k: &Kernel) -> Result<Self, LowerError> {
        let get = |d| {
            k.size(d).ok_or_else(|| {
                LowerError::Refused(format!("`{d}` is free; spyre programs are fixed"))
            })
        };
        Ok(Sizes {
            t: get(DimName::T)?,
            r: get(DimName::R)?,
            e: get(DimName::E)?,
            h: get(DimName::H)?,
            f: get(DimName::F)?,
        })
    }
}

/// A phase's work division: the split dims, and each core's slice coordinates (row-major).
struct Division {
    slices: Vec<(String, usize)>,
    core_slice: Vec<Vec<usize>>,
    divisions: Vec<Vec<String>>,
}

impl Division {
    fn of(k: &Kernel, phase: IrPhase) -> Result<Self, LowerError> {
        let slices: Vec<(String, usize)> = k
            .cores_for(phase)
            .iter()
            .filter(|s| s.parts > 1)
            .map(|s| (s.dim.to_string(), s.parts))
            .collect();
        let cores: usize = slices.iter().map(|s| s.1).product();
        if cores > CORES {
            return Err(LowerError::Refused(format!(
                "{cores} cores; spyre has {CORES}"
            )));
        }
        let core_slice = (0..cores)
            .map(|c| {
                let mut rest = c;
                let mut coords = vec![0; slices.len()];
                for (i, (_, parts)) in slices.iter().enumerate().rev() {
                    coords[i] = rest % parts;
                    rest /= parts;
                }
                coords
            })
            .collect();
        Ok(Division {
            slices,
            core_slice,
            divisions: vec![],
        })
    }

    fn parts(&self, d: DimName) -> usize {
        self.slices
            .iter()
            .find(|s| s.0 == d.name())
            .map_or(1, |s| s.1)
    }

    /// The start of a core's slice of `d` (size `n` split evenly), as an affine of its slice.
    fn start(&self, d: DimName, n: usize) -> Affine {
        let parts = self.parts(d);
        if parts > 1 {
            Affine::of(d.name(), n / parts)
        } else {
            Affine::constant(0)
        }
    }
}

/// Ordered segments of one core's range of a dim: the declared blocks clipped to the core's
/// slice, relative to its start. Spyre runs one program per core, so the segments must be the
/// same on every slice.
fn segments(
    blocks: Option<&Blocks>,
    size: usize,
    parts: usize,
    what: &str,
) -> Result<Vec<(usize, usize)>, LowerError> {
    let len = size / parts;
    let ranges = blocks.map_or_else(|| vec![(0, size)], Blocks::ranges);
    let clip = |p: usize| -> Vec<(usize, usize)> {
        let (lo, hi) = (p * len, (p + 1) * len);
        ranges
            .iter()
            .map(|&(s, e)| (s.max(lo), e.min(hi)))
            .filter(|(s, e)| s < e)
            .map(|(s, e)| (s - lo, e - lo))
            .collect()
    };
    let first = clip(0);
    if (1..parts).any(|p| clip(p) != first) {
        return Err(LowerError::Refused(format!(
            "the {what} blocks do not repeat across the {parts} core slices of their dim; spyre runs one program per core"
        )));
    }
    Ok(first)
}

/// Cuts `(start, end)` segments into tiles of at most `tile` elements.
fn tiles(segs: &[(usize, usize)], tile: usize) -> Vec<(usize, usize)> {
    segs.iter()
        .flat_map(|&(s, e)| (s..e).step_by(tile).map(move |t| (t, (t + tile).min(e))))
        .collect()
}

/// Bump allocation of LX buffers, 128 B aligned; every buffer lives for the whole phase.
#[derive(Default)]
struct Plan {
    buffers: Vec<Buffer>,
    next: usize,
}

impl Plan {
    fn buf(&mut self, name: &str, elems: usize, dl16: bool) -> String {
        let bytes = elems * if dl16 { DL16 } else { F32 };
        self.buffers.push(Buffer {
            name: name.into(),
            addr: self.next,
            bytes,
            elems,
            dl16,
            live: (0, 0),
        });
        self.next = (self.next + bytes).next_multiple_of(STICK_BYTES);
        name.into()
    }

    fn finish(mut self, name: &str, div: Division, body: Vec<Op>) -> Result<Phase, LowerError> {
        let last = count_ops(&body).saturating_sub(1);
        self.buffers.iter_mut().for_each(|b| b.live = (0, last));
        if self.next > LX_BUDGET {
            let list: Vec<String> = self
                .buffers
                .iter()
                .map(|b| format!("{} {} B", b.name, b.bytes))
                .collect();
            return Err(LowerError::Refused(format!(
                "the {name} phase needs {} bytes of LX per core ({}); the budget is {LX_BUDGET}",
                self.next,
                list.join(", ")
            )));
        }
        Ok(Phase {
            name: name.into(),
            slices: div.slices,
            core_slice: div.core_slice,
            divisions: div.divisions,
            buffers: self.buffers,
            body,
        })
    }
}

/// Ops in a body, loops flattened.
pub fn count_ops(body: &[Op]) -> usize {
    body.iter()
        .map(|op| match op {
            Op::Loop {
                preheader,
                body,
                drain,
                ..
            } => 1 + count_ops(preheader) + count_ops(body) + count_ops(drain),
            _ => 1,
        })
        .sum()
}

/// The streaming tile along `dim`: the spec's `stream:` tile when it fixes one (refused when it
/// does not fit), else the widest that fits.
fn tile_for(
    k: &Kernel,
    dim: DimName,
    n: usize,
    fixed: usize,
    per_elem: usize,
) -> Result<usize, LowerError> {
    let Some(t) = k.schedule.stream.iter().find(|t| t.dim == dim) else {
        return pick_tile(n, fixed, per_elem);
    };
    let tile = t.size.min(n);
    let need = fixed + per_elem * tile;
    if need > LX_BUDGET {
        return Err(LowerError::Refused(format!(
            "the stream tile {dim} = {} needs {need} bytes of LX per core; the budget is {LX_BUDGET}",
            t.size
        )));
    }
    Ok(tile)
}

/// The widest whole-stick tile of `n` elements whose `fixed + per_elem * tile` bytes fit LX.
fn pick_tile(n: usize, fixed: usize, per_elem: usize) -> Result<usize, LowerError> {
    let stick = STICK_BYTES / DL16;
    let room = LX_BUDGET.saturating_sub(fixed) / per_elem.max(1);
    let tile = (room.min(n) / stick) * stick;
    if tile == 0 {
        return Err(LowerError::Refused(format!(
            "one {stick}-element tile of streamed weights needs {} bytes of LX beside {fixed} resident; the budget is {LX_BUDGET}",
            stick * per_elem
        )));
    }
    Ok(tile.min(n))
}

/// Gate/up over gathered routes: per route, per F tile, per H block (in declared order) an
/// indexed load of the gate and up tiles, a matmul and an add; H partials split across cores are
/// completed over the ring; the epilogue writes `gelu_tanh(g) * u`.
fn gate_up(k: &Kernel, s: &Sizes, phase: IrPhase, out: &str) -> Result<Phase, LowerError> {
    let div = Division::of(k, phase)?;
    let (tc, rc, fc) = (
        s.t / div.parts(DimName::T),
        s.r / div.parts(DimName::R),
        s.f / div.parts(DimName::F),
    );
    if tc > 1 {
        return Err(LowerError::NotYet(
            "gate/up over gathered routes with more than one token per core".into(),
        ));
    }
    let segs = segments(
        k.reduce_blocks(DimName::H),
        s.h,
        div.parts(DimName::H),
        "reduction",
    )?;
    let widest = segs.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let (t0, r0, f0, h0) = (
        div.start(DimName::T, s.t),
        div.start(DimName::R, s.r),
        div.start(DimName::F, s.f),
        div.start(DimName::H, s.h),
    );
    let mut plan = Plan::default();
    let mut body = vec![];
    // Resident: this core's x, one buffer per H segment.
    let xs: Vec<String> = segs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| plan.buf(&format!("x{i}"), tc * (b - a), true))
        .collect();
    // Streamed: gate and up tiles (double-buffered as a pair), one partial, g/u accumulators, a.
    let fixed = plan.next + 4 * STICK_BYTES;
    let tile = tile_for(k, DimName::F, fc, fixed, 2 * widest * DL16 + 4 * F32 + F32)?;
    let (wg, wu) = (
        plan.buf("w_gate", widest * tile, true),
        plan.buf("w_up", widest * tile, true),
    );
    let part = plan.buf("part", tile, false);
    let (g, u, a) = (
        plan.buf("g", tile, false),
        plan.buf("u", tile, false),
        plan.buf("a", tile, false),
    );
    for (x, &(a0, a1)) in xs.iter().zip(&segs) {
        let start = vec![t0.clone(), add(&h0, a0)];
        body.push(Op::DmaIn {
            region: Region {
                tensor: "x".into(),
                start,
                extent: vec![tc, a1 - a0],
            },
            to: x.clone(),
        });
    }
    let h_split = div.parts(DimName::H) > 1;
    for ti in 0..tc {
        for ri in 0..rc {
            let slot = slot(&t0, &r0, ti, ri, s.r);
            let route = RouteRef {
                routes: "idx".into(),
                slot,
            };
            for &(c0, c1) in &tiles(&[(0, fc)], tile) {
                let n = c1 - c0;
                for (acc, w, bank) in [(&g, &wg, "gate"), (&u, &wu, "up")] {
                    body.push(Op::Sfp(Sfp::Zero {
                        out: acc.clone(),
                        elems: n,
                    }));
                    for (x, &(a0, a1)) in xs.iter().zip(&segs) {
                        let start = vec![Affine::constant(0), add(&h0, a0), add(&f0, c0)];
                        let region = Region {
                            tensor: bank.into(),
                            start,
                            extent: vec![1, a1 - a0, n],
                        };
                        body.push(Op::IndexedLoad {
                            region,
                            route: route.clone(),
                            to: w.clone(),
                        });
                        // x row `ti` of this segment is at offset ti * len: a 1-row matmul per token.
                        body.push(Op::Matmul {
                            a_at: Affine::default(),
                            a: x.clone(),
                            b: w.clone(),
                            out: part.clone(),
                            m: 1,
                            k: a1 - a0,
                            n,
                            accumulate: false,
                        });
                        body.push(Op::Sfp(Sfp::Add {
                            acc: acc.clone(),
                            part: part.clone(),
                            elems: n,
                        }));
                    }
                    if h_split {
                        body.push(Op::RingReduce {
                            buffer: acc.clone(),
                            dim: "H".into(),
                            elems: n,
                        });
                    }
                }
                body.push(Op::Sfp(Sfp::act_mul(
                    k.activation,
                    g.clone(),
                    u.clone(),
                    a.clone(),
                    n,
                )));
                let start = vec![add(&t0, ti), add(&r0, ri), add(&f0, c0)];
                let region = Region {
                    tensor: out.into(),
                    start,
                    extent: vec![1, 1, n],
                };
                body.push(Op::DmaOut {
                    from: a.clone(),
                    region,
                    owner: owner(&div, &["H"]),
                });
            }
        }
    }
    plan.finish("gate_up", div, body)
}

/// Down over gathered routes with the K-axis combine: per route, per column tile (column blocks in
/// order), per F block an indexed load, a matmul and an add; F partials split across cores are
/// completed over the ring; each route's result is scaled by its weight into the token's
/// accumulator in route order, completed over the ring when routes are split across cores.
fn down(k: &Kernel, s: &Sizes, phase: IrPhase, act: &str) -> Result<Phase, LowerError> {
    let div = Division::of(k, phase)?;
    let (tc, rc, hc) = (
        s.t / div.parts(DimName::T),
        s.r / div.parts(DimName::R),
        s.h / div.parts(DimName::H),
    );
    if tc > 1 {
        return Err(LowerError::NotYet(
            "down over gathered routes with more than one token per core".into(),
        ));
    }
    let fsegs = segments(
        k.reduce_blocks(DimName::F),
        s.f,
        div.parts(DimName::F),
        "reduction",
    )?;
    let cols = segments(
        k.column_blocks(DimName::H),
        s.h,
        div.parts(DimName::H),
        "column",
    )?;
    let widest = fsegs.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let (t0, r0, h0, f0) = (
        div.start(DimName::T, s.t),
        div.start(DimName::R, s.r),
        div.start(DimName::H, s.h),
        div.start(DimName::F, s.f),
    );
    let mut plan = Plan::default();
    let w = plan.buf("weights", tc * s.r, false);
    let acc = plan.buf("acc", tc * hc, false);
    let a_bufs: Vec<String> = fsegs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| plan.buf(&format!("a{i}"), b - a, true))
        .collect();
    let fixed = plan.next + 4 * STICK_BYTES;
    let tile = tile_for(
        k,
        DimName::H,
        cols.iter().map(|(a, b)| b - a).max().unwrap_or(0),
        fixed,
        widest * DL16 + 2 * F32,
    )?;
    let wt = plan.buf("w_down", widest * tile, true);
    let part = plan.buf("part", tile, false);
    let y = plan.buf("y", tile, false);
    let mut body = vec![
        Op::DmaIn {
            region: Region {
                tensor: "weights".into(),
                start: vec![t0.clone(), Affine::constant(0)],
                extent: vec![tc, s.r],
            },
            to: w.clone(),
        },
        Op::Sfp(Sfp::Zero {
            out: acc.clone(),
            elems: tc * hc,
        }),
    ];
    for ri in 0..rc {
        let slot = slot(&t0, &r0, 0, ri, s.r);
        let route = RouteRef {
            routes: "idx".into(),
            slot,
        };
        for (a, &(a0, a1)) in a_bufs.iter().zip(&fsegs) {
            let start = vec![t0.clone(), add(&r0, ri), add(&f0, a0)];
            body.push(Op::DmaIn {
                region: Region {
                    tensor: act.into(),
                    start,
                    extent: vec![1, 1, a1 - a0],
                },
                to: a.clone(),
            });
        }
        for &(c0, c1) in &tiles(&cols, tile) {
            let n = c1 - c0;
            body.push(Op::Sfp(Sfp::Zero {
                out: y.clone(),
                elems: n,
            }));
            for (a, &(a0, a1)) in a_bufs.iter().zip(&fsegs) {
                let start = vec![Affine::constant(0), add(&f0, a0), add(&h0, c0)];
                let region = Region {
                    tensor: "down".into(),
                    start,
                    extent: vec![1, a1 - a0, n],
                };
                body.push(Op::IndexedLoad {
                    region,
                    route: route.clone(),
                    to: wt.clone(),
                });
                body.push(Op::Matmul {
                    a_at: Affine::default(),
                    a: a.clone(),
                    b: wt.clone(),
                    out: part.clone(),
                    m: 1,
                    k: a1 - a0,
                    n,
                    accumulate: false,
                });
                body.push(Op::Sfp(Sfp::Add {
                    acc: y.clone(),
                    part: part.clone(),
                    elems: n,
                }));
            }
            if div.parts(DimName::F) > 1 {
                body.push(Op::RingReduce {
                    buffer: y.clone(),
                    dim: "F".into(),
                    elems: n,
                });
            }
            // The weights buffer holds this core's tokens' routes: index it locally.
            let w_at = self::slot(&Affine::constant(0), &r0, 0, ri, s.r);
            body.push(Op::Sfp(Sfp::ScaleAcc {
                acc: acc.clone(),
                acc_at: c0,
                y: y.clone(),
                y_at: 0,
                w: w.clone(),
                w_at,
                elems: n,
            }));
        }
    }
    if div.parts(DimName::R) > 1 {
        body.push(Op::RingReduce {
            buffer: acc.clone(),
            dim: "R".into(),
            elems: tc * hc,
        });
    }
    let region = Region {
        tensor: "out".into(),
        start: vec![t0, h0],
        extent: vec![tc, hc],
    };
    body.push(Op::DmaOut {
        from: acc,
        region,
        owner: owner(&div, &["R", "F"]),
    });
    plan.finish("down", div, body)
}

/// The persistent expert loop (docs/spyre-program.md, "The persistent expert loop"): x staged once (preheader), the accumulator
/// filled once, a counted loop over experts whose body stays in LX with exactly four advancing
/// operands (gate, up, down, routing), one drain.
///
/// Every core is in three divisions at once: gate/up `T x H` (its x slice; the H partials are
/// completed over the ring), down `T x H` (its accumulator: tokens by output columns) and the token
/// groups. The down tokens of a core must lie inside its gate/up tokens, so the activation never
/// changes owner (no LX transfers are lowered yet). Per trip and F tile: gate and up tiles, two
/// matmuls, the ring, `gelu(g) * u`, the down tile and a matmul accumulating over F in order; then
/// each token's row is scaled by its routing stick into the accumulator.
fn persistent(k: &Kernel, s: &Sizes) -> Result<Phase, LowerError> {
    let part = |phase, d: DimName| {
        k.cores_for(phase)
            .iter()
            .find(|x| x.dim == d)
            .map_or(1, |x| x.parts)
    };
    let (pt, ph) = (
        part(IrPhase::GateUp, DimName::T),
        part(IrPhase::GateUp, DimName::H),
    );
    let (pdt, pdh) = (
        part(IrPhase::Down, DimName::T),
        part(IrPhase::Down, DimName::H),
    );
    let cores = pt * ph;
    let groups = k.schedule.groups.map_or(cores, |g| g.parts);
    let other = k
        .cores_for(IrPhase::GateUp)
        .iter()
        .chain(k.cores_for(IrPhase::Down))
        .any(|x| !matches!(x.dim, DimName::T | DimName::H) && x.parts > 1);
    if other || !k.schedule.reduce.is_empty() || !k.schedule.columns.is_empty() {
        return Err(LowerError::NotYet(
            "a persistent loop with splits other than T and H, or with blocks".into(),
        ));
    }
    if k.schedule.persistent.is_none() {
        return Err(LowerError::NotYet(
            "`select: dense E` without `loop: E persistent`".into(),
        ));
    }
    if pdt * pdh != cores || groups != cores || cores > CORES {
        return Err(LowerError::Refused(format!(
            "gate/up uses {pt} x {ph} cores, down {pdt} x {pdh}, groups {groups}: one persistent loop needs the same cores (at most {CORES}) in all three"
        )));
    }
    let (tg, hg, td, hd) = (s.t / pt, s.h / ph, s.t / pdt, s.h / pdh);
    // Core c: gate/up slice (c / ph, c % ph), down slice (c / pdh, c % pdh), group c; its down
    // tokens are sub-slice `sub` of its gate/up tokens.
    let per = td.max(1);
    let subs = (tg / per).max(1);
    let fits = (0..cores).all(|c| {
        let (g0, d0) = ((c / ph) * tg, (c / pdh) * td);
        d0 >= g0 && d0 + td <= g0 + tg
    });
    if !fits || tg % per != 0 {
        return Err(LowerError::NotYet(format!(
            "down token slices ({td} tokens) that are not inside the same core's gate/up token slice ({tg}): LX ownership transfers"
        )));
    }
    let slices: Vec<(String, usize)> = vec![
        ("T".into(), pt),
        ("H".into(), ph),
        ("Td".into(), pdt),
        ("Hd".into(), pdh),
        ("G".into(), groups),
        ("Tsub".into(), subs),
    ];
    let core_slice = (0..cores)
        .map(|c| {
            let (g0, d0) = ((c / ph) * tg, (c / pdh) * td);
            vec![c / ph, c % ph, c / pdh, c % pdh, c, (d0 - g0) / per]
        })
        .collect();
    let divisions = vec![
        vec!["T".to_string(), "H".to_string()],
        vec!["Td".to_string(), "Hd".to_string()],
        vec!["G".to_string()],
    ];
    let div = Division {
        slices,
        core_slice,
        divisions,
    };
    let lanes = STICK_BYTES / F32;
    let mut plan = Plan::default();
    let x = plan.buf("x", tg * hg, true);
    let acc = plan.buf("acc", td * hd, false);
    let y = plan.buf("y", td * hd, false);
    let rw = plan.buf("routing", td * lanes, false);
    let fixed = plan.next + 8 * STICK_BYTES;
    let tile = tile_for(
        k,
        DimName::F,
        s.f,
        fixed,
        2 * hg * DL16 + 2 * tg * F32 + tg * DL16 + hd * DL16,
    )?;
    let (wg, wu) = (
        plan.buf("w_gate", hg * tile, true),
        plan.buf("w_up", hg * tile, true),
    );
    let (g, u) = (
        plan.buf("g", tg * tile, false),
        plan.buf("u", tg * tile, false),
    );
    let a = plan.buf("a", tg * tile, true);
    let wd = plan.buf("w_down", tile * hd, true);
    let (t0, h0) = (Affine::of("T", tg), Affine::of("H", hg));
    let (d0, e0) = (Affine::of("Td", td), Affine::of("Hd", hd));
    let preheader = vec![
        Op::DmaIn {
            region: Region {
                tensor: "x".into(),
                start: vec![t0, h0.clone()],
                extent: vec![tg, hg],
            },
            to: x.clone(),
        },
        Op::Sfp(Sfp::Zero {
            out: acc.clone(),
            elems: td * hd,
        }),
    ];
    let zero = Affine::constant(0);
    let mut body = vec![
        Op::Sfp(Sfp::Zero {
            out: y.clone(),
            elems: td * hd,
        }),
        Op::DmaIn {
            region: Region {
                tensor: "routes".into(),
                start: vec![zero.clone(), d0.clone(), zero.clone()],
                extent: vec![1, td, lanes],
            },
            to: rw.clone(),
        },
    ];
    for (c0, c1) in tiles(&[(0, s.f)], tile) {
        let n = c1 - c0;
        for (bank, w, out) in [("gate", &wg, &g), ("up", &wu, &u)] {
            let region = Region {
                tensor: bank.into(),
                start: vec![zero.clone(), h0.clone(), Affine::constant(c0)],
                extent: vec![1, hg, n],
            };
            body.push(Op::DmaIn {
                region,
                to: w.clone(),
            });
            body.push(Op::Matmul {
                a: x.clone(),
                a_at: Affine::default(),
                b: w.clone(),
                out: out.clone(),
                m: tg,
                k: hg,
                n,
                accumulate: false,
            });
            if ph > 1 {
                body.push(Op::RingReduce {
                    buffer: out.clone(),
                    dim: "H".into(),
                    elems: tg * n,
                });
            }
        }
        body.push(Op::Sfp(Sfp::act_mul(
            k.activation,
            g.clone(),
            u.clone(),
            a.clone(),
            tg * n,
        )));
        let region = Region {
            tensor: "down".into(),
            start: vec![zero.clone(), Affine::constant(c0), e0.clone()],
            extent: vec![1, n, hd],
        };
        body.push(Op::DmaIn {
            region,
            to: wd.clone(),
        });
        // This core's down tokens are rows `sub * td ..` of its gate/up activation tile.
        body.push(Op::Matmul {
            a: a.clone(),
            a_at: Affine::of("Tsub", td * n),
            b: wd.clone(),
            out: y.clone(),
            m: td,
            k: n,
            n: hd,
            accumulate: true,
        });
    }
    for row in 0..td {
        body.push(Op::Sfp(Sfp::ScaleAcc {
            acc: acc.clone(),
            acc_at: row * hd,
            y: y.clone(),
            y_at: row * hd,
            w: rw.clone(),
            w_at: Affine::constant(row * lanes),
            elems: hd,
        }));
    }
    let advancing = ["gate", "up", "down", "routes"]
        .map(|t| Advance {
            tensor: t.into(),
            per_trip: 1,
        })
        .to_vec();
    let drain = vec![Op::DmaOut {
        from: acc,
        region: Region {
            tensor: "out".into(),
            start: vec![d0, e0],
            extent: vec![td, hd],
        },
        owner: vec![],
    }];
    let looped = Op::Loop {
        trips: s.e,
        advancing,
        preheader,
        body,
        drain,
    };
    plan.finish("expert_loop", div, vec![looped])
}

/// `a + c`.
fn add(a: &Affine, c: usize) -> Affine {
    Affine {
        constant: a.constant + c,
        terms: a.terms.clone(),
    }
}

/// The route slot `(t0 + ti) * R + r0 + ri`.
fn slot(t0: &Affine, r0: &Affine, ti: usize, ri: usize, r: usize) -> Affine {
    let mut a = Affine::constant(ti * r + ri);
    a.terms
        .extend(t0.terms.iter().map(|(d, c)| (d.clone(), c * r)));
    a.terms.extend(r0.terms.iter().cloned());
    a
}

/// Cores whose slice is 0 in each of `dims` that the division splits (they write the result).
fn owner(div: &Division, dims: &[&str]) -> Vec<(String, usize)> {
    div.slices
        .iter()
        .filter(|(d, _)| dims.contains(&d.as_str()))
        .map(|(d, _)| (d.clone(), 0))
        .collect()
}
