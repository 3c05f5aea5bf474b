//! A functional simulator: every core of every phase executes the program's ops in lockstep (ring
//! reductions need all of a group at once; counted loops run trip by trip), on real data, in DL16
//! or exact f32, counting the bytes each core moves between device memory and LX, over the ring,
//! and its multiply-adds. Cores run in parallel between ops that couple them.

use crate::dl16;
use crate::validate::{ValidationError, validate};
use crate::walk::{Loop, Visit, walk};
use moek_ir::Activation;
use moek_ir::spyre::*;
use rayon::prelude::*;
use std::collections::HashMap;
use thiserror::Error;

/// A core's read in one op: the core and its bytes.
type Read = (usize, u64);

/// Cores that share one broadcast read of device memory (torch-spyre's cost model constant).
pub const BROADCAST: usize = 8;

/// Number handling of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Device tensors and DL16 buffers hold DL16 values (rounded on every write); matmul
    /// accumulators stay f32, as on the device.
    Dl16,
    /// Everything exact f32 (to separate the format's error from the schedule's).
    F32,
    /// No values: every op is walked and counted (bytes, ring traffic, MACs, as the other modes
    /// count them) but nothing is computed, so a schedule search can cost a full-size program
    /// in milliseconds. Only route tensors need be bound (they pick the rows read).
    Count,
}

/// One device tensor's values.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    /// Packed DL16 (`dl16::encode`): two bytes an element, as on the card.
    Dl16(Vec<u16>),
}

impl Data {
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::Dl16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self, off: usize, dst: &mut [f32]) {
        match self {
            Data::F32(v) => dst.copy_from_slice(&v[off..off + dst.len()]),
            Data::Dl16(v) => dl16::decode_slice(&v[off..off + dst.len()], dst),
        }
    }

    fn write(&mut self, off: usize, src: &[f32], round: bool) {
        match self {
            Data::F32(v) => {
                for (d, s) in v[off..off + src.len()].iter_mut().zip(src) {
                    *d = if round { dl16::round(*s) } else { *s };
                }
            }
            Data::Dl16(v) => dl16::encode_slice(src, &mut v[off..off + src.len()]),
        }
    }

    /// Writes block `b` (elements `b * len..(b + 1) * len`) from `make(b)` for every `b` in
    /// `blocks`, blocks in parallel (binding a bank of experts).
    pub fn write_blocks(
        &mut self,
        len: usize,
        blocks: &[usize],
        make: impl Fn(usize) -> Vec<f32> + Sync,
    ) {
        fn each<T: Send>(
            v: &mut [T],
            len: usize,
            blocks: &[usize],
            put: impl Fn(usize, &mut [T]) + Sync,
        ) {
            v.par_chunks_mut(len)
                .enumerate()
                .filter(|(b, _)| blocks.contains(b))
                .for_each(|(b, dst)| put(b, dst));
        }
        match self {
            Data::F32(v) => each(v, len, blocks, |b, dst| dst.copy_from_slice(&make(b))),
            Data::Dl16(v) => each(v, len, blocks, |b, dst| dl16::encode_slice(&make(b), dst)),
        }
    }

    /// Writes `src` from element `off`, in the tensor's format (DL16 data rounds).
    pub fn write_at(&mut self, off: usize, src: &[f32]) {
        self.write(off, src, false);
    }

    /// All values as f32 (for reading results back).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.read(0, &mut out);
        out
    }
}

/// Device memory: every tensor by name, logical row-major values (route indices apart). Whoever
/// binds host data gives 2-byte tensors as `Data::Dl16` in DL16 mode.
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub tensors: HashMap<String, Data>,
    pub routes: HashMap<String, Vec<u32>>,
}

/// What one core did in one phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes from device memory into LX (whole sticks).
    pub dev_to_lx: u64,
    /// Bytes from LX to device memory (whole sticks).
    pub lx_to_dev: u64,
    /// Bytes this core sent over the ring.
    pub ring: u64,
    pub macs: u64,
    /// Highest LX byte its plan uses.
    pub lx_peak: usize,
}

