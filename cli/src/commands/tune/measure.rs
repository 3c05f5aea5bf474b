//! Picking by measurement (cpu, wgpu): each legal schedule runs as data (`KernelEntry::scheduled`:
//! the CPU skeletons follow its tables, wgpu emits its WGSL at run time; no rebuild), paired call
//! by call with the built-in schedule on the same routes, so drift and noise fall on both; a
//! candidate's score is the median of its paired time ratios. Successive halving spends the
//! budget: every candidate once, the best quarter three times, the best few nine times.

use super::space::{Dims, Problem, Schedule};
use super::{Ranked, Search};
use crate::commands::figures::{median, sample_probe};
use moek_kernels::inputs::AnyInputs;
use moek_kernels::ir::{DType, Kernel, Op, Selection};
use moek_kernels::testing::{Case, routes};
use moek_kernels::{Backend, Element, Inputs, KernelEntry};
use std::time::Instant;

/// A timed candidate: its index in the legal list, its times, their ratios to the built-in's
/// paired calls, and (decode on the CPU, final round) each call's bytes per second over the
/// bandwidth probed just before it.
#[derive(Clone, Debug, Default)]
struct Score {
    i: usize,
    times: Vec<f64>,
    ratios: Vec<f64>,
    shares: Vec<f64>,
}

impl Score {
    /// The median paired ratio: what ranks it.
    fn rank(&self) -> f64 {
        median(self.ratios.iter().copied())
    }
}

/// Weight bytes one call reads and its multiply-add flops, by the schedule's selection: gathered
/// routes read a bank per route, grouped tokens each selected bank once, dense every bank
/// (and multiply by all of them).
fn work(k: &Kernel, d: Dims, elem: f64) -> (f64, f64) {
    let bank = 3.0 * (d.h * d.f) as f64;
    let selected = (d.t * d.r) as f64;
    let (banks, products) = match k.schedule.select {
        Selection::Gather => (selected, selected),
        Selection::Grouped => (selected.min(d.e as f64), selected),
        _ => (d.e as f64, (d.t * d.e) as f64),
    };
    (banks * bank * elem, 2.0 * products * bank)
}

/// Ranks `legal` against `incumbent` on `backend` within `budget` seconds.
pub fn search(
    p: &Problem,
    backend: &Backend,
    incumbent: &KernelEntry,
    legal: Vec<(Schedule, Kernel)>,
    budget: f64,
    search: &mut Search,
) -> Result<Vec<Ranked>, String> {
    let job = Job {
        p,
        backend,
        incumbent,
        budget,
    };
    match p.dtype {
        DType::Bf16 => run::<Case<half::bf16>>(&job, legal, search),
        DType::F16 => run::<Case<half::f16>>(&job, legal, search),
        DType::F32 => run::<Case<f32>>(&job, legal, search),
        q => moek_kernels::with_block!(
            q,
            moek_kernels::ir::quant::BLOCK,
            |Q| match q.activation() {
                DType::Bf16 => run::<Blocks<Q, half::bf16>>(&job, legal, search),
                _ => run::<Blocks<Q, f32>>(&job, legal, search),
            }
        ),
    }
}

/// One measured search: the problem, where it runs, the built-in every call is paired with,
/// and the seconds it may take.
struct Job<'a> {
    p: &'a Problem,
    backend: &'a Backend,
    incumbent: &'a KernelEntry,
    budget: f64,
}

/// What the timed calls read: weights drawn once, routes redrawn for each call.
trait Bench {
    /// Bytes one weight value is stored in (a block's bytes over its values, for blocks).
    const VALUE_BYTES: f64;
    fn draw(p: &Problem) -> Self;
    fn reroute(&mut self, d: Dims, seed: u64);
    fn run(
        &self,
        backend: &Backend,
        entry: &KernelEntry,
        s: &moek_kernels::Shape,
        out: &mut [f32],
    ) -> Result<(), String>;
}

impl<W: Element> Bench for Case<W> {
    const VALUE_BYTES: f64 = std::mem::size_of::<W>() as f64;

    fn draw(p: &Problem) -> Self {
        let mut case = Case::<W>::new(Op::ExpertFfn, p.dims.shape(), 1);
        case.optional = p.optional;
        case
    }

    fn reroute(&mut self, d: Dims, seed: u64) {
        (self.idx, self.weights) = routes(d.t, d.r, d.e, seed);
    }

