//! Running a spec's Spyre program in the simulator: host tensors are bound to the program's device
//! tensors (checkpoint layouts transposed to stick layouts, values rounded to DL16 in DL16 mode),
//! the program runs, the output comes back with the counters and the modeled cost.
//!
//! The program is lowered from the spec's IR by `moek_lower::spyre::lower`, the same function the
//! macro ran at compile time (where a plan that does not fit is a compile error).

use crate::inputs::{Bound, Inputs};
use moek_ir::Element;
use moek_ir::Kernel;
use moek_ir::reference::Shape;
use moek_ir::spyre::{DeviceRole, Program};
use moek_lower::spyre::lower::{self, LowerError};
use moek_spyre::simulate::PhaseCounters;
use moek_spyre::{Cost, Data, Device, Mode, SimError};
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
pub enum SpyreError {
    #[error("`{kernel}` has no Spyre program: {why}")]
    NoProgram { kernel: String, why: LowerError },
    #[error(transparent)]
    Sim(#[from] SimError),
    #[error("the program reads tensor `{0}`, which the op's inputs do not provide")]
    Unbound(String),
}

/// What a simulated run produced besides the output.
#[derive(Clone, Debug, PartialEq)]
pub struct SpyreRun {
    pub counters: Vec<PhaseCounters>,
    pub cost: Cost,
}

/// The program of `k` for `W`.
pub fn program<W: Element>(k: &Kernel) -> Result<Program, SpyreError> {
    lower::program(k, W::DTYPE).map_err(|why| SpyreError::NoProgram {
        kernel: k.name.clone(),
        why,
    })
}

/// Runs `k`'s program on `inputs`, writing the op's output to `out`.
pub fn run<W: Element>(
    k: &Kernel,
    s: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    mode: Mode,
) -> Result<SpyreRun, SpyreError> {
    run_program(&program::<W>(k)?, s, inputs, out, mode)
}

/// Runs a program already lowered (the KTIR crosscheck's, which may be planned within another LX
/// budget) on `inputs`, writing the op's output to `out`.
pub fn run_program<W: Element>(
    p: &Program,
    s: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
    mode: Mode,
) -> Result<SpyreRun, SpyreError> {
    let mut dev = bind(p, s, inputs, mode)?;
    let counters = moek_spyre::simulate(p, mode, &mut dev)?;
    let result = dev.tensors["out"].to_f32();
    out.copy_from_slice(&result[..out.len()]);
    Ok(SpyreRun {
        cost: moek_spyre::model(&counters),
        counters,
    })
}

/// Device tensors for `p` from the op's inputs, as a run binds them (and as the KTIR crosscheck
/// hands them to the interpreter). Banks are transposed into their stick layouts: every expert for
/// a dense program, the experts the routes select for a gather program (the others stay zero: a
/// program that read one would be wrong, and the equivalence tests would say so).
pub fn bind<W: Element>(
    p: &Program,
    s: &Shape,
    inputs: &Inputs<'_, W>,
    mode: Mode,
) -> Result<Device, SpyreError> {
    // 2-byte device tensors are DL16 in DL16 mode (two bytes an element, as on the card).
    let half = |len: usize| {
        if mode == Mode::Dl16 {
            Data::Dl16(vec![0; len])
        } else {
            Data::F32(vec![0.0; len])
        }
    };
    let fill = |values: Vec<f32>| {
        let mut d = half(values.len());
        d.write_at(0, &values);
        d
    };
    // Host tensors by the op table's names (the program's inputs carry the same names).
    let host = |name: &str| {
        inputs
            .named(name)
            .ok_or_else(|| SpyreError::Unbound(name.to_string()))
    };
    let idx = match inputs.named("idx") {
        Some(Bound::Index(idx)) => idx,
        _ => &[][..],
    };
    let bank_of = |name: &str| match host(name)? {
        Bound::Weight(w) => Ok(w),
        _ => Err(SpyreError::Unbound(name.to_string())),
    };
    let dense = p.tensors.iter().any(|t| t.role == DeviceRole::DenseRoutes);
    let experts: Vec<usize> = if dense {
        (0..s.e).collect()
    } else {
        let mut touched: Vec<usize> = idx.iter().map(|&e| e as usize).collect();
        touched.sort_unstable();
        touched.dedup();
        touched
    };
    // One expert's `rows x cols` block of a host bank (`per_expert` rows from `row0`), transposed
    // into the device's `[cols, rows]` stick layout, for every expert bound.
    let bank =
        |host: &[W], per_expert: usize, row0: usize, rows: usize, cols: usize, len: usize| {
            let mut d = half(len);
            d.write_blocks(rows * cols, &experts, |e| {
                let block: Vec<f32> = host[(e * per_expert + row0) * cols..][..rows * cols]
                    .iter()
                    .map(|w| w.to_f32())
                    .collect();
                moek_spyre::transpose(&block, rows, cols)
            });
            d
        };
    let mut dev = Device::default();
    for t in &p.tensors {
        let len: usize = t.shape.iter().product();
        let unbound = || SpyreError::Unbound(t.name.clone());
        let data = match (t.role, t.name.as_str()) {
            (DeviceRole::Routes, _) => {
                dev.routes.insert(t.name.clone(), idx.to_vec());
                continue;
            }
            (DeviceRole::RouteWeights, _) => Data::F32(host("weights")?.to_f32()),
            (DeviceRole::DenseRoutes, _) => {
                // [E, T, lanes]: each (expert, token) weight fills one stick; repeated routes add.
                let w = host("weights")?.to_f32();
                let lanes = t.shape[2];
                let mut v = vec![0f32; len];
                for (slot, &e) in idx.iter().enumerate() {
                    let row = (e as usize * s.t + slot / s.r) * lanes;
                    v[row..row + lanes].iter_mut().for_each(|x| *x += w[slot]);
                }
                Data::F32(v)
            }
            (DeviceRole::Input, name) => fill(host(name)?.to_f32()),
            // host [E, 2F, H] (gate rows first) -> device [E, H, F], F on the stick
            (DeviceRole::Bank, "gate") => bank(bank_of("gate_up")?, 2 * s.f, 0, s.f, s.h, len),
            (DeviceRole::Bank, "up") => bank(bank_of("gate_up")?, 2 * s.f, s.f, s.f, s.h, len),
            // host [E, H, F] -> device [E, F, H], H on the stick
            (DeviceRole::Bank, "down") => bank(bank_of("down")?, s.h, 0, s.h, s.f, len),
            (DeviceRole::Output | DeviceRole::Scratch, _) => {
                if t.elem_bytes == 2 {
                    half(len)
                } else {
                    Data::F32(vec![0.0; len])
                }
            }
            _ => return Err(unbound()),
        };
        dev.tensors.insert(t.name.clone(), data);
    }
    Ok(dev)
}

/// The cost model's figures for `k`'s program without computing any value ([`Mode::Count`]): the
/// bytes, ring traffic and multiply-adds a run on routes `idx` counts, in milliseconds at full
/// size, so a schedule search can rank every legal program.
pub fn cost<W: Element>(k: &Kernel, idx: &[u32]) -> Result<SpyreRun, SpyreError> {
    let p = program::<W>(k)?;
    let mut dev = Device::default();
    for t in p.tensors.iter().filter(|t| t.role == DeviceRole::Routes) {
        dev.routes.insert(t.name.clone(), idx.to_vec());
    }
    let counters = moek_spyre::simulate(&p, Mode::Count, &mut dev)?;
    Ok(SpyreRun {
        cost: moek_spyre::model(&counters),
        counters,
    })
}
