//! A case with weights in quantized blocks: drawn in bf16, quantized, and held to the reference
//! on the blocks' exact values (read from the blocks: no dequantized copy), the format's own
//! error reported beside it.

use super::*;

/// A case for weights quantized to blocks of `Q`: drawn in bf16 (`drawn`: its activations and
/// routes; its weights are dropped once the format's error is measured), its weights quantized
/// (`blocks`, what the reference reads, at their exact values), and the same case's activations
/// in f32 (`exact`: widened from `drawn`'s, routes shared; it holds no weights). A variant
/// beside bf16 activations reads `drawn`'s, one beside f32 activations `exact`'s: the same
/// values.
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

impl<Q: Element> QuantCase<Q> {
    pub fn new(op: Op, s: Shape, seed: u64) -> Self {
        let drawn = Case::<bf16>::new(op, s, seed);
        // The weights in blocks: every one the op's table stores in the variant's dtype (the
        // output gate, the one optional such weight, is dense_mlp's, which has no quantized
        // variant); the biases stay f32.
        let blocks: Vec<Vec<Q>> = drawn
            .params
            .iter()
            .map(|p| crate::blocks::quantize(p))
            .collect();
        let exact = Case::<f32> {
            op,
            shape: s,
            x: vec![],
            idx: vec![],
            weights: vec![],
            act: vec![],
            // No weights: the reference reads the blocks.
            params: weight_defs(op).map(|_| Vec::new()).collect(),
            f32_params: drawn.f32_params.clone(),
            softcap: drawn.softcap,
            optional: Optionals::NONE,
        };
        let mut case = QuantCase {
            drawn,
            exact,
            blocks,
            format_error: Deviation::measure(&[], &[]),
        };
        case.share_activations();
        // Measured once, then the bf16 weights go: a full-size case holds the blocks only (0.8
        // GB for a 26B-A4B expert bank in Q8_0, where the bf16 weights were 1.5).
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
                    self.exact.reference_row_on(&self.blocks, act, r),
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
        assert_ne!(
            c.op,
            Op::DenseMlp,
            "the checker keeps quantized weights off dense_mlp"
        );
        Inputs::from_table(c.op, c.optional, c.softcap, |row| match row.class {
            ElemClass::Activation => Bound::Act(x),
            ElemClass::Index => Bound::Index(&c.idx),
            ElemClass::F32 if *row == ACT => Bound::F32(&c.act),
            ElemClass::F32 if row.role == TensorRole::Weight => Bound::F32(c.f32_param(row.name)),
            ElemClass::F32 => Bound::F32(&c.weights),
            ElemClass::Weight => Bound::Weight(&self.blocks[param_index(c.op, row.name)]),
        })
    }

    /// Runs `entry`'s variant for blocks of `Q` beside activations `x` (validated first).
    fn run_beside<A: Element>(
        &self,
        on: &crate::Backend,
        entry: &KernelEntry,
        x: &[A],
        out: &mut [f32],
    ) -> Result<Ran, String> {
        let inputs = self.inputs(x);
        let dtype = moek_ir::element::quantized_dtype::<Q, A>();
        run_checked(on, entry, self.shape(), AnyInputs::new(&inputs, dtype), out)
    }
}

impl<Q: Element> Drawn for QuantCase<Q> {
    const DTYPE: DType = moek_ir::element::quantized_dtype::<Q, f32>();
    const VALUES: usize = Q::VALUES;

    fn draw(op: Op, s: Shape, seed: u64) -> Self {
        QuantCase::new(op, s, seed)
    }

    /// The blocks (the bf16 weights they were made from are dropped).
    fn weight_bytes(op: Op, s: &Shape) -> usize {
        weight_values(op, s) / Q::VALUES * std::mem::size_of::<Q>()
    }

    fn shape(&self) -> &Shape {
        &self.exact.shape
    }

    fn set_tokens(&mut self, t: usize, r: usize) {
        self.drawn.set_tokens(t, r);
        self.exact.set_tokens(t, r);
    }

    fn reseed_for(&mut self, k: &Kernel, seed: u64) {
        (self.drawn.optional, self.exact.optional) = (k.optional, k.optional);
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
            dtype.blocks(),
            Some(Q::FORMAT),
            "a case of {} runs that format",
            Q::FORMAT
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
        self.exact.compare_on(&self.blocks, act, out, argmax, seed)
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