    fn run(
        &self,
        backend: &Backend,
        entry: &KernelEntry,
        s: &moek_kernels::Shape,
        out: &mut [f32],
    ) -> Result<(), String> {
        let inputs = self.inputs();
        let any = AnyInputs::new(&inputs, W::DTYPE);
        moek_kernels::backend::run(backend, entry, s, &any, out).map(drop)
    }
}

/// Weights quantized to blocks of `Q` (drawn as `A`, then quantized) beside activations in `A`.
struct Blocks<Q, A> {
    case: Case<A>,
    gate_up: Vec<Q>,
    down: Vec<Q>,
}

impl<Q: Element, A: Element> Bench for Blocks<Q, A> {
    const VALUE_BYTES: f64 = std::mem::size_of::<Q>() as f64 / Q::VALUES as f64;

    fn draw(p: &Problem) -> Self {
        let mut case = Case::<A>::new(Op::ExpertFfn, p.dims.shape(), 1);
        let blocks = |w: &[A]| {
            let values: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            moek_kernels::ir::quant::quantize::<Q>(&values)
        };
        let (gate_up, down) = (blocks(case.param("gate_up")), blocks(case.param("down")));
        // Only the blocks are read: the drawn weights go.
        case.params.iter_mut().for_each(|w| *w = Vec::new());
        Blocks {
            case,
            gate_up,
            down,
        }
    }

    fn reroute(&mut self, d: Dims, seed: u64) {
        self.case.reroute(d, seed);
    }

    fn run(
        &self,
        backend: &Backend,
        entry: &KernelEntry,
        s: &moek_kernels::Shape,
        out: &mut [f32],
    ) -> Result<(), String> {
        let c = &self.case;
        let inputs = Inputs::expert_ffn(&c.x, &c.idx, &c.weights, &self.gate_up, &self.down);
        let dtype = moek_kernels::ir::element::quantized_dtype::<Q, A>();
        let any = AnyInputs::new(&inputs, dtype);
        moek_kernels::backend::run(backend, entry, s, &any, out).map(drop)
    }
}

