//! The equivalence harness: runs a spec's variant on random inputs and compares it with the f64
//! reference (`moek_ir::reference`) under the dtype's written tolerance
//! (`moek_ir::tolerance`). Every spec's generated tests call [`check_spec`]; `moek check` prints
//! the same [`Report`]s.
//!
//! Outputs are poisoned with NaN before a run, so an element a variant fails to write is NaN and
//! fails. Full-size specs check a random sample of output rows against the reference (the f64
//! reference of a 26B-A4B layer is minutes of work); every element is still checked for NaN.

pub use crate::backend::Modeled;
use crate::backend::{self, Ran};
use crate::elem::{Elem, QuantAct, QuantElem};
use crate::inputs::{Inputs, output_len};
use crate::registry::KernelEntry;
use half::{bf16, f16};
use moek_ir::quant;
use moek_ir::reference::{self, Biases, Shape};
use moek_ir::tensors::{DOWN_BIAS, GATE_UP_BIAS, TensorDef, TensorRole};
use moek_ir::tolerance::{Deviation, Tolerance};
use moek_ir::{Activation, Bias, DType, DimName, Kernel, Op, Target};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::time::Instant;

/// Sizes given to free dims in tests: small, and off every SIMD width so tails run.
pub const SMALL: Shape = Shape {
    t: 5,
    r: 3,
    e: 7,
    h: 200,
    f: 72,
    v: 301,
};

/// Output rows (tokens, or vocabulary rows of the LM head) checked against the reference per run.
pub const SAMPLE_ROWS: usize = 6;

/// Runs `entry`'s variant on `target` for `dtype` on fresh seeds and panics, with the seed and the
/// figures, if any run is outside the tolerance or leaves an element unwritten.
pub fn check_spec(entry: &KernelEntry, target: Target, dtype: DType) {
    let k = entry.ir();
    if cfg!(moek_unoptimised) {
        eprintln!(
            "{}: built unoptimised, so this test runs 10-30x slower; add `[profile.test] opt-level = 3` to the workspace's Cargo.toml",
            k.name
        );
    }
    let mut shapes = vec![shape_for(k, &SMALL)];
    if k.dim(DimName::T)
        .is_some_and(|d| d.size.is_none() && d.admits(1))
    {
        shapes.push(shape_for(k, &Shape { t: 1, ..SMALL }));
    }
    for shape in shapes {
        let shape = cpu_driver_shape(target, &shape).map_or(shape, |cut| {
            eprintln!(
                "{} on a CPU wgpu driver: run at {}, not {}",
                k.name,
                crate::inputs::describe(k.op, &cut),
                crate::inputs::describe(k.op, &shape)
            );
            cut
        });
        let seeds = fresh_seeds(seeds_within_budget(k, &shape));
        for report in run_seeds(entry, target, dtype, &shape, &seeds) {
            assert!(
                report.passed(),
                "{report}\nreproduce with seed {}",
                report.seed
            );
        }
    }
}

/// Seeds a generated test runs per shape.
pub const SEEDS: usize = 3;

/// Multiply-adds a generated test may spend per seed before it runs one seed instead of
/// [`SEEDS`]: about seven seconds of the Spyre simulator on two cores. A dense persistent prefill
/// over 128 experts and 512 tokens is 3.9e11 (26 s a seed there); decode and the free-dim sizes
/// are far below it. `MOEK_FULL_TESTS=1` runs every seed regardless.
pub const MACS_PER_SEED_BUDGET: f64 = 1e11;

/// Multiply-adds the variant of `k` performs at `shape`: a dense selection computes every
/// expert for every token.
pub fn macs(k: &Kernel, s: &Shape) -> f64 {
    let (t, h, f, v) = (s.t as f64, s.h as f64, s.f as f64, s.v as f64);
    let per_token = if k.schedule.select == moek_ir::Selection::Dense {
        s.e as f64
    } else {
        s.r as f64
    };
    match k.op {
        Op::GateUp => t * per_token * 2.0 * f * h,
        Op::Down => t * per_token * h * f,
        Op::ExpertFfn => t * per_token * 3.0 * f * h,
        Op::DenseMlp => t * 3.0 * f * h,
        Op::LmHeadRow => v * h,
    }
}

/// [`SEEDS`], or one where a seed costs more than [`MACS_PER_SEED_BUDGET`] (said on stderr),
/// unless `MOEK_FULL_TESTS=1`.
pub fn seeds_within_budget(k: &Kernel, shape: &Shape) -> usize {
    let cost = macs(k, shape);
    let full = std::env::var("MOEK_FULL_TESTS").is_ok_and(|v| v == "1");
    if cost <= MACS_PER_SEED_BUDGET || full {
        return SEEDS;
    }
    eprintln!(
        "{}: one seed of {SEEDS} ({cost:.1e} multiply-adds a seed, over the budget of {MACS_PER_SEED_BUDGET:.0e}); MOEK_FULL_TESTS=1 runs all",
        k.name
    );
    1
}

