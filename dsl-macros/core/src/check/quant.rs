//! Rules of the block-quantized weight dtypes (`q8_0`, `q4_0`, `mxfp4`): their block size, where they are
//! lowered, and that every reduction a weight row is read along is cut on whole blocks.

use super::{Checker, Parsed};
use moek_ir::quant::{BLOCK, BLOCK_SIZES, GROUP};
use moek_ir::*;

impl Checker {
    /// The declared block size (`quant_block: N`): one of [`BLOCK_SIZES`], and only beside a
    /// quantized dtype. 32, llama.cpp's, when none is declared (or the one declared is wrong:
    /// the error stops the spec).
    pub(super) fn quant_block(&mut self, p: &Parsed) -> usize {
        let Some(lit) = &p.quant_block else {
            return BLOCK;
        };
        if !p.dtypes.iter().any(|d| d.0.is_quantized()) {
            self.errors.push(
                lit.span(),
                format!(
                    "`quant_block: {lit}` sizes the blocks of quantized weights, and this spec declares no quantized dtype (q8_0, q4_0, mxfp4, q8_0_bf16, q4_0_bf16, mxfp4_bf16)"
                ),
            );
            return BLOCK;
        }
        let fixed = p
            .dtypes
            .iter()
            .find_map(|d| Some((d.0, d.0.blocks()?.fixed_block()?)));
        match lit.base10_parse::<usize>() {
            Ok(n) if fixed.is_some_and(|(_, b)| b != n) => {
                let (dtype, b) = fixed.expect("checked");
                self.errors.push(
                    lit.span(),
                    format!(
                        "a quantized block of {n} values: `{dtype}` fixes its block at {b} values (one scale each, as the format defines it); drop `quant_block` or declare {b}"
                    ),
                );
                b
            }
            Ok(n) if BLOCK_SIZES.contains(&n) => n,
            _ => {
                let valid: Vec<String> = BLOCK_SIZES.iter().map(|b| b.to_string()).collect();
                self.errors.push(
                    lit.span(),
                    format!(
                        "a quantized block of {lit} values: a block is 1, 2, 4 or 8 groups of {GROUP} values (the kernels read a group at a time) under one scale; valid: {}",
                        valid.join(", ")
                    ),
                );
                BLOCK
            }
        }
    }