/// The counters of one phase, per core.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseCounters {
    pub phase: String,
    pub cores: Vec<Counters>,
    /// The phase's selected-weight copy (`Stage::selected_copy`), made before its cores run.
    pub selected_copy: u64,
}

#[derive(Debug, Error, PartialEq)]
pub enum SimError {
    #[error("the program is invalid: {0}")]
    Invalid(#[from] ValidationError),
    #[error("device tensor `{name}` has {got} values; the program declares {expected}")]
    Tensor {
        name: String,
        expected: usize,
        got: usize,
    },
    #[error("route {route} at slot {slot} of `{routes}` is outside the bank's {experts} experts")]
    Route {
        routes: String,
        slot: usize,
        route: u32,
        experts: usize,
    },
}

/// Validates `p`, then runs it on `dev`, which receives the outputs.
pub fn simulate(p: &Program, mode: Mode, dev: &mut Device) -> Result<Vec<PhaseCounters>, SimError> {
    validate(p)?;
    for t in &p.tensors {
        let expected: usize = t.shape.iter().product();
        let got = if t.role == DeviceRole::Routes {
            dev.routes.get(&t.name).map_or(0, Vec::len)
        } else if mode == Mode::Count {
            continue;
        } else {
            dev.tensors.get(&t.name).map_or(0, Data::len)
        };
        if got != expected {
            return Err(SimError::Tensor {
                name: t.name.clone(),
                expected,
                got,
            });
        }
    }
    p.phases
        .iter()
        .map(|ph| Run::new(p, ph, mode).phase(dev))
        .collect()
}

/// The simulator's walk: every trip of a loop runs, its advancing operands moved on per trip.
struct Exec<'r, 'a> {
    run: &'r mut Run<'a>,
    dev: &'r mut Device,
}

impl<'a> Visit<'a> for Exec<'_, 'a> {
    type Error = SimError;

    fn leaf(&mut self, op: &'a Instr, _: usize) -> Result<(), SimError> {
        self.run.op(op, self.dev)
    }

    fn enter(&mut self, lp: &Loop<'a>, _: usize) -> Result<usize, SimError> {
        Ok(lp.trips)
    }

    fn trip(&mut self, lp: &Loop<'a>, trip: usize) -> Result<(), SimError> {
        for a in lp.advancing {
            self.run.advanced.insert(&a.tensor, trip * a.per_trip);
        }
        Ok(())
    }

    fn leave(&mut self, _: &Loop<'a>) -> Result<(), SimError> {
        self.run.advanced.clear();
        Ok(())
    }
}

/// One core's LX and counters.
struct Core<'a> {
    coords: &'a [usize],
    lx: HashMap<&'a str, Vec<f32>>,
    counters: Counters,
    /// The device read of the current op: tensor, start, bytes (charged after the op, when the
    /// cores that read the same region share broadcast reads).
    read: Option<(String, Vec<usize>, u64)>,
}

struct Run<'a> {
    p: &'a Program,
    ph: &'a Stage,
    mode: Mode,
    cores: Vec<Core<'a>>,
    /// Rows of their first dim the advancing tensors have moved (inside a loop).
    advanced: HashMap<&'a str, usize>,
}

impl<'a> Run<'a> {
    fn new(p: &'a Program, ph: &'a Stage, mode: Mode) -> Self {
        let peak = ph
            .buffers
            .iter()
            .map(|b| b.addr + b.bytes)
            .max()
            .unwrap_or(0);
        let cores = ph
            .core_slice
            .iter()
            .map(|coords| Core {
                coords,
                lx: ph
                    .buffers
                    .iter()
                    .map(|b| {
                        let elems = if mode == Mode::Count { 0 } else { b.elems };
                        (b.name.as_str(), vec![0f32; elems])
                    })
                    .collect(),
                counters: Counters {
                    lx_peak: peak,
                    ..Counters::default()
                },
                read: None,
            })
            .collect();
        Run {
            p,
            ph,
            mode,
            cores,
            advanced: HashMap::new(),
        }
    }