/// The smaller problem a wgpu run of `shape` takes on a CPU driver (Mesa's lavapipe or
/// llvmpipe): prefill at 32 tokens, expert banks at 16 experts, the LM head at 32768 vocabulary
/// rows. There, the dense persistent loop over 128 experts and 512 tokens takes three minutes a
/// run (still 25-50 s at 8 tokens: each of the 32 token groups reads every expert's weights), the
/// 262144-row head 13-21 s, and a decode step over a 128-expert bank 5-15 s, nearly all of it
/// copying the bank (1.5-3 GB) into the driver's buffers: the 8 routed experts it reads are the
/// same work at 16. Cut, the same programs (every loop trip's steps, core split, route list,
/// column block and weight chunk switch) take a second or two. `None` on a GPU, for other
/// targets, or where nothing is cut.
pub fn cpu_driver_shape(target: Target, shape: &Shape) -> Option<Shape> {
    const PREFILL_T: usize = 32;
    const BANK_E: usize = 16;
    const HEAD_V: usize = 32768;
    #[cfg(feature = "wgpu")]
    let cpu_driver = target == Target::Wgpu && crate::wgpu::Gpu::shared().is_ok_and(|g| g.is_cpu());
    #[cfg(not(feature = "wgpu"))]
    let cpu_driver = {
        let _ = target;
        false
    };
    let mut cut = *shape;
    cut.t = cut.t.min(PREFILL_T);
    // Never below the routes a token takes (each of them a distinct expert).
    cut.e = cut.e.min(BANK_E.max(cut.r));
    cut.v = cut.v.min(HEAD_V);
    (cpu_driver && cut != *shape).then_some(cut)
}

/// Whether every dim of the spec admits the size `shape` gives it.
pub fn admits(k: &Kernel, shape: &Shape) -> bool {
    k.op.dims()
        .iter()
        .all(|&d| k.dim(d).is_none_or(|dim| dim.admits(shape.dim(d))))
}

/// The problem a spec runs on: its fixed sizes, and `free`'s for its free dims (H and F
/// rounded up to whole blocks where the spec has quantized weights, whose rows are blocks).
pub fn shape_for(k: &Kernel, free: &Shape) -> Shape {
    let block = match k.dtypes.iter().any(|d| d.is_quantized()) {
        true => k.quant_block,
        false => 1,
    };
    let pick = |d: DimName, dflt: usize| match k.dim(d) {
        Some(dim) => dim.size.unwrap_or_else(|| {
            let dflt = match d {
                DimName::H | DimName::F => dflt.next_multiple_of(block),
                _ => dflt,
            };
            dflt.max(dim.min).min(dim.max.unwrap_or(usize::MAX))
        }),
        None => dflt,
    };
    let has = |d: DimName| k.op.dims().contains(&d);
    Shape {
        t: pick(DimName::T, free.t),
        r: if has(DimName::R) {
            pick(DimName::R, free.r)
        } else {
            0
        },
        e: if has(DimName::E) {
            pick(DimName::E, free.e)
        } else {
            0
        },
        h: pick(DimName::H, free.h),
        f: if has(DimName::F) {
            pick(DimName::F, free.f)
        } else {
            0
        },
        v: if has(DimName::V) {
            pick(DimName::V, free.v)
        } else {
            0
        },
    }
}

/// Seeds that differ between runs (time and a counter); reports print them for reproduction.
pub fn fresh_seeds(n: usize) -> Vec<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    (0..n)
        .map(|_| {
            now ^ COUNTER
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        })
        .collect()
}

/// The outcome of one run against the reference.
#[derive(Clone, Debug)]
pub struct Report {
    pub kernel: String,
    pub target: Target,
    pub dtype: DType,
    pub shape: String,
    pub seed: u64,
    pub deviation: Deviation,
    pub tolerance: Tolerance,
    /// Seconds the variant itself took.
    pub seconds: f64,
    /// Weight bytes the op must read, and its multiply-add flops (2 per MAC).
    pub bytes: f64,
    pub flops: f64,
    /// For the LM head: whether the returned argmax is the index of the largest logit.
    pub argmax_ok: bool,
    /// The cost model's figures (Spyre runs).
    pub modeled: Option<Modeled>,
    /// Deviation from the spec's CPU variant on the same inputs (wgpu runs, every element).
    pub versus_cpu: Option<Deviation>,
    /// For quantized weights: the reference on them against the reference on the bf16 weights
    /// they were quantized from (the format's own error, which the tolerance does not cover).
    pub quantization: Option<Deviation>,
}

impl Report {
    /// Within tolerance of the reference, and (wgpu) within twice it of the CPU variant: each is
    /// within the tolerance of the reference, so they differ by at most twice it.
    pub fn passed(&self) -> bool {
        let twice = Tolerance {
            rel_l2: 2.0 * self.tolerance.rel_l2,
            max_abs: 2.0 * self.tolerance.max_abs,
        };
        self.argmax_ok
            && self.deviation.within(self.tolerance)
            && self.versus_cpu.as_ref().is_none_or(|d| d.within(twice))
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on {} ({}, {}): {}; limits rel L2 {:.1e}, max abs {:.1e}{}",
            self.kernel,
            self.target,
            self.dtype,
            self.shape,
            self.deviation,
            self.tolerance.rel_l2,
            self.tolerance.max_abs,
            if self.argmax_ok {
                ""
            } else {
                "; argmax is not the largest logit"
            }
        )?;
        if let Some(d) = &self.versus_cpu {
            write!(f, "; versus the CPU variant: {d}")?;
        }
        if let Some(d) = &self.quantization {
            write!(f, "; the weights' quantization itself: {d}")?;
        }
        Ok(())
    }
}

