//! Picking on Spyre by the cost model: every legal program is walked in the simulator's counting
//! mode (bytes, ring traffic and multiply-adds, no values) and costed; the best few are then
//! simulated on values, held to the tolerance against the f64 reference, and their counted
//! bytes checked equal to what the counting walk gave.

use super::space::{Problem, Schedule};
use super::{Ranked, Search, Simulated};
use moek_kernels::backend::Modeled;
use moek_kernels::ir::{DType, Kernel, Target};
use moek_kernels::{Element, KernelEntry, testing};
use moek_spyre::cost::{DEVICE_BYTES_PER_S, MACS_PER_CORE};

/// The counted cost of `k` on routes drawn from one seed.
pub fn modeled(k: &Kernel, dtype: DType) -> Result<Modeled, String> {
    fn of<W: Element>(k: &Kernel, idx: &[u32]) -> Result<Modeled, String> {
        moek_kernels::spyre::cost::<W>(k, idx)
            .map(|run| Modeled::of(&run.cost))
            .map_err(|e| e.to_string())
    }
    let s = testing::shape_for(k, &moek_kernels::geometry::DECODE);
    let (idx, _) = testing::routes(s.t, s.r, s.e, 1);
    match dtype {
        DType::Bf16 => of::<half::bf16>(k, &idx),
        DType::F16 => of::<half::f16>(k, &idx),
        DType::F32 => of::<f32>(k, &idx),
        d => Err(format!("spyre runs no {d} program")),
    }
}

/// The device's floor for the op: its weights read once at the device's bandwidth, or its useful
/// multiply-adds on all 32 cores, whichever is longer (seconds).
fn floor(p: &Problem) -> f64 {
    let d = p.dims;
    let bank = 3.0 * (d.h * d.f) as f64;
    let banks = ((d.t * d.r) as f64).min(d.e as f64);
    let bytes = banks * bank * 2.0;
    let macs = (d.t * d.r) as f64 * bank;
    (bytes / DEVICE_BYTES_PER_S).max(macs / (MACS_PER_CORE * moek_kernels::ir::spyre::CORES as f64))
}

/// Ranks every legal candidate by modeled time (against the built-in's, where one serves these
/// sizes); simulates the first `simulate` of them.
pub fn search(
    p: &Problem,
    incumbent: Option<&KernelEntry>,
    legal: Vec<(Schedule, Kernel)>,
    simulate: usize,
    search: &mut Search,
) -> Result<Vec<Ranked>, String> {
    let inc = incumbent
        .map(|e| modeled(e.ir(), p.dtype))
        .transpose()?
        .map(|m| m.seconds);
    let floor = floor(p);
    search.incumbent_figure = inc.map(|s| s * 1e3);
    search.floor = Some(floor * 1e3);
    let total = legal.len();
    // Each candidate beside its counted cost, which the simulated ones are checked against.
    let mut ranked: Vec<(Ranked, Modeled)> = Vec::with_capacity(total);
    for (n, (schedule, k)) in legal.into_iter().enumerate() {
        match modeled(&k, p.dtype) {
            Ok(m) => ranked.push((
                Ranked {
                    schedule,
                    kernel: k,
                    figure: m.seconds * 1e3,
                    unit: "ms",
                    floor_ratio: Some(floor / m.seconds),
                    vs_builtin: inc.map(|s| s / m.seconds),
                    calls: 0,
                    simulated: None,
                },
                m,
            )),
            Err(why) => {
                *search
                    .skipped
                    .entry(format!("the counting walk refused it: {why}"))
                    .or_default() += 1
            }
        }
        if n % 64 == 0 || n + 1 == total {
            search.progress(&format!("costed {}/{total}", n + 1));
        }
    }
    ranked.sort_by(|a, b| a.0.figure.total_cmp(&b.0.figure));
    for (r, counted) in ranked.iter_mut().take(simulate) {
        let entry = KernelEntry::scheduled(r.kernel.clone());
        let shape = testing::shape_for(&r.kernel, &moek_kernels::geometry::DECODE);
        search.progress(&format!("simulating {}", r.schedule.summary()));
        let report = testing::run_seeds(&entry, Target::Spyre, p.dtype, &shape, &[7]).remove(0);
        let model = report
            .modeled
            .clone()
            .ok_or("a spyre run carries its cost")?;
        r.simulated = Some(Simulated {
            passed: report.passed(),
            deviation: report.deviation.to_string(),
            counts_agree: model.dev_bytes == counted.dev_bytes
                && model.ring_bytes == counted.ring_bytes
                && model.seconds == counted.seconds,
        });
    }
    Ok(ranked.into_iter().map(|(r, _)| r).collect())
}
