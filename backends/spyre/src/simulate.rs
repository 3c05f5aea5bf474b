//! A functional simulator: every core of every phase executes the program's ops in lockstep (ring
//! reductions need all of a group at once), on real data, in DL16 or exact f32, counting the
//! bytes each core moves between device memory and LX, over the ring, and its multiply-adds.

use crate::dl16;
use crate::validate::{ValidationError, validate};
use moek_dsl::reference::gelu_tanh;
use moek_dsl::spyre::program::*;
use std::collections::HashMap;
use thiserror::Error;

/// Number handling of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Device tensors and DL16 buffers hold DL16 values (rounded on upload and on every write);
    /// matmul accumulators stay f32, as on the device.
    Dl16,
    /// Everything exact f32 (to separate the format's error from the schedule's).
    F32,
}

/// Device memory: every tensor by name, logical row-major values (route indices apart). Values
/// are already in the device's format: whoever binds host data rounds 2-byte tensors to DL16 in
/// DL16 mode (`dl16::round`).
#[derive(Clone, Debug, Default)]
pub struct Device {
    pub tensors: HashMap<String, Vec<f32>>,
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
    #[error("the simulator does not run counted loops yet")]
    Loop,
}

/// Validates `p`, then runs it on `dev`, which receives the outputs.
pub fn simulate(p: &Program, mode: Mode, dev: &mut Device) -> Result<Vec<PhaseCounters>, SimError> {
    validate(p)?;
    for t in &p.tensors {
        let expected: usize = t.shape.iter().product();
        let got = if t.role == Role::Routes {
            dev.routes.get(&t.name).map_or(0, Vec::len)
        } else {
            dev.tensors.get(&t.name).map_or(0, Vec::len)
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

struct Run<'a> {
    p: &'a Program,
    ph: &'a Phase,
    mode: Mode,
    lx: Vec<HashMap<&'a str, Vec<f32>>>,
    counters: Vec<Counters>,
}

impl<'a> Run<'a> {
    fn new(p: &'a Program, ph: &'a Phase, mode: Mode) -> Self {
        let peak = ph
            .buffers
            .iter()
            .map(|b| b.addr + b.bytes)
            .max()
            .unwrap_or(0);
        let lx = ph
            .core_slice
            .iter()
            .map(|_| {
                ph.buffers
                    .iter()
                    .map(|b| (b.name.as_str(), vec![0f32; b.elems]))
                    .collect()
            })
            .collect();
        let counters = vec![
            Counters {
                lx_peak: peak,
                ..Counters::default()
            };
            ph.core_slice.len()
        ];
        Run {
            p,
            ph,
            mode,
            lx,
            counters,
        }
    }

    fn phase(mut self, dev: &mut Device) -> Result<PhaseCounters, SimError> {
        for op in &self.ph.body {
            self.op(op, dev)?;
        }
        Ok(PhaseCounters {
            phase: self.ph.name.clone(),
            cores: self.counters,
        })
    }

    fn op(&mut self, op: &'a Op, dev: &mut Device) -> Result<(), SimError> {
        let cores = self.ph.core_slice.len();
        match op {
            Op::RingReduce { buffer, dim, elems } => self.ring(buffer, dim, *elems),
            Op::Loop { .. } => return Err(SimError::Loop),
            _ => {
                for core in 0..cores {
                    self.on_core(core, op, dev)?;
                }
            }
        }
        Ok(())
    }

    fn on_core(&mut self, core: usize, op: &'a Op, dev: &mut Device) -> Result<(), SimError> {
        let coords = &self.ph.core_slice[core];
        let eval = |a: &Affine| a.eval(&self.ph.slices, coords);
        match op {
            Op::DmaIn { region, to } => {
                let t = self.p.tensor(&region.tensor).expect("validated");
                let start: Vec<usize> = region.start.iter().map(eval).collect();
                let src = &dev.tensors[&t.name];
                let dst = self.lx[core].get_mut(to.as_str()).expect("validated");
                for (i, off, n) in runs(&t.shape, &start, &region.extent) {
                    dst[i..i + n].copy_from_slice(&src[off..off + n]);
                }
                self.counters[core].dev_to_lx += bytes(t, &region.extent);
            }
            Op::IndexedLoad { region, route, to } => {
                let t = self.p.tensor(&region.tensor).expect("validated");
                let slot = eval(&route.slot);
                let e = dev.routes[&route.routes][slot];
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
                let src = &dev.tensors[&t.name];
                let dst = self.lx[core].get_mut(to.as_str()).expect("validated");
                for (i, off, n) in runs(&t.shape, &start, &region.extent) {
                    dst[i..i + n].copy_from_slice(&src[off..off + n]);
                }
                self.counters[core].dev_to_lx += bytes(t, &region.extent);
            }
            Op::DmaOut {
                from,
                region,
                owner,
            } => {
                let writes = owner.iter().all(|(d, want)| {
                    self.ph
                        .slices
                        .iter()
                        .position(|(n, _)| n == d)
                        .is_none_or(|i| coords[i] == *want)
                });
                if writes {
                    let t = self.p.tensor(&region.tensor).expect("validated");
                    let start: Vec<usize> = region.start.iter().map(eval).collect();
                    let round = self.mode == Mode::Dl16 && t.elem_bytes == 2;
                    let src = &self.lx[core][from.as_str()];
                    let dst = dev.tensors.get_mut(&t.name).expect("checked on entry");
                    for (i, off, n) in runs(&t.shape, &start, &region.extent) {
                        for (d, v) in dst[off..off + n].iter_mut().zip(&src[i..i + n]) {
                            *d = if round { dl16::round(*v) } else { *v };
                        }
                    }
                    self.counters[core].lx_to_dev += bytes(t, &region.extent);
                }
            }
            Op::Matmul {
                a,
                b,
                out,
                m,
                k,
                n,
                accumulate,
            } => {
                let mut o = std::mem::take(self.lx[core].get_mut(out.as_str()).expect("validated"));
                let (av, bv) = (&self.lx[core][a.as_str()], &self.lx[core][b.as_str()]);
                if !accumulate {
                    o[..m * n].fill(0.0);
                }
                for i in 0..*m {
                    let row = &mut o[i * n..(i + 1) * n];
                    for p in 0..*k {
                        let x = av[i * k + p];
                        for (r, w) in row.iter_mut().zip(&bv[p * n..(p + 1) * n]) {
                            *r += x * w;
                        }
                    }
                }
                self.store(core, out, o);
                self.counters[core].macs += (m * k * n) as u64;
            }
            Op::Sfp(sfp) => self.sfp(core, sfp, &eval),
            Op::RingReduce { .. } | Op::Loop { .. } => unreachable!("handled across cores"),
        }
        Ok(())
    }

    fn sfp(&mut self, core: usize, sfp: &'a Sfp, eval: &dyn Fn(&Affine) -> usize) {
        let lx = &mut self.lx[core];
        let result = match sfp {
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
            Sfp::GeluMul { g, u, out, elems } => {
                let mut o = std::mem::take(lx.get_mut(out.as_str()).expect("validated"));
                for i in 0..*elems {
                    o[i] = (gelu_tanh(f64::from(lx[g.as_str()][i])) as f32) * lx[u.as_str()][i];
                }
                (out, o)
            }
            Sfp::ScaleAcc {
                acc,
                acc_at,
                y,
                w,
                w_at,
                elems,
            } => {
                let mut o = std::mem::take(lx.get_mut(acc.as_str()).expect("validated"));
                let wv = lx[w.as_str()][eval(w_at)];
                o[*acc_at..acc_at + elems]
                    .iter_mut()
                    .zip(&lx[y.as_str()])
                    .for_each(|(a, y)| *a += wv * y);
                (acc, o)
            }
        };
        self.store(core, result.0, result.1);
    }

    /// Puts a buffer back, rounding it when it is a DL16 buffer in DL16 mode.
    fn store(&mut self, core: usize, name: &'a str, mut v: Vec<f32>) {
        let dl16 = self.ph.buffer(name).is_some_and(|b| b.dl16);
        if dl16 && self.mode == Mode::Dl16 {
            v.iter_mut().for_each(|x| *x = dl16::round(*x));
        }
        self.lx[core].insert(name, v);
    }

    /// The completed sum over the cores that differ only in `dim`, in slice order.
    fn ring(&mut self, buffer: &'a str, dim: &str, elems: usize) {
        let d = self
            .ph
            .slices
            .iter()
            .position(|(n, _)| n == dim)
            .expect("validated");
        let key = |c: &Vec<usize>| {
            let mut k = c.clone();
            k.remove(d);
            k
        };
        let mut groups: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
        for (core, c) in self.ph.core_slice.iter().enumerate() {
            groups.entry(key(c)).or_default().push(core);
        }
        for mut members in groups.into_values() {
            members.sort_by_key(|&core| self.ph.core_slice[core][d]);
            let mut sum = vec![0f32; elems];
            for &core in &members {
                sum.iter_mut()
                    .zip(&self.lx[core][buffer])
                    .for_each(|(s, v)| *s += v);
                self.counters[core].ring += (elems * 4) as u64;
            }
            for &core in &members {
                let mut v = std::mem::take(self.lx[core].get_mut(buffer).expect("validated"));
                v[..elems].copy_from_slice(&sum);
                self.store(core, buffer, v);
            }
        }
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

/// Bytes a DMA of `extent` moves: whole sticks along the last dim.
fn bytes(t: &Tensor, extent: &[usize]) -> u64 {
    let (last, outer) = extent.split_last().expect("regions have a dim");
    (outer.iter().product::<usize>() * last.div_ceil(t.stick_elems) * t.stick_elems * t.elem_bytes)
        as u64
}