/// Runs one spec once per seed (weights drawn once from the first seed, activations and routes
/// fresh per seed), returning a report per run.
pub fn run_seeds(
    entry: &KernelEntry,
    target: Target,
    dtype: DType,
    shape: &Shape,
    seeds: &[u64],
) -> Vec<Report> {
    let ran = match dtype {
        DType::F16 => run_drawn::<Case<f16>>(entry, target, dtype, shape, seeds),
        DType::Bf16 => run_drawn::<Case<bf16>>(entry, target, dtype, shape, seeds),
        DType::F32 => run_drawn::<Case<f32>>(entry, target, dtype, shape, seeds),
        _ => crate::with_block!(dtype, entry.ir().quant_block, |Q| {
            run_drawn::<QuantCase<Q>>(entry, target, dtype, shape, seeds)
        }),
    };
    ran.unwrap_or_else(|e| panic!("{e}"))
}

/// [`run_case`] on a case of `C` drawn from the first seed.
fn run_drawn<C: Drawn>(
    entry: &KernelEntry,
    target: Target,
    dtype: DType,
    shape: &Shape,
    seeds: &[u64],
) -> Result<Vec<Report>, String> {
    let mut case = C::draw(entry.ir().op, *shape, seeds[0]);
    run_case(entry, target, dtype, &mut case, seeds)
}

/// Cases kept between runs, so that every backend and every spec of one op and shape run on
/// the same weights instead of drawing their own (a 26B-A4B expert bank is 761 million numbers,
/// seconds to draw). The most recently used are kept while their weights fit
/// [`Cases::BUDGET`]: a spec's dtypes at full size, beside the smaller cases its wgpu rows take
/// on a CPU driver.
#[derive(Default)]
pub struct Cases {
    /// Most recently used first, with the weight bytes each holds.
    kept: Vec<(CaseKey, usize, Box<dyn std::any::Any>)>,
}

/// Op, shape, dtype and values per stored weight (a quantized case's block size), seed.
type CaseKey = (Op, Shape, DType, usize, u64);

impl std::fmt::Debug for Cases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.kept.iter().map(|(key, _, _)| key))
            .finish()
    }
}

impl Cases {
    /// Weight bytes the kept cases may hold together: three 26B-A4B expert banks in Q8_0 with
    /// their f32 copies (3.8 GB each). The newest case is kept whatever its size.
    pub const BUDGET: usize = 12_000_000_000;

    /// One run of `entry` on `target` at `shape`, on the kept case for (op, shape, dtype, seed)
    /// or a new one (weights, activations and routes all from `seed`); `Err` says why the
    /// backend could not run it.
    pub fn run(
        &mut self,
        entry: &KernelEntry,
        target: Target,
        dtype: DType,
        shape: &Shape,
        seed: u64,
    ) -> Result<Report, String> {
        match dtype {
            DType::F16 => self.run_typed::<Case<f16>>(entry, target, dtype, shape, seed),
            DType::Bf16 => self.run_typed::<Case<bf16>>(entry, target, dtype, shape, seed),
            DType::F32 => self.run_typed::<Case<f32>>(entry, target, dtype, shape, seed),
            // One case per block format and size: its f32 and bf16 activations hold the same
            // values.
            _ => crate::with_block!(dtype, entry.ir().quant_block, |Q| {
                self.run_typed::<QuantCase<Q>>(entry, target, dtype, shape, seed)
            }),
        }
    }

    fn run_typed<C: Drawn + 'static>(
        &mut self,
        entry: &KernelEntry,
        target: Target,
        dtype: DType,
        shape: &Shape,
        seed: u64,
    ) -> Result<Report, String> {
        let op = entry.ir().op;
        let key = (op, *shape, C::DTYPE, C::VALUES, seed);
        let kept = match self.kept.iter().position(|(k, _, _)| *k == key) {
            Some(at) => self.kept.remove(at),
            None => {
                // Dropped before the new one is drawn, least recently used first, so the kept
                // cases and the new one stay within the budget.
                let bytes = C::weight_bytes(op, shape);
                let mut held: usize = self.kept.iter().map(|(_, b, _)| b).sum();
                while held + bytes > Self::BUDGET
                    && let Some((_, b, _)) = self.kept.pop()
                {
                    held -= b;
                }
                let case: Box<dyn std::any::Any> = Box::new(C::draw(op, *shape, seed));
                (key, bytes, case)
            }
        };
        self.kept.insert(0, kept);
        let case = self.kept[0]
            .2
            .downcast_mut::<C>()
            .expect("the key names the dtype");
        run_case(entry, target, dtype, case, &[seed]).map(|mut r| r.remove(0))
    }
}