fn run<C: Bench>(
    job: &Job,
    legal: Vec<(Schedule, Kernel)>,
    search: &mut Search,
) -> Result<Vec<Ranked>, String> {
    let Job {
        p,
        backend,
        incumbent,
        budget,
    } = *job;
    let start = Instant::now();
    let d = p.dims;
    let shape = d.shape();
    let elem = C::VALUE_BYTES;
    let on_cpu = backend.target == moek_kernels::ir::Target::Cpu;
    let mut case = C::draw(p);
    let mut out = vec![0f32; d.t * d.h];
    let mut call = |entry: &KernelEntry, seed: u64, out: &mut [f32]| -> Result<f64, String> {
        case.reroute(d, seed);
        let t = Instant::now();
        case.run(backend, entry, &shape, out)?;
        Ok(t.elapsed().as_secs_f64())
    };
    // Warm the incumbent (pages, pools) and learn its time.
    for i in 0..3 {
        call(incumbent, 10 + i, &mut out)?;
    }
    let (inc_bytes, inc_flops) = work(incumbent.ir(), d, elem);
    // Work the estimate says is far beyond the incumbent's is not timed (a dense schedule
    // multiplies every expert; gathered routes at a long prompt re-read a bank per route).
    let mut entries: Vec<(Schedule, KernelEntry)> = Vec::new();
    for (s, k) in legal {
        let (bytes, flops) = work(&k, d, elem);
        if bytes > 2.0 * inc_bytes || flops > 2.0 * inc_flops {
            *search
                .skipped
                .entry("estimated work over twice the built-in's (not timed)".into())
                .or_default() += 1;
            continue;
        }
        entries.push((s, KernelEntry::scheduled(k)));
    }
    let decode = d.t <= 8;
    let probe = (on_cpu && decode).then(sample_probe);
    let mut bandwidth = Vec::new();
    // The built-in's times in the final round: its figure is taken at the finalists' moments.
    let mut final_incumbent = Vec::new();
    // Rounds of successive halving: (calls per candidate, survivors kept after).
    let mut scores: Vec<Score> = (0..entries.len())
        .map(|i| Score {
            i,
            ..Score::default()
        })
        .collect();
    let rounds = [(1usize, 0.25f64), (3, 0.0), (9, 0.0)];
    let mut seed = 1000u64;
    // Candidates a round dropped, best first (they rank after the finalists).
    let mut dropped: Vec<Vec<Score>> = Vec::new();
    for (round, &(calls, keep)) in rounds.iter().enumerate() {
        if round > 0 {
            scores.sort_by(|a, b| a.rank().total_cmp(&b.rank()));
            let n = if round == 1 {
                ((scores.len() as f64 * keep).ceil() as usize).max(8)
            } else {
                4
            };
            dropped.push(scores.split_off(n.min(scores.len())));
        }
        // What the budget leaves this round: an equal share of what is left for each round
        // to come. The first round times the space in an evenly spread order, so where time
        // runs out the timed ones are a sample of it.
        let round_start = start.elapsed().as_secs_f64();
        let deadline = round_start + (budget - round_start) / (rounds.len() - round) as f64;
        if round == 0 {
            let n = scores.len().max(1);
            scores.sort_by_key(|s| (s.i * 7919) % n);
        }
        let total = scores.len();
        let mut timed = 0;
        for (n, score) in scores.iter_mut().enumerate() {
            let i = score.i;
            // Every round times at least one candidate, so the finalists' figures exist.
            if timed > 0 && start.elapsed().as_secs_f64() > deadline {
                break;
            }
            if round == 0 && !on_cpu {
                // A device compiles a program on its first call: not part of its time.
                call(&entries[i].1, seed, &mut out)?;
            }
            let bytes = work(entries[i].1.ir(), d, elem).0;
            for _ in 0..calls {
                seed += 1;
                // The final round's calls are each judged against the bandwidth probed just
                // before them: this machine's memory changes speed from minute to minute.
                let bw = probe
                    .as_ref()
                    .filter(|_| round + 1 == rounds.len())
                    .map(|p| p.best_of(2));
                let inc = call(incumbent, seed, &mut out)?;
                let t = call(&entries[i].1, seed, &mut out)?;
                score.ratios.push(t / inc);
                score.times.push(t);
                if round + 1 == rounds.len() {
                    final_incumbent.push(inc);
                }
                if let Some(bw) = bw {
                    bandwidth.push(bw);
                    score.shares.push(bytes / t / bw);
                }
            }
            timed += 1;
            search.progress(&format!("round {}: {}/{total}", round + 1, n + 1));
        }
        if timed < scores.len() {
            let rest = scores.split_off(timed);
            if round == 0 {
                *search
                    .skipped
                    .entry("over the time budget (not timed)".into())
                    .or_default() += rest.len();
            } else {
                // Timed in an earlier round: they rank on fewer calls.
                dropped.push(rest);
            }
        }
    }
    scores.sort_by(|a, b| a.rank().total_cmp(&b.rank()));
    scores.extend(dropped.into_iter().rev().flatten());
    // The CPU's floors: the read bandwidth probed beside the final round's calls (decode) or the
    // ISA's bf16 GEMM peak, timed; a GPU's are not known here.
    let floor = match (probe, on_cpu) {
        (Some(probe), _) => Some(if bandwidth.is_empty() {
            probe.best_of(2)
        } else {
            median(bandwidth.into_iter())
        }),
        (None, true) => Some(moek_cpu::isa().peak_gflops(rayon::current_num_threads()) * 1e9),
        (None, false) => None,
    };
    let figure = |seconds: f64, k: &Kernel| {
        let (b, f) = work(k, d, elem);
        if decode { b / seconds } else { f / seconds }
    };
    let inc_median = median(final_incumbent.into_iter());
    search.incumbent_figure = Some(figure(inc_median, incumbent.ir()) / 1e9);
    search.floor = floor.map(|f| f / 1e9);
    Ok(scores
        .into_iter()
        .map(|score| {
            let (schedule, entry) = &entries[score.i];
            let seconds = median(score.times.iter().copied());
            let fig = figure(seconds, entry.ir());
            // A finalist's share of the floor is the median of its calls' own shares.
            let floor_ratio = if score.shares.is_empty() {
                floor.map(|f| fig / f)
            } else {
                Some(median(score.shares.iter().copied()))
            };
            Ranked {
                schedule: schedule.clone(),
                kernel: entry.ir().clone(),
                figure: fig / 1e9,
                unit: if decode { "GB/s" } else { "GFLOP/s" },
                floor_ratio,
                vs_builtin: Some(1.0 / score.rank()),
                calls: score.times.len(),
                simulated: None,
            }
        })
        .collect())
}