    fn phase(mut self, dev: &mut Device) -> Result<PhaseCounters, SimError> {
        let body = &self.ph.body;
        walk(
            body,
            &mut Exec {
                run: &mut self,
                dev,
            },
        )?;
        Ok(PhaseCounters {
            phase: self.ph.name.clone(),
            cores: self.cores.into_iter().map(|c| c.counters).collect(),
            selected_copy: self.ph.selected_copy,
        })
    }

    fn op(&mut self, op: &'a Instr, dev: &mut Device) -> Result<(), SimError> {
        match op {
            Instr::RingReduce { buffer, dim, elems } => self.ring(buffer, dim, *elems),
            Instr::Loop { .. } => unreachable!("the walk enters loops itself"),
            Instr::DmaOut {
                from,
                region,
                owner,
            } => {
                for core in 0..self.cores.len() {
                    self.dma_out(core, from, region, owner, dev);
                }
            }
            _ => {
                let ctx = Ctx {
                    p: self.p,
                    ph: self.ph,
                    mode: self.mode,
                    advanced: &self.advanced,
                    dev,
                };
                self.cores
                    .par_iter_mut()
                    .try_for_each(|core| ctx.on_core(core, op))?;
                self.charge_reads();
            }
        }
        Ok(())
    }

    fn dma_out(
        &mut self,
        core: usize,
        from: &str,
        region: &Region,
        owner: &[(String, usize)],
        dev: &mut Device,
    ) {
        let c = &mut self.cores[core];
        let writes = owner.iter().all(|(d, want)| {
            self.ph
                .slices
                .iter()
                .position(|(n, _)| n == d)
                .is_none_or(|i| c.coords[i] == *want)
        });
        if !writes {
            return;
        }
        let t = self.p.tensor(&region.tensor).expect("validated");
        let start: Vec<usize> = region
            .start
            .iter()
            .map(|a| a.eval(&self.ph.slices, c.coords))
            .collect();
        c.counters.lx_to_dev += bytes(t, &region.extent);
        if self.mode == Mode::Count {
            return;
        }
        let round = self.mode == Mode::Dl16 && t.elem_bytes == 2;
        let src = &c.lx[from];
        let dst = dev.tensors.get_mut(&t.name).expect("checked on entry");
        for (i, off, n) in runs(&t.shape, &start, &region.extent) {
            dst.write(off, &src[i..i + n], round);
        }
    }

    /// Charges the op's device reads: cores reading the same region share broadcast reads, up
    /// to [`BROADCAST`] cores per read (a public constant of the device's cost model).
    fn charge_reads(&mut self) {
        let mut groups: HashMap<(String, Vec<usize>), Vec<Read>> = HashMap::new();
        for (i, core) in self.cores.iter_mut().enumerate() {
            if let Some((tensor, start, bytes)) = core.read.take() {
                groups.entry((tensor, start)).or_default().push((i, bytes));
            }
        }
        for members in groups.into_values() {
            let (n, bytes) = (members.len() as u64, members[0].1);
            let total = bytes * n.div_ceil(BROADCAST as u64);
            // The group's reads, spread over its members (the remainder on the first).
            for (k, &(i, _)) in members.iter().enumerate() {
                self.cores[i].counters.dev_to_lx += total / n + if k == 0 { total % n } else { 0 };
            }
        }
    }

    /// The completed sum over the cores that differ only in `dim` within its work division, in
    /// slice order.
    fn ring(&mut self, buffer: &'a str, dim: &str, elems: usize) {
        let d = self
            .ph
            .slices
            .iter()
            .position(|(n, _)| n == dim)
            .expect("validated");
        let division: Vec<usize> = match self
            .ph
            .divisions
            .iter()
            .find(|g| g.iter().any(|n| n == dim))
        {
            Some(group) => group
                .iter()
                .filter_map(|n| self.ph.slices.iter().position(|s| &s.0 == n))
                .collect(),
            None => (0..self.ph.slices.len()).collect(),
        };
        let mut groups: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
        for (core, c) in self.cores.iter().enumerate() {
            let key: Vec<usize> = division
                .iter()
                .filter(|&&i| i != d)
                .map(|&i| c.coords[i])
                .collect();
            groups.entry(key).or_default().push(core);
        }
        let round = self.mode == Mode::Dl16 && self.ph.buffer(buffer).is_some_and(|b| b.dl16);
        for mut members in groups.into_values() {
            if self.mode == Mode::Count {
                for &core in &members {
                    self.cores[core].counters.ring += (elems * 4) as u64;
                }
                continue;
            }
            members.sort_by_key(|&core| self.cores[core].coords[d]);
            let mut sum = vec![0f32; elems];
            for &core in &members {
                sum.iter_mut()
                    .zip(&self.cores[core].lx[buffer])
                    .for_each(|(s, v)| *s += v);
                self.cores[core].counters.ring += (elems * 4) as u64;
            }
            if round {
                sum.iter_mut().for_each(|x| *x = dl16::round(*x));
            }
            for &core in &members {
                self.cores[core].lx.get_mut(buffer).expect("validated")[..elems]
                    .copy_from_slice(&sum);
            }
        }
    }
}