/// Runs `entry`'s `dtype` variant on `case` once per seed (activations and routes redrawn from
/// each); a backend that fails to run it (a device error, a program the simulator refuses) is an
/// `Err`.
fn run_case<C: Drawn>(
    entry: &KernelEntry,
    target: Target,
    dtype: DType,
    case: &mut C,
    seeds: &[u64],
) -> Result<Vec<Report>, String> {
    let k = entry.ir();
    let shape = *case.shape();
    let shape = &shape;
    seeds
        .iter()
        .map(|&seed| {
            case.reseed_for(k, seed);
            let mut out = vec![f32::NAN; output_len(k.op, shape)];
            let start = Instant::now();
            let on = crate::Backend::of(target);
            let Ran {
                argmax, modeled, ..
            } = case.run(&on, entry, dtype, &mut out)?;
            let seconds = start.elapsed().as_secs_f64();
            let (deviation, argmax_ok) = case.compare(k.activation, &out, argmax, seed);
            // A GPU variant is also held to the CPU variant of the same spec, element by element,
            // where that variant takes this shape (a spec's fixed sizes bind its CPU variant; a
            // WGSL program is emitted for whatever sizes it is run at).
            let versus_cpu = (target == Target::Wgpu && admits(k, shape))
                .then(|| case.versus_cpu(entry, &out))
                .flatten();
            let (bytes, flops) = case.work();
            Ok(Report {
                kernel: k.name.clone(),
                target,
                dtype,
                shape: crate::inputs::describe(k.op, shape),
                seed,
                deviation,
                tolerance: backend::tolerance_of(target, dtype),
                seconds,
                bytes,
                flops,
                argmax_ok,
                modeled,
                versus_cpu,
                quantization: case.quantization(k.activation, seed),
            })
        })
        .collect()
}

/// A drawn case as one dtype's variants read it (for quantized weights, one block format's
/// variants, beside either activation dtype): what the harness needs of it.
pub trait Drawn {
    /// The dtype the case is drawn for (what the kept cases are keyed by, with the values a
    /// stored weight holds).
    const DTYPE: DType;
    const VALUES: usize;
    fn draw(op: Op, s: Shape, seed: u64) -> Self;
    /// Bytes a case of `op` at `s` holds in weights (what [`Cases`] budgets).
    fn weight_bytes(op: Op, s: &Shape) -> usize;
    fn shape(&self) -> &Shape;
    /// Fresh activations and routes from `seed`, and the optional tensors `k` computes.
    fn reseed_for(&mut self, k: &Kernel, seed: u64);
    /// Runs `entry`'s `dtype` variant on these inputs (validated first).
    fn run(
        &self,
        on: &crate::Backend,
        entry: &KernelEntry,
        dtype: DType,
        out: &mut [f32],
    ) -> Result<Ran, String>;
    /// Deviation from the reference on a sample of rows ([`Case::compare`]).
    fn compare(
        &self,
        act: Activation,
        out: &[f32],
        argmax: Option<u32>,
        seed: u64,
    ) -> (Deviation, bool);
    /// The spec's CPU variant on the same inputs, measured against `out`.
    fn versus_cpu(&self, entry: &KernelEntry, out: &[f32]) -> Option<Deviation>;
    /// (weight bytes the op must read, flops).
    fn work(&self) -> (f64, f64);
    /// For quantized weights: how far the reference on them is from the reference on the
    /// weights they were quantized from.
    fn quantization(&self, _act: Activation, _seed: u64) -> Option<Deviation> {
        None
    }
}

impl<W: Elem> Drawn for Case<W> {
    const DTYPE: DType = W::DTYPE;
    const VALUES: usize = 1;

    fn draw(op: Op, s: Shape, seed: u64) -> Self {
        Case::new(op, s, seed)
    }

    fn weight_bytes(op: Op, s: &Shape) -> usize {
        weight_values(op, s) * std::mem::size_of::<W>()
    }

    fn shape(&self) -> &Shape {
        &self.shape
    }

    fn reseed_for(&mut self, k: &Kernel, seed: u64) {
        self.reseed(seed);
        self.bias = k.bias;
        self.output_gate = k.output_gate;
    }

    fn run(
        &self,
        on: &crate::Backend,
        entry: &KernelEntry,
        dtype: DType,
        out: &mut [f32],
    ) -> Result<Ran, String> {
        assert_eq!(dtype, W::DTYPE, "a case of {} runs that dtype", W::DTYPE);
        let inputs = self.inputs();
        inputs
            .validate(&self.shape, out.len())
            .expect("the harness builds well-formed inputs");
        backend::run(on, entry, &self.shape, &inputs, out)
    }

    fn compare(
        &self,
        act: Activation,
        out: &[f32],
        argmax: Option<u32>,
        seed: u64,
    ) -> (Deviation, bool) {
        Case::compare(self, act, out, argmax, seed)
    }

    fn versus_cpu(&self, entry: &KernelEntry, out: &[f32]) -> Option<Deviation> {
        let f = W::cpu_fn(&entry.cpu)?;
        let mut cpu = vec![f32::NAN; out.len()];
        f(&self.shape, &self.inputs(), &mut cpu);
        let want: Vec<f64> = cpu.iter().map(|&v| f64::from(v)).collect();
        Some(Deviation::measure(out, &want))
    }