    pub(super) fn quant_rules(&mut self, k: &Kernel, p: &Parsed) {
        let Some(&(dtype, span)) = p.dtypes.iter().find(|d| d.0.is_quantized()) else {
            return;
        };
        let lowered = match k.op {
            Op::GateUp | Op::Down => k.schedule.select == Selection::Gather,
            Op::ExpertFfn => true,
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
                    "`{dtype}` weights are lowered for `gate_up` and `down` with `select: gather`, `expert_ffn`, and `lm_head_row`: {what} reads f16, bf16 or f32 weights"
                ),
            );
        }
        // The persistent loop over blocks is the CPU's (GEMMs over the blocks); the WGSL
        // persistent program reads plain banks.
        let dense = k.op == Op::ExpertFfn && k.schedule.select == Selection::Dense;
        if let Some(&(_, at)) = p.targets.iter().find(|t| t.0 == Target::Wgpu && dense) {
            self.errors.push(
                at,
                format!(
                    "wgpu runs `{dtype}` expert FFNs with `select: gather`: its persistent program (`select: dense`) reads f16, bf16 or f32 banks; drop `wgpu`, or select `gather E by R`"
                ),
            );
        }
        if let Some(&(_, at)) = p.targets.iter().find(|t| t.0 == Target::Spyre) {
            let what = match dtype.blocks() {
                Some(BlockFormat::Mxfp4) => "4-bit float (e2m1)",
                _ => "integer",
            };
            self.errors.push(
                at,
                format!(
                    "Spyre cannot run `{dtype}`: its program format states every operand as DL16 or f32 sticks and its matmul multiplies DL16, so there is no {what} weight to name (a host that dequantizes first would run a bf16 program, not this one); drop `spyre`, or keep it in a bf16 spec"
                ),
            );
        }
        self.whole_blocks(k, p, dtype);
    }

    /// The dims weight rows run along (H for gate/up, F for down), their reduction blocks and
    /// their core splits in a phase that sums over them must fall on block boundaries. A dim the declared block size does not
    /// divide is an error on that size; with the default block, on the dim.
    fn whole_blocks(&mut self, k: &Kernel, p: &Parsed, dtype: DType) {
        let block = k.quant_block;
        let rows: &[DimName] = match k.op {
            Op::GateUp | Op::LmHeadRow => &[DimName::H],
            Op::Down => &[DimName::F],
            Op::ExpertFfn | Op::DenseMlp => &[DimName::H, DimName::F],
        };
        let hint = |n: usize| {
            let below = n / block * block;
            match below {
                0 => format!("{block}"),
                b => format!("{b} or {}", b + block),
            }
        };
        for &dim in rows {
            let size = k.dim(dim).and_then(|d| d.size);
            if let (Some(n), Some(decl)) =
                (size, p.dims.iter().flatten().find(|d| d.name == dim.name()))
                && n % block != 0
            {
                if let Some(lit) = p.quant_block.as_ref().filter(|_| block != BLOCK) {
                    let fit: Vec<String> = BLOCK_SIZES
                        .iter()
                        .filter(|b| n.is_multiple_of(**b))
                        .map(|b| b.to_string())
                        .collect();
                    let fit = match fit.is_empty() {
                        true => format!("none: `{dim}` is not whole groups of {GROUP}"),
                        false => fit.join(", "),
                    };
                    self.errors.push(
                        lit.span(),
                        format!(
                            "a `{dtype}` weight row along `{dim}` = {n} is not whole blocks of {block} values ({n} / {block} = {:.2}); block sizes that divide it: {fit}",
                            n as f64 / block as f64
                        ),
                    );
                } else {
                    let at = decl.size.as_ref().map_or(decl.name.span(), |s| s.span());
                    self.errors.push(
                        at,
                        format!(
                            "`{dtype}` stores weight rows in blocks of {block} values, and `{dim}` = {n} is not a multiple of {block} (say {})",
                            hint(n)
                        ),
                    );
                }
            }
            for decl in p.reduce.iter().filter(|b| b.dim == dim.name()) {
                if let Some(lit) = decl
                    .sizes
                    .iter()
                    .find(|s| s.base10_parse::<usize>().is_ok_and(|n| n % block != 0))
                {
                    let n: usize = lit.base10_parse().unwrap_or(0);
                    self.errors.push(
                        lit.span(),
                        format!(
                            "a reduction block of `{dtype}` weights is whole blocks of {block} values; {n} is not (say {})",
                            hint(n)
                        ),
                    );
                }
            }
            // A split cuts weight rows only in a phase that sums over its dim (F cuts gate/up's
            // outputs, not their rows; H likewise down's).
            for (phase, _, cores) in &p.cores {
                let reduces = k.op.reduction_dims(*phase).contains(&dim);
                for (d, lit) in cores.dims.iter().zip(&cores.parts) {
                    let parts: usize = lit.base10_parse().unwrap_or(1);
                    if d != dim.name() || parts <= 1 || !reduces {
                        continue;
                    }
                    if let Some(n) = size
                        && !(n / block).is_multiple_of(parts)
                    {
                        let blocks = n / block;
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
                                "`{dim}` = {n} split {parts} ways does not cut on whole blocks of {block} `{dtype}` values ({blocks} blocks); valid splits: {valid}"
                            ),
                        );
                    } else if size.is_none() {
                        self.errors.push(
                            lit.span(),
                            format!(
                                "a split of free `{dim}` cannot be shown to cut on whole blocks of {block} `{dtype}` values: fix `{dim}`, or do not split it"
                            ),
                        );
                    }
                }
            }
        }
    }
}
