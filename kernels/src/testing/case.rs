//! A case in a plain dtype: inputs drawn for an op at a shape, run on a target, compared with the
//! reference.

use super::*;

impl<W: Element> Drawn for Case<W> {
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

    fn set_tokens(&mut self, t: usize, r: usize) {
        (self.shape.t, self.shape.r) = (t, r);
    }

    fn reseed_for(&mut self, k: &Kernel, seed: u64) {
        self.reseed(seed);
        self.optional = k.optional;
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
        run_checked(
            on,
            entry,
            &self.shape,
            AnyInputs::new(&inputs, W::DTYPE),
            out,
        )
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
        let f = entry.cpu.get::<W, W>()?;
        let mut cpu = vec![f32::NAN; out.len()];
        f(&self.shape, &self.inputs(), &mut cpu);
        let want: Vec<f64> = cpu.iter().map(|&v| f64::from(v)).collect();
        Some(Deviation::measure(out, &want))
    }

    fn work(&self) -> (f64, f64) {
        self.work_at(std::mem::size_of::<W>() as f64)
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
    /// The op's weight tensors, the optional ones included, in the order of its table
    /// ([`Op::tensors`]); by name with [`Case::param`].
    pub params: Vec<Vec<W>>,
    /// The op's f32 weights (the experts' biases), in table order; by name with
    /// [`Case::f32_param`].
    pub f32_params: Vec<Vec<f32>>,
    pub softcap: Option<f32>,
    /// The optional tensors the inputs carry (all are drawn): the spec's, set by the harness
    /// before each run.
    pub optional: Optionals,
}

impl<W: Element> Case<W> {
    /// Draws weights from `seed` (and activations and routes, see [`Case::reseed`]): each of the
    /// op's weight tensors uniform in +-1/sqrt(its row length), except the LM head's embedding,
    /// uniform in +-1 so that logits reach the softcap.
    pub fn new(op: Op, s: Shape, seed: u64) -> Self {
        let params = weight_defs(op)
            .enumerate()
            .map(|(i, t)| uniform(t.len(&s), seed ^ (0x100 + i as u64), draw_scale(op, t, &s)))
            .collect();
        let f32_params = f32_weight_defs(op)
            .enumerate()
            .map(|(i, t)| uniform(t.len(&s), seed ^ (0x200 + i as u64), draw_scale(op, t, &s)))
            .collect();
        let mut case = Case {
            op,
            shape: s,
            x: vec![],
            idx: vec![],
            weights: vec![],
            act: vec![],
            params,
            f32_params,
            softcap: Some(30.0),
            optional: Optionals::NONE,
        };
        case.reseed(seed);
        case
    }

    /// The weight tensor `name` of the op's table.
    pub fn param(&self, name: &str) -> &[W] {
        &self.params[param_index(self.op, name)]
    }

    /// The f32 weight tensor `name` of the op's table (a bias).
    pub fn f32_param(&self, name: &str) -> &[f32] {
        let i = f32_weight_defs(self.op).position(|t| t.name == name);
        &self.f32_params[i.unwrap_or_else(|| panic!("`{}` has no f32 weight `{name}`", self.op))]
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

    /// The biases the inputs carry.
    pub fn biases(&self) -> Biases<'_> {
        self.inputs().biases()
    }

    /// The inputs, bound by the op table from the case's tensors.
    pub fn inputs(&self) -> Inputs<'_, W> {
        Inputs::from_table(self.op, self.optional, self.softcap, |row| {
            match row.class {
                ElemClass::Activation => Bound::Act(&self.x),
                ElemClass::Index => Bound::Index(&self.idx),
                ElemClass::F32 if *row == ACT => Bound::F32(&self.act),
                ElemClass::F32 if row.role == TensorRole::Weight => {
                    Bound::F32(self.f32_param(row.name))
                }
                ElemClass::F32 => Bound::F32(&self.weights),
                ElemClass::Weight => Bound::Weight(self.param(row.name)),
            }
        })
    }

    /// The reference for output row `row` (a token; for the LM head, a vocabulary row) of a spec
    /// with activation `act` (cases are shared by every spec of one op and shape).
    pub fn reference_row(&self, act: Activation, row: usize) -> Vec<f64> {
        self.reference_row_on(&self.params, act, row)
    }

    /// [`Case::reference_row`] with `params` (the op's weight tensors in table order, plain or
    /// in blocks, read at their exact values) in place of the case's own weights.
    pub fn reference_row_on<P: Element>(
        &self,
        params: &[Vec<P>],
        act: Activation,
        row: usize,
    ) -> Vec<f64> {
        let s = &self.shape;
        let p = |name| params[param_index(self.op, name)].as_slice();
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
                let gate = self
                    .optional
                    .has(Optional::OutputGate)
                    .then(|| p(Optional::OutputGate.name()));
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
        self.compare_on(&self.params, act, out, argmax, seed)
    }

    /// [`Case::compare`] against the reference on `params` ([`Case::reference_row_on`]).
    pub fn compare_on<P: Element>(
        &self,
        params: &[Vec<P>],
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
            .map(|&r| self.reference_row_on(params, act, r))
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

/// The op's weight tensors in the variant's dtype, the optional ones included, in table order.
pub(super) fn weight_defs(op: Op) -> impl Iterator<Item = &'static TensorDef> {
    op.tensors()
        .iter()
        .filter(|t| t.role == TensorRole::Weight && t.class == ElemClass::Weight)
}

/// The op's weight tensors in f32 (the experts' biases), in table order.
pub(super) fn f32_weight_defs(op: Op) -> impl Iterator<Item = &'static TensorDef> {
    op.tensors()
        .iter()
        .filter(|t| t.role == TensorRole::Weight && t.class == ElemClass::F32)
}

/// The half-width of a weight tensor's uniform draw: 1/sqrt(its row length), so activations stay
/// O(1) at every size; but +-1 for the LM head's embedding (logits then reach the softcap) and
/// for biases (of the order of the products they are added to), and +-2/sqrt(H) for the output
/// gate (sigmoids across (0.2, 0.8)).
fn draw_scale(op: Op, t: &TensorDef, s: &Shape) -> f32 {
    match (op, t.when) {
        (Op::LmHeadRow, _) | (_, Some(Optional::GateUpBias | Optional::DownBias)) => 1.0,
        (_, Some(Optional::OutputGate)) => 2.0 / (s.h.max(1) as f32).sqrt(),
        (_, None) => 1.0 / (t.row_len(s).max(1) as f32).sqrt(),
    }
}

/// Values in the weight tensors every spec of `op` reads at `s`.
pub(super) fn weight_values(op: Op, s: &Shape) -> usize {
    weight_defs(op)
        .filter(|t| t.when.is_none())
        .map(|t| t.len(s))
        .sum()
}

pub(super) fn param_index(op: Op, name: &str) -> usize {
    weight_defs(op)
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("`{op}` has no weight tensor `{name}`"))
}