    fn work(&self) -> (f64, f64) {
        self.work_at(std::mem::size_of::<W>() as f64)
    }
}

/// A case for weights quantized to blocks of `Q`: drawn in bf16 (`drawn`: its activations and
/// routes; its weights are dropped once the format's error is measured), its weights quantized
/// (`blocks`), and the same case with the blocks' exact values as f32 weights (`exact`, what the
/// reference reads; activations widened from `drawn`'s, routes shared). A variant beside bf16
/// activations reads `drawn`'s, one beside f32 activations `exact`'s: the same values.
#[derive(Debug)]
pub struct QuantCase<Q> {
    pub drawn: Case<bf16>,
    pub exact: Case<f32>,
    /// The op's weight tensors in blocks, in table order.
    pub blocks: Vec<Vec<Q>>,
    /// The reference on the blocks' values against the reference on the bf16 weights they were
    /// made from, on the first seed's activations and a sample of its rows.
    pub format_error: Deviation,
}

impl<Q: QuantElem> QuantCase<Q> {
    pub fn new(op: Op, s: Shape, seed: u64) -> Self {
        let drawn = Case::<bf16>::new(op, s, seed);
        let blocks: Vec<Vec<Q>> = drawn
            .params
            .par_iter()
            .map(|p| {
                let values: Vec<f32> = p.iter().map(|v| v.to_f32()).collect();
                quant::quantize(&values)
            })
            .collect();
        let exact = Case::<f32> {
            op,
            shape: s,
            x: vec![],
            idx: vec![],
            weights: vec![],
            act: vec![],
            params: blocks.par_iter().map(|b| quant::dequantize(b)).collect(),
            softcap: drawn.softcap,
            gate_up_bias: vec![],
            down_bias: vec![],
            bias: Bias::default(),
            gate_w: vec![],
            output_gate: false,
        };
        let mut case = QuantCase {
            drawn,
            exact,
            blocks,
            format_error: Deviation::measure(&[], &[]),
        };
        case.share_activations();
        // Measured once, then the bf16 weights go: a full-size case holds the f32 copy and the
        // blocks only (3.8 GB for a 26B-A4B expert bank in Q8_0, not 5.3).
        case.format_error = case.format_error(Activation::default(), seed);
        case.drawn.params.iter_mut().for_each(|p| *p = Vec::new());
        case
    }

    /// The reference on the blocks' values against the reference on the bf16 weights they were
    /// made from (both with `act`), on the rows `compare` samples for `seed`.
    fn format_error(&self, act: Activation, seed: u64) -> Deviation {
        let (rows, _) = self.exact.rows();
        let sample = sample_rows(rows, SAMPLE_ROWS, seed, None);
        let (quantized, bf16): (Vec<Vec<f64>>, Vec<Vec<f64>>) = sample
            .par_iter()
            .map(|&r| {
                (
                    self.exact.reference_row(act, r),
                    self.drawn.reference_row(act, r),
                )
            })
            .unzip();
        let got: Vec<f32> = quantized.concat().iter().map(|&v| v as f32).collect();
        Deviation::measure(&got, &bf16.concat())
    }

    /// `exact`'s activations and routes set to `drawn`'s.
    fn share_activations(&mut self) {
        self.exact.x = self.drawn.x.iter().map(|v| v.to_f32()).collect();
        self.exact.act.clone_from(&self.drawn.act);
        self.exact.idx.clone_from(&self.drawn.idx);
        self.exact.weights.clone_from(&self.drawn.weights);
    }

    /// The inputs a quantized variant reads: the blocks beside `x`, the case's activations in
    /// f32 (`exact`'s) or bf16 (`drawn`'s), and `exact`'s routes (and, for `down`, its f32
    /// activation).
    pub fn inputs<'a, A>(&'a self, x: &'a [A]) -> Inputs<'a, Q, A> {
        let c = &self.exact;
        let p = |name| &self.blocks[param_index(c.op, name)][..];
        match c.op {
            Op::GateUp => Inputs::GateUp {
                x,
                idx: &c.idx,
                gate_up: p("gate_up"),
            },
            Op::Down => Inputs::Down {
                act: &c.act,
                idx: &c.idx,
                weights: &c.weights,
                down: p("down"),
            },
            Op::ExpertFfn => Inputs::ExpertFfn {
                x,
                idx: &c.idx,
                weights: &c.weights,
                gate_up: p("gate_up"),
                down: p("down"),
                bias: Biases::default(),
            },
            Op::LmHeadRow => Inputs::LmHeadRow {
                hidden: x,
                emb: p("emb"),
                softcap: c.softcap,
            },
            Op::DenseMlp => unreachable!("the checker keeps quantized weights off dense_mlp"),
        }
    }

    /// Runs `entry`'s variant for blocks of `Q` beside activations `x` (validated first).
    fn run_beside<A: QuantAct>(
        &self,
        on: &crate::Backend,
        entry: &KernelEntry,
        x: &[A],
        out: &mut [f32],
    ) -> Result<Ran, String> {
        let inputs = self.inputs(x);
        inputs
            .validate(self.shape(), out.len())
            .expect("the harness builds well-formed inputs");
        backend::run_quantized(on, entry, self.shape(), &inputs, out)
    }
}

