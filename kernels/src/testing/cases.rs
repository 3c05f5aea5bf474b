//! Running drawn cases: one seed or many, and [`Cases`], which keeps drawn cases so every
//! backend and spec of one shape share weights.

use super::*;

/// Runs one spec once per seed (weights drawn once from the first seed, activations and routes
/// fresh per seed), returning a report per run.
pub fn run_seeds(
    entry: &KernelEntry,
    target: Target,
    dtype: DType,
    shape: &Shape,
    seeds: &[u64],
) -> Vec<Report> {
    Cases::default()
        .run_seeds(entry, target, dtype, shape, seeds)
        .unwrap_or_else(|e| panic!("{e}"))
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

/// Op, the shape's weight dims (tokens and routes zero), dtype and values per stored weight (a
/// quantized case's block size), seed.
type CaseKey = (Op, Shape, DType, usize, u64);

impl std::fmt::Debug for Cases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.kept.iter().map(|(key, _, _)| key))
            .finish()
    }
}

impl Cases {
    /// Weight bytes the kept cases may hold together: two 26B-A4B expert banks in f32 (3 GB
    /// each), or a bank in every plain dtype. The newest case is kept whatever its size. A process
    /// peaks near this plus one case's drawing, so several `moek check` runs (the CLI tests run
    /// them side by side) stay within a 24 GB machine.
    pub const BUDGET: usize = 8_000_000_000;

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
        self.run_seeds(entry, target, dtype, shape, &[seed])
            .map(|mut r| r.remove(0))
    }

    /// [`run_seeds`] on the kept case whose weights were drawn from `seeds[0]`, or a new one;
    /// `Err` says why the backend could not run it.
    pub fn run_seeds(
        &mut self,
        entry: &KernelEntry,
        target: Target,
        dtype: DType,
        shape: &Shape,
        seeds: &[u64],
    ) -> Result<Vec<Report>, String> {
        match dtype {
            DType::F16 => self.run_typed::<Case<f16>>(entry, target, dtype, shape, seeds),
            DType::Bf16 => self.run_typed::<Case<bf16>>(entry, target, dtype, shape, seeds),
            DType::F32 => self.run_typed::<Case<f32>>(entry, target, dtype, shape, seeds),
            // One case per block format and size: its f32 and bf16 activations hold the same
            // values.
            _ => crate::with_block!(dtype, entry.ir().quant_block, |Q| {
                self.run_typed::<QuantCase<Q>>(entry, target, dtype, shape, seeds)
            }),
        }
    }

    fn run_typed<C: Drawn + 'static>(
        &mut self,
        entry: &KernelEntry,
        target: Target,
        dtype: DType,
        shape: &Shape,
        seeds: &[u64],
    ) -> Result<Vec<Report>, String> {
        let op = entry.ir().op;
        // Keyed by the dims weights span: one case serves every token count and route count.
        let dims = Shape {
            t: 0,
            r: 0,
            ..*shape
        };
        debug_assert_eq!(weight_values(op, &dims), weight_values(op, shape));
        let key = (op, dims, C::DTYPE, C::VALUES, seeds[0]);
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
                let case: Box<dyn std::any::Any> = Box::new(C::draw(op, *shape, seeds[0]));
                (key, bytes, case)
            }
        };
        self.kept.insert(0, kept);
        let case = self.kept[0]
            .2
            .downcast_mut::<C>()
            .expect("the key names the dtype");
        case.set_tokens(shape.t, shape.r);
        run_case(entry, target, dtype, case, seeds)
    }
}

/// Runs `entry`'s `dtype` variant on `case` once per seed (activations and routes redrawn from
/// each); a backend that fails to run it (a device error, a program the simulator refuses) is an
/// `Err`.
pub(super) fn run_case<C: Drawn>(
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
            let versus_schedule = if target == Target::Cpu && entry.run_time_tables().is_none() {
                versus_run_time_schedule(entry, dtype, case, &on, &out, argmax)?
            } else {
                None
            };
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
                tolerance: backend::runtime(target).tolerance(k, dtype),
                seconds,
                bytes,
                flops,
                argmax_ok,
                modeled,
                versus_cpu,
                versus_schedule,
                quantization: case.quantization(k.activation, seed),
            })
        })
        .collect()
}

/// The compiled CPU variant's output `out` (and argmax) against the same schedule built at run
/// time from the spec's IR ([`KernelEntry::scheduled`]) on the same inputs: the two run the same
/// skeletons on the same tables, so every element must match bit for bit. The first difference,
/// if any, is described; a twin that fails to run is an `Err`.
fn versus_run_time_schedule<C: Drawn>(
    entry: &KernelEntry,
    dtype: DType,
    case: &C,
    on: &crate::Backend,
    out: &[f32],
    argmax: Option<u32>,
) -> Result<Option<String>, String> {
    let scheduled = KernelEntry::scheduled(entry.ir().clone());
    let mut again = vec![f32::NAN; out.len()];
    let ran = case.run(on, &scheduled, dtype, &mut again)?;
    let differs = out
        .iter()
        .zip(&again)
        .position(|(a, b)| a.to_bits() != b.to_bits());
    Ok(match (differs, ran.argmax == argmax) {
        (None, true) => None,
        (Some(i), _) => Some(format!(
            "the schedule run from its IR gave {} at element {i} where the compiled variant gave {}",
            again[i], out[i]
        )),
        (None, false) => Some(format!(
            "the schedule run from its IR chose token {:?} where the compiled variant chose {argmax:?}",
            ran.argmax
        )),
    })
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
    /// Sets the tokens and routes the next [`Drawn::reseed_for`] draws activations and routes
    /// for (the weights do not depend on them).
    fn set_tokens(&mut self, t: usize, r: usize);
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