/// What a core's op reads besides its own LX.
struct Ctx<'a, 'd> {
    p: &'a Program,
    ph: &'a Stage,
    mode: Mode,
    advanced: &'d HashMap<&'a str, usize>,
    dev: &'d Device,
}

impl<'a> Ctx<'a, '_> {
    fn on_core(&self, core: &mut Core<'a>, op: &'a Instr) -> Result<(), SimError> {
        let eval = |a: &Affine| a.eval(&self.ph.slices, core.coords);
        match op {
            Instr::DmaIn { region, to } => {
                let start: Vec<usize> = region.start.iter().map(eval).collect();
                self.load(core, region, start, to);
            }
            Instr::IndexedLoad { region, route, to } => {
                let t = self.p.tensor(&region.tensor).expect("validated");
                let slot = eval(&route.slot);
                let e = self.dev.routes[&route.routes][slot];
                if e as usize >= t.shape[0] {
                    return Err(SimError::Route {
                        routes: route.routes.clone(),
                        slot,
                        route: e,
                        experts: t.shape[0],
                    });
                }
                let mut start: Vec<usize> = region.start.iter().map(eval).collect();
                start[0] = e as usize;
                self.load(core, region, start, to);
            }
            Instr::Matmul {
                a,
                a_at,
                b,
                out,
                m,
                k,
                n,
                accumulate,
            } => {
                core.counters.macs += (m * k * n) as u64;
                if self.mode == Mode::Count {
                    return Ok(());
                }
                let mut o = std::mem::take(core.lx.get_mut(out.as_str()).expect("validated"));
                let at = eval(a_at);
                let (av, bv) = (&core.lx[a.as_str()][at..at + m * k], &core.lx[b.as_str()]);
                if !accumulate {
                    o[..m * n].fill(0.0);
                }
                crate::matmul::matmul(av, bv, &mut o, *m, *k, *n);
                self.store(core, out, o);
            }
            Instr::Sfp(_) if self.mode == Mode::Count => {}
            Instr::Sfp(sfp) => self.sfp(core, sfp),
            Instr::RingReduce { .. } | Instr::Loop { .. } | Instr::DmaOut { .. } => {
                unreachable!("run across cores")
            }
        }
        Ok(())
    }

    /// Device -> LX: the region (advanced by the loop's trip for advancing tensors).
    fn load(&self, core: &mut Core<'a>, region: &Region, mut start: Vec<usize>, to: &'a str) {
        let t = self.p.tensor(&region.tensor).expect("validated");
        start[0] += self.advanced.get(t.name.as_str()).copied().unwrap_or(0);
        let read = bytes(t, &region.extent);
        if self.mode == Mode::Count {
            core.read = Some((t.name.clone(), start, read));
            return;
        }
        let src = &self.dev.tensors[&t.name];
        let dst = core.lx.get_mut(to).expect("validated");
        for (i, off, n) in runs(&t.shape, &start, &region.extent) {
            src.read(off, &mut dst[i..i + n]);
        }
        core.read = Some((t.name.clone(), start, read));
    }

    fn sfp(&self, core: &mut Core<'a>, sfp: &'a Sfp) {
        let eval = |a: &Affine| a.eval(&self.ph.slices, core.coords);
        let lx = &mut core.lx;
        let (name, o) = match sfp {
            Sfp::Zero { out, elems } => {
                let mut o = std::mem::take(lx.get_mut(out.as_str()).expect("validated"));
                o[..*elems].fill(0.0);
                (out, o)
            }
            Sfp::Add { acc, part, elems } => {
                let mut o = std::mem::take(lx.get_mut(acc.as_str()).expect("validated"));
                o[..*elems]
                    .iter_mut()
                    .zip(&lx[part.as_str()])
                    .for_each(|(a, p)| *a += p);
                (acc, o)
            }
            Sfp::GeluMul { g, u, out, elems }
            | Sfp::SiluMul { g, u, out, elems }
            | Sfp::SwigluClampedMul {
                g, u, out, elems, ..
            } => {
                let gated = |g, u| match sfp.activation().expect("a gated-pair op") {
                    Activation::GeluTanh => moek_ir::scalar::gelu_tanh(g) * u,
                    Activation::Silu => moek_ir::scalar::silu(g) * u,
                    Activation::SwigluClamped { limit, alpha } => {
                        moek_ir::scalar::swiglu_clamped(g, u, limit, alpha)
                    }
                };
                let mut o = std::mem::take(lx.get_mut(out.as_str()).expect("validated"));
                let (gv, uv) = (&lx[g.as_str()], &lx[u.as_str()]);
                for i in 0..*elems {
                    o[i] = gated(gv[i], uv[i]);
                }
                (out, o)
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
                let mut o = std::mem::take(lx.get_mut(acc.as_str()).expect("validated"));
                let wv = lx[w.as_str()][eval(w_at)];
                let yv = &lx[y.as_str()][*y_at..y_at + elems];
                o[*acc_at..acc_at + elems]
                    .iter_mut()
                    .zip(yv)
                    .for_each(|(a, y)| *a += wv * y);
                (acc, o)
            }
        };
        self.store(core, name, o);
    }

    /// Puts a buffer back, rounding it when it is a DL16 buffer in DL16 mode.
    fn store(&self, core: &mut Core<'a>, name: &'a str, mut v: Vec<f32>) {
        if self.mode == Mode::Dl16 && self.ph.buffer(name).is_some_and(|b| b.dl16) {
            v.iter_mut().for_each(|x| *x = dl16::round(*x));
        }
        core.lx.insert(name, v);
    }
}