impl<Q: QuantElem> Drawn for QuantCase<Q> {
    const DTYPE: DType = Q::DTYPE;
    const VALUES: usize = Q::VALUES;

    fn draw(op: Op, s: Shape, seed: u64) -> Self {
        QuantCase::new(op, s, seed)
    }

    /// The blocks and their f32 copy (the bf16 weights they were made from are dropped).
    fn weight_bytes(op: Op, s: &Shape) -> usize {
        let values = weight_values(op, s);
        values * 4 + values / Q::VALUES * std::mem::size_of::<Q>()
    }

    fn shape(&self) -> &Shape {
        &self.exact.shape
    }

    fn reseed_for(&mut self, k: &Kernel, seed: u64) {
        assert!(
            k.bias.is_none() && !k.output_gate,
            "the checker keeps biases and gates off quantized specs"
        );
        self.drawn.reseed(seed);
        self.share_activations();
    }

    fn run(
        &self,
        on: &crate::Backend,
        entry: &KernelEntry,
        dtype: DType,
        out: &mut [f32],
    ) -> Result<Ran, String> {
        assert_eq!(
            dtype.block_format(),
            Some(Q::DTYPE),
            "a case of {} runs that format",
            Q::DTYPE
        );
        match dtype.activation() {
            DType::F32 => self.run_beside(on, entry, &self.exact.x, out),
            DType::Bf16 => self.run_beside(on, entry, &self.drawn.x, out),
            d => unreachable!("no quantized dtype has {d} activations"),
        }
    }

    fn compare(
        &self,
        act: Activation,
        out: &[f32],
        argmax: Option<u32>,
        seed: u64,
    ) -> (Deviation, bool) {
        self.exact.compare(act, out, argmax, seed)
    }

    fn versus_cpu(&self, _: &KernelEntry, _: &[f32]) -> Option<Deviation> {
        None
    }

    fn work(&self) -> (f64, f64) {
        self.exact
            .work_at(std::mem::size_of::<Q>() as f64 / Q::VALUES as f64)
    }

    /// The format's error, measured when the case was drawn (with the default activation: the
    /// weights' error, not the spec's function, is what it reports).
    fn quantization(&self, _: Activation, _: u64) -> Option<Deviation> {
        Some(self.format_error)
    }
}

/// Random inputs of one op at one shape. Weights are scaled by 1/sqrt(fan-in) so activations stay
/// O(1) at every size.
#[derive(Debug)]
pub struct Case<W> {
    pub op: Op,
    pub shape: Shape,
    pub x: Vec<W>,
    pub idx: Vec<u32>,
    pub weights: Vec<f32>,
    pub act: Vec<f32>,
    /// The op's weight tensors, in the order of its table ([`Op::tensors`]); by name with
    /// [`Case::param`].
    pub params: Vec<Vec<W>>,
    pub softcap: Option<f32>,
    /// The expert FFN's biases, drawn for every expert FFN case (uniform in +-1, of the order of
    /// the products they are added to), and which of them the inputs carry: the spec's, set by
    /// the harness before each run.
    pub gate_up_bias: Vec<W>,
    pub down_bias: Vec<W>,
    pub bias: Bias,
    /// A dense MLP's output gate `[H]` (uniform in +-2/sqrt(H): sigmoids across (0.2, 0.8)),
    /// and whether the inputs carry it: the spec's, set by the harness.
    pub gate_w: Vec<W>,
    pub output_gate: bool,
}

impl<W: Elem> Case<W> {
    /// Draws weights from `seed` (and activations and routes, see [`Case::reseed`]): each of the
    /// op's weight tensors uniform in +-1/sqrt(its row length), except the LM head's embedding,
    /// uniform in +-1 so that logits reach the softcap.
    pub fn new(op: Op, s: Shape, seed: u64) -> Self {
        let params = weight_defs(op)
            .enumerate()
            .map(|(i, t)| {
                let scale = match op {
                    Op::LmHeadRow => 1.0,
                    _ => 1.0 / (t.row_len(&s).max(1) as f32).sqrt(),
                };
                uniform(t.len(&s), seed ^ (0x100 + i as u64), scale)
            })
            .collect();
        let mut case = Case {
            op,
            shape: s,
            x: vec![],
            idx: vec![],
            weights: vec![],
            act: vec![],
            params,
            softcap: Some(30.0),
            gate_up_bias: vec![],
            down_bias: vec![],
            bias: Bias::default(),
            gate_w: vec![],
            output_gate: false,
        };
        if op == Op::DenseMlp {
            case.gate_w = uniform(s.h, seed ^ 0x202, 2.0 / (s.h.max(1) as f32).sqrt());
        }
        if op == Op::ExpertFfn {
            case.gate_up_bias = uniform(GATE_UP_BIAS.len(&s), seed ^ 0x200, 1.0);
            case.down_bias = uniform(DOWN_BIAS.len(&s), seed ^ 0x201, 1.0);
        }
        case.reseed(seed);
        case
    }

