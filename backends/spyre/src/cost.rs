//! The cost model, from public constants only (docs/spyre-program.md, "The device, as we model
//! it"): 1.536 TMAC/s of DL16 per core, 204.8 GB/s of device memory shared by the active cores (up
//! to 8 cores reading the same region share one broadcast read: the simulator charges bytes that
//! way), a ring of 128 B per cycle per direction
//! at an assumed 1.5 GHz (the clock is not public: every report prints the assumption). Each core's
//! DMA, compute and ring work overlap (double-buffered tiles), so a core takes the longest of the
//! three; a phase takes its slowest core; phases run one after another. A phase's selected-weight
//! copy (the device compiler's, where a gathered bank is not blocked) runs before it at the
//! device's bandwidth: read and written once. Nothing is fitted.

use crate::simulate::PhaseCounters;
use std::fmt;

/// Multiply-adds per second per core (98.304 TFLOPS per card / 32 cores / 2).
pub const MACS_PER_CORE: f64 = 1.536e12;
/// Device memory bandwidth of the card.
pub const DEVICE_BYTES_PER_S: f64 = 204.8e9;
/// Ring bytes per cycle per direction.
pub const RING_BYTES_PER_CYCLE: f64 = 128.0;
/// ASSUMED ring clock (not public).
pub const RING_CLOCK_HZ: f64 = 1.5e9;

/// What bounds a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    Compute,
    DeviceMemory,
    Ring,
}

/// Modeled time of a program run, with the totals that explain it.
#[derive(Clone, Debug, PartialEq)]
pub struct Cost {
    pub seconds: f64,
    /// Per phase: name, seconds, the term that bounds its slowest core.
    pub phases: Vec<(String, f64, Term)>,
    /// Bytes between device memory and LX, the selected-weight copies' included.
    pub dev_bytes: u64,
    /// Of `dev_bytes`, the selected-weight copies' (each read and written once).
    pub copy_bytes: u64,
    pub ring_bytes: u64,
    pub macs: u64,
    pub lx_peak: usize,
}

/// The modeled cost of the counted run.
pub fn model(counters: &[PhaseCounters]) -> Cost {
    let mut cost = Cost {
        seconds: 0.0,
        phases: vec![],
        dev_bytes: 0,
        copy_bytes: 0,
        ring_bytes: 0,
        macs: 0,
        lx_peak: 0,
    };
    for ph in counters {
        let active = ph.cores.len().max(1) as f64;
        let mut slowest = (0.0, Term::Compute);
        for c in &ph.cores {
            let terms = [
                (c.macs as f64 / MACS_PER_CORE, Term::Compute),
                (
                    (c.dev_to_lx + c.lx_to_dev) as f64 / (DEVICE_BYTES_PER_S / active),
                    Term::DeviceMemory,
                ),
                (
                    c.ring as f64 / (RING_BYTES_PER_CYCLE * RING_CLOCK_HZ),
                    Term::Ring,
                ),
            ];
            let core = terms
                .into_iter()
                .fold((0.0, Term::Compute), |m, t| if t.0 > m.0 { t } else { m });
            if core.0 > slowest.0 {
                slowest = core;
            }
            cost.dev_bytes += c.dev_to_lx + c.lx_to_dev;
            cost.ring_bytes += c.ring;
            cost.macs += c.macs;
            cost.lx_peak = cost.lx_peak.max(c.lx_peak);
        }
        let copy_bytes = 2 * ph.selected_copy;
        let copy = copy_bytes as f64 / DEVICE_BYTES_PER_S;
        cost.copy_bytes += copy_bytes;
        cost.dev_bytes += copy_bytes;
        let term = if copy > slowest.0 {
            Term::DeviceMemory
        } else {
            slowest.1
        };
        cost.seconds += copy + slowest.0;
        cost.phases.push((ph.phase.clone(), copy + slowest.0, term));
    }
    cost
}

/// The assumption every printed cost carries.
pub fn assumptions() -> String {
    format!(
        "cost model: {:.3} TMAC/s per core, {:.1} GB/s device memory shared by active cores (broadcast reads shared by up to 8), ring {} B/cycle at an ASSUMED {:.1} GHz; DMA, compute and ring overlap per core; an unblocked gathered bank's selected weights are copied (read and written) first",
        MACS_PER_CORE / 1e12,
        DEVICE_BYTES_PER_S / 1e9,
        RING_BYTES_PER_CYCLE,
        RING_CLOCK_HZ / 1e9
    )
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Term::Compute => "compute",
            Term::DeviceMemory => "device memory",
            Term::Ring => "ring",
        })
    }
}
