//! Rules of the block-quantized weight dtypes (`q8_0`, `q4_0`): where they are lowered, and that
//! every reduction a weight row is read along is cut on whole blocks.

use super::{Checker, Parsed};
use moek_ir::quant::BLOCK;
use moek_ir::*;

impl Checker {
    pub(super) fn quant_rules(&mut self, k: &Kernel, p: &Parsed) {
        let Some(&(dtype, span)) = p.dtypes.iter().find(|d| d.0.is_quantized()) else {
            return;
        };
        let lowered = match k.op {
            Op::GateUp | Op::Down | Op::ExpertFfn => k.schedule.select == Selection::Gather,
            Op::LmHeadRow => true,
            Op::DenseMlp => false,
        };
        if !lowered {
            let what = match k.op.uses_experts() {
                true => format!("`select: {}`", k.schedule.select),
                false => format!("`{}`", k.op),
            };
            self.errors.push(
                span,
                format!(
                    "`{dtype}` weights are lowered for the matrix-vector products only (`gate_up`, `down`, `expert_ffn` with `select: gather`, and `lm_head_row`): {what} reads f16, bf16 or f32 weights"
                ),
            );
        }
        if let Some(&(_, at)) = p.bias.first() {
            self.errors.push(
                at,
                format!(
                    "`{dtype}` experts have no bias variant: biases stay f16, bf16 or f32 specs"
                ),
            );
        }
        if let Some(&(_, at)) = p.targets.iter().find(|t| t.0 == Target::Spyre) {
            self.errors.push(
                at,
                format!(
                    "Spyre cannot run `{dtype}`: its program format states every operand as DL16 or f32 sticks and its matmul multiplies DL16, so there is no integer weight to name (a host that dequantizes first would run a bf16 program, not this one); drop `spyre`, or keep it in a bf16 spec"
                ),
            );
        }
        self.whole_blocks(k, p, dtype);
    }

    /// The dims weight rows run along (H for gate/up, F for down), their reduction blocks and
    /// their core splits must fall on block boundaries.
    fn whole_blocks(&mut self, k: &Kernel, p: &Parsed, dtype: DType) {
        let rows: &[DimName] = match k.op {
            Op::GateUp | Op::LmHeadRow => &[DimName::H],
            Op::Down => &[DimName::F],
            Op::ExpertFfn | Op::DenseMlp => &[DimName::H, DimName::F],
        };
        let hint = |n: usize| {
            let below = n / BLOCK * BLOCK;
            match below {
                0 => format!("{}", BLOCK),
                b => format!("{b} or {}", b + BLOCK),
            }
        };
        for &dim in rows {
            let size = k.dim(dim).and_then(|d| d.size);
            if let (Some(n), Some(decl)) =
                (size, p.dims.iter().flatten().find(|d| d.name == dim.name()))
                && n % BLOCK != 0
            {
                let at = decl.size.as_ref().map_or(decl.name.span(), |s| s.span());
                self.errors.push(
                    at,
                    format!(
                        "`{dtype}` stores weight rows in blocks of {BLOCK} values, and `{dim}` = {n} is not a multiple of {BLOCK} (say {})",
                        hint(n)
                    ),
                );
            }
            for decl in p.reduce.iter().filter(|b| b.dim == dim.name()) {
                if let Some(lit) = decl
                    .sizes
                    .iter()
                    .find(|s| s.base10_parse::<usize>().is_ok_and(|n| n % BLOCK != 0))
                {
                    let n: usize = lit.base10_parse().unwrap_or(0);
                    self.errors.push(
                        lit.span(),
                        format!(
                            "a reduction block of `{dtype}` weights is whole blocks of {BLOCK} values; {n} is not (say {})",
                            hint(n)
                        ),
                    );
                }
            }
            for (_, _, cores) in &p.cores {
                for (d, lit) in cores.dims.iter().zip(&cores.parts) {
                    let parts: usize = lit.base10_parse().unwrap_or(1);
                    if d != dim.name() || parts <= 1 {
                        continue;
                    }
                    if let Some(n) = size
                        && !(n / BLOCK).is_multiple_of(parts)
                    {
                        let blocks = n / BLOCK;
                        let valid: Vec<String> = (2..=blocks.min(MAX_CORES))
                            .filter(|p| blocks.is_multiple_of(*p))
                            .map(|p| p.to_string())
                            .collect();
                        let valid = match valid.is_empty() {
                            true => "none, do not split it".to_string(),
                            false => valid.join(", "),
                        };
                        self.errors.push(
                            lit.span(),
                            format!(
                                "`{dim}` = {n} split {parts} ways does not cut on whole blocks of {BLOCK} `{dtype}` values ({blocks} blocks); valid splits: {valid}"
                            ),
                        );
                    } else if size.is_none() {
                        self.errors.push(
                            lit.span(),
                            format!(
                                "a split of free `{dim}` cannot be shown to cut on whole blocks of {BLOCK} `{dtype}` values: fix `{dim}`, or do not split it"
                            ),
                        );
                    }
                }
            }
        }
    }
}