    /// The weight tensor `name` of the op's table.
    pub fn param(&self, name: &str) -> &[W] {
        &self.params[param_index(self.op, name)]
    }

    /// The weight tensor `name`, to change (tests of bad inputs) or take (a resident session).
    pub fn param_mut(&mut self, name: &str) -> &mut Vec<W> {
        &mut self.params[param_index(self.op, name)]
    }

    /// Fresh activations, routes and route weights from `seed`; the weights stay.
    pub fn reseed(&mut self, seed: u64) {
        let s = self.shape;
        self.x = uniform(s.t * s.h, seed ^ 7, 1.0);
        self.act = if self.op == Op::Down {
            uniform::<f32>(s.t * s.r * s.f, seed ^ 8, 1.0)
        } else {
            vec![]
        };
        (self.idx, self.weights) = routes(s.t, s.r, s.e, seed ^ 9);
    }

    /// The biases the inputs carry ([`Case::bias`]).
    pub fn biases(&self) -> Biases<'_, W> {
        Biases {
            gate_up: self.bias.gate_up.then_some(&self.gate_up_bias[..]),
            down: self.bias.down.then_some(&self.down_bias[..]),
        }
    }

    pub fn inputs(&self) -> Inputs<'_, W> {
        let p = |name| self.param(name);
        match self.op {
            Op::GateUp => Inputs::GateUp {
                x: &self.x,
                idx: &self.idx,
                gate_up: p("gate_up"),
            },
            Op::Down => Inputs::Down {
                act: &self.act,
                idx: &self.idx,
                weights: &self.weights,
                down: p("down"),
            },
            Op::ExpertFfn => Inputs::ExpertFfn {
                bias: self.biases(),
                x: &self.x,
                idx: &self.idx,
                weights: &self.weights,
                gate_up: p("gate_up"),
                down: p("down"),
            },
            Op::DenseMlp => Inputs::DenseMlp {
                x: &self.x,
                gate: p("gate"),
                up: p("up"),
                down: p("down"),
                output_gate: self.output_gate.then_some(&self.gate_w[..]),
            },
            Op::LmHeadRow => Inputs::LmHeadRow {
                hidden: &self.x,
                emb: p("emb"),
                softcap: self.softcap,
            },
        }
    }

    /// The reference for output row `row` (a token; for the LM head, a vocabulary row) of a spec
    /// with activation `act` (cases are shared by every spec of one op and shape).
    pub fn reference_row(&self, act: Activation, row: usize) -> Vec<f64> {
        let (s, p) = (&self.shape, |name| self.param(name));
        match self.op {
            Op::GateUp => reference::gate_up(s, act, &self.x, &self.idx, p("gate_up"), row),
            Op::Down => reference::down(s, &self.act, &self.idx, &self.weights, p("down"), row),
            Op::ExpertFfn => reference::expert_ffn(
                s,
                act,
                &self.x,
                &self.idx,
                &self.weights,
                p("gate_up"),
                p("down"),
                self.biases(),
                row,
            ),
            Op::DenseMlp => {
                let gate = self.output_gate.then_some(&self.gate_w[..]);
                reference::dense_mlp(s, act, &self.x, p("gate"), p("up"), p("down"), gate, row)
            }
            Op::LmHeadRow => {
                reference::lm_head_row(s, &self.x, p("emb"), self.softcap.map(f64::from), &[row])
            }
        }
    }

    /// Output rows and their width: tokens (the LM head: vocabulary rows of width 1).
    pub fn rows(&self) -> (usize, usize) {
        let s = &self.shape;
        match self.op {
            Op::GateUp => (s.t, s.r * s.f),
            Op::LmHeadRow => (s.v, 1),
            _ => (s.t, s.h),
        }
    }

    /// Deviation from the reference on a sample of rows (all rows when few), and whether the
    /// argmax (LM head) is the largest logit. Non-finite elements anywhere count.
    pub fn compare(
        &self,
        act: Activation,
        out: &[f32],
        argmax: Option<u32>,
        seed: u64,
    ) -> (Deviation, bool) {
        let (rows, width) = self.rows();
        let sample = sample_rows(
            rows,
            if self.op == Op::LmHeadRow {
                64 * SAMPLE_ROWS
            } else {
                SAMPLE_ROWS
            },
            seed,
            argmax,
        );
        let want: Vec<Vec<f64>> = sample
            .par_iter()
            .map(|&r| self.reference_row(act, r))
            .collect();
        let got: Vec<f32> = sample
            .iter()
            .flat_map(|&r| out[r * width..(r + 1) * width].iter().copied())
            .collect();
        let mut dev = Deviation::measure(&got, &want.concat());
        dev.non_finite = out.iter().filter(|v| !v.is_finite()).count();
        dev.count = out.len();
        let argmax_ok = match (self.op, argmax) {
            (Op::LmHeadRow, Some(i)) => out.iter().all(|&v| v <= out[i as usize]),
            (Op::LmHeadRow, None) => false,
            _ => true,
        };
        (dev, argmax_ok)
    }

    /// (weight bytes the op must read at `b` bytes a weight, flops) for this case's routes.
    pub fn work_at(&self, b: f64) -> (f64, f64) {
        let s = &self.shape;
        let experts = {
            let mut seen = vec![false; s.e];
            self.idx.iter().for_each(|&e| seen[e as usize] = true);
            seen.iter().filter(|&&x| x).count() as f64
        };
        let (t, r, h, f, v) = (s.t as f64, s.r as f64, s.h as f64, s.f as f64, s.v as f64);
        match self.op {
            Op::GateUp => (experts * 2.0 * f * h * b, 2.0 * t * r * 2.0 * f * h),
            Op::Down => (experts * h * f * b, 2.0 * t * r * h * f),
            Op::ExpertFfn => (experts * 3.0 * f * h * b, 2.0 * t * r * 3.0 * f * h),
            Op::DenseMlp => (3.0 * f * h * b, 2.0 * t * 3.0 * f * h),
            Op::LmHeadRow => (v * h * b, 2.0 * v * h),
        }
    }
}