/// The region's contiguous runs along the last dim: (offset in the region, offset in the tensor,
/// length), row-major.
fn runs<'s>(
    shape: &'s [usize],
    start: &'s [usize],
    extent: &'s [usize],
) -> impl Iterator<Item = (usize, usize, usize)> + 's {
    let rank = shape.len();
    let len = extent[rank - 1];
    let rows: usize = extent[..rank - 1].iter().product();
    (0..rows).map(move |mut row| {
        let i = row * len;
        let mut off = start[rank - 1];
        let mut stride = shape[rank - 1];
        for d in (0..rank - 1).rev() {
            off += (start[d] + row % extent[d]) * stride;
            row /= extent[d];
            stride *= shape[d];
        }
        (i, off, len)
    })
}

/// `[rows, cols]` -> `[cols, rows]`, in cache-sized blocks (also how hosts put checkpoint
/// layouts into the device's stick layouts).
pub fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    // Blocks of 8 columns: each source row gives 8 neighbours, written to 8 output rows, so
    // every line read and written is used whole while the block is in cache.
    const B: usize = 8;
    let mut t = vec![0f32; rows * cols];
    for c0 in (0..cols).step_by(B) {
        let w = B.min(cols - c0);
        for (r, row) in m[..rows * cols].chunks_exact(cols).enumerate() {
            for (j, &v) in row[c0..c0 + w].iter().enumerate() {
                t[(c0 + j) * rows + r] = v;
            }
        }
    }
    t
}

/// Bytes a DMA of `extent` moves: whole sticks along the last dim.
fn bytes(t: &Tensor, extent: &[usize]) -> u64 {
    let (last, outer) = extent.split_last().expect("regions have a dim");
    (outer.iter().product::<usize>() * last.div_ceil(t.stick_elems) * t.stick_elems * t.elem_bytes)
        as u64
}
