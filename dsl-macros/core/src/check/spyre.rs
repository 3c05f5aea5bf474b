//! The compile rules of specs that target Spyre (its resource model and lowering: `moek_lower::spyre`).

use crate::ast::*;
use crate::check::{Checker, Parsed};
use moek_ir::spyre::{CORES, STICK_ELEMS};
use moek_ir::*;
use moek_lower::spyre;

impl Checker {
    /// Rules for specs that target Spyre: programs are fixed at macro time, edges fall on sticks,
    /// resident operands fit LX.
    pub(crate) fn spyre_rules(&mut self, spec: &Spec, k: &Kernel, p: &Parsed) {
        if matches!(k.op, Op::DenseMlp | Op::LmHeadRow) {
            let span = p
                .targets
                .iter()
                .find(|t| t.0 == Target::Spyre)
                .map_or(spec.name.span(), |t| t.1);
            self.errors.push(
                span,
                format!("spyre has no lowering of `{}` yet (it lowers gate_up, down and expert_ffn): drop `spyre` from the targets", k.op),
            );
            return;
        }
        for (d, span) in &p.dtypes {
            if *d == DType::F32 {
                self.errors.push(
                    *span,
                    "Spyre computes in DL16: `f32` cannot target spyre (valid there: f16, bf16)",
                );
            }
        }
        let free: Vec<String> = k
            .dims
            .iter()
            .filter(|d| d.size.is_none())
            .map(|d| d.name.to_string())
            .collect();
        for decl in p.dims.iter().flatten().filter(|d| d.size.is_none()) {
            self.errors.push(
                decl.name.span(),
                format!("spyre programs are fixed at macro time, but `{}` is free: fix its size or drop `spyre`", decl.name),
            );
        }
        if k.schedule.select == Selection::Grouped {
            let span = p
                .select
                .as_ref()
                .map_or(spec.name.span(), |s| s.mode.span());
            self.errors.push(span, "grouped selection has data-dependent group sizes, which spyre programs cannot have: use `gather` or `dense`");
        }
        let stick = STICK_ELEMS;
        for (decl, kind) in p
            .reduce
            .iter()
            .map(|d| (d, "reduction"))
            .chain(p.columns.iter().map(|d| (d, "column")))
        {
            let Some(dim) =
                DimName::from_name(&decl.dim.to_string()).filter(|d| spyre::is_stick_dim(*d))
            else {
                continue;
            };
            for lit in decl
                .sizes
                .iter()
                .take(if decl.count.is_some() { 1 } else { usize::MAX })
            {
                if let Ok(n) = lit.base10_parse::<usize>()
                    && n % stick != 0
                {
                    self.errors.push(
                        lit.span(),
                        format!("{kind} block {n} of `{dim}` is not whole {stick}-element sticks ({} sticks); spyre needs multiples of {stick}", n as f64 / stick as f64),
                    );
                }
            }
        }
        for (_, _, decl) in &p.cores {
            for (ident, lit) in decl.dims.iter().zip(&decl.parts) {
                let Some(dim) =
                    DimName::from_name(&ident.to_string()).filter(|d| spyre::is_stick_dim(*d))
                else {
                    continue;
                };
                let (Some(size), Ok(parts)) = (k.size(dim), lit.base10_parse::<usize>()) else {
                    continue;
                };
                if parts == 0 || size % parts != 0 {
                    continue; // reported by the divisibility rule
                }
                if (size / parts) % stick != 0 {
                    let valid: Vec<String> = (1..=CORES)
                        .filter(|d| size % d == 0 && (size / d) % stick == 0)
                        .map(|d| d.to_string())
                        .collect();
                    self.errors.push(
                        lit.span(),
                        format!("`{dim}` split {parts} does not cut {size} into whole {stick}-element sticks; valid: {}", valid.join(", ")),
                    );
                }
            }
        }
        for s in &p.stream {
            if let (Some(dim), Ok(n)) = (
                DimName::from_name(&s.dim.to_string()),
                s.size.base10_parse::<usize>(),
            ) && spyre::is_stick_dim(dim)
                && n % stick != 0
            {
                self.errors.push(
                    s.size.span(),
                    format!("stream tile {n} of `{dim}` is not whole {stick}-element sticks"),
                );
            }
        }
        if free.is_empty() && k.schedule.select != Selection::Grouped {
            for r in spyre::resident(k) {
                if r.bytes > self.lx_budget {
                    self.errors.push(
                        spec.name.span(),
                        format!(
                            "resident operand `{}` needs {} bytes of LX per core; the budget is {} bytes (2 MiB less 20% reserved): split tokens further or use more groups",
                            r.name, r.bytes, self.lx_budget
                        ),
                    );
                }
            }
            if self.errors.is_empty() {
                for &dtype in &k.dtypes {
                    if let Err(why) = spyre::lower::program_within(k, dtype, self.lx_budget) {
                        // A tile that does not fit is the reduction dim's doing: point there.
                        let span = match &why {
                            spyre::lower::LowerError::Streamed { reduction, .. } => p
                                .dims
                                .iter()
                                .flatten()
                                .find(|d| d.name == reduction.name())
                                .map_or(spec.name.span(), |d| d.name.span()),
                            _ => spec.name.span(),
                        };
                        self.errors
                            .push(span, format!("no spyre program for {dtype}: {why}"));
                        break;
                    }
                }
            }
            let total: usize = spyre::resident(k).iter().map(|r| r.bytes).sum();
            let lx = self.lx_budget;
            if total > lx && spyre::resident(k).iter().all(|r| r.bytes <= lx) {
                self.errors.push(
                    spec.name.span(),
                    format!("resident operands need {total} bytes of LX per core together; the budget is {lx} bytes"),
                );
            }
        }
    }
}