/// The op's weight tensors, in table order.
fn weight_defs(op: Op) -> impl Iterator<Item = &'static TensorDef> {
    op.tensors().iter().filter(|t| t.role == TensorRole::Weight)
}

/// Values in the weight tensors of `op` at `s`.
fn weight_values(op: Op, s: &Shape) -> usize {
    weight_defs(op).map(|t| t.len(s)).sum()
}

fn param_index(op: Op, name: &str) -> usize {
    weight_defs(op)
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("`{op}` has no weight tensor `{name}`"))
}

/// `len` values uniform in `[-scale, scale)`, drawn in parallel chunks (deterministic in `seed`).
///
/// With the `cpu` feature the buffer lives in huge pages (`moek_cpu::memory`): benches stream
/// these as weights, and 4 KiB pages would halve the bandwidth they measure.
pub fn uniform<W: Elem>(len: usize, seed: u64, scale: f32) -> Vec<W> {
    #[cfg(feature = "cpu")]
    let mut v = moek_cpu::memory::huge_vec(len);
    #[cfg(not(feature = "cpu"))]
    let mut v = vec![W::default(); len];
    v.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
        let mut rng = chunk_rng(seed, i);
        c.iter_mut()
            .for_each(|x| *x = W::from_f32(rng.random_range(-scale..scale)));
    });
    v
}

/// [`uniform`]'s values in `W`, quantized to blocks of `Q` as they are drawn (never all held
/// in `W`): the blocks [`moek_ir::quant::quantize`] makes of `uniform::<W>(len, seed, scale)`.
pub fn uniform_blocks<W: Elem, Q: QuantElem>(len: usize, seed: u64, scale: f32) -> Vec<Q> {
    assert!(
        len.is_multiple_of(Q::VALUES),
        "{len} values are not whole blocks of {}",
        Q::VALUES
    );
    #[cfg(feature = "cpu")]
    let mut v = moek_cpu::memory::huge_vec(len / Q::VALUES);
    #[cfg(not(feature = "cpu"))]
    let mut v = vec![Q::default(); len / Q::VALUES];
    v.par_chunks_mut(CHUNK / Q::VALUES)
        .enumerate()
        .for_each(|(i, c)| {
            let mut rng = chunk_rng(seed, i);
            let mut values = vec![0f32; Q::VALUES];
            for b in c {
                for x in &mut values {
                    *x = W::from_f32(rng.random_range(-scale..scale)).to_f32();
                }
                *b = Q::quantize(&values);
            }
        });
    v
}

/// Values per independently seeded chunk of [`uniform`] (a multiple of the quantized block).
const CHUNK: usize = 1 << 16;

fn chunk_rng(seed: u64, chunk: usize) -> SmallRng {
    SmallRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ chunk as u64)
}

/// Top-`r` routes per token: distinct experts (when `r <= e`) with positive weights summing to 1.
pub fn routes(t: usize, r: usize, e: usize, seed: u64) -> (Vec<u32>, Vec<f32>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut idx = Vec::with_capacity(t * r);
    let mut weights = Vec::with_capacity(t * r);
    let mut experts: Vec<u32> = (0..e as u32).collect();
    for _ in 0..t {
        for j in 0..r {
            let pick = if r <= e {
                rng.random_range(j..e)
            } else {
                rng.random_range(0..e)
            };
            experts.swap(j.min(e - 1), pick);
            idx.push(experts[j.min(e - 1)]);
        }
        let w: Vec<f32> = (0..r).map(|_| rng.random_range(0.05f32..1.0)).collect();
        let sum: f32 = w.iter().sum();
        weights.extend(w.iter().map(|x| x / sum));
    }
    (idx, weights)
}

/// Up to `n` distinct rows of `0..rows` (all when few): first, last, the argmax, and random ones.
fn sample_rows(rows: usize, n: usize, seed: u64, argmax: Option<u32>) -> Vec<usize> {
    if rows <= n {
        return (0..rows).collect();
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5A5A);
    let mut pick = vec![0, rows - 1];
    pick.extend(argmax.map(|a| a as usize));
    while pick.len() < n {
        pick.push(rng.random_range(0..rows));
    }
    pick.sort_unstable();
    pick.dedup();
    pick
}
