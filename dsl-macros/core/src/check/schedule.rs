//! The schedule's rules: selection, reduction and column blocks, core splits, token groups,
//! persistent loops and streaming tiles.

use super::{Checker, join};
use crate::ast::*;
use moek_ir::spyre::CORES;
use moek_ir::*;
use proc_macro2::Span;
use std::collections::HashMap;

impl Checker {
    pub(super) fn select(&mut self, spec: &Spec, op: Op, decl: Option<&SelectDecl>) -> Selection {
        let Some(decl) = decl else {
            if op.uses_experts() {
                self.errors.push(
                    spec.name.span(),
                    format!("`{op}` reads an expert bank: say how with `select:` (gather E by R, dense E, grouped E by R)"),
                );
            }
            return Selection::None;
        };
        if !op.uses_experts() {
            self.errors.push(
                decl.mode.span(),
                format!("`{op}` has no expert dim: remove `select:`"),
            );
            return Selection::None;
        }
        let mode = match decl.mode.to_string().as_str() {
            "gather" => Selection::Gather,
            "dense" => Selection::Dense,
            "grouped" => Selection::Grouped,
            m => {
                self.errors.push(
                    decl.mode.span(),
                    format!("unknown selection `{m}`; valid: gather, dense, grouped"),
                );
                return Selection::None;
            }
        };
        if matches!(op, Op::GateUp | Op::Down) && mode != Selection::Gather {
            self.errors.push(
                decl.mode.span(),
                format!("`{op}` runs on gathered routes: only `gather E by R` applies"),
            );
        }
        let want_by = mode != Selection::Dense;
        match &decl.over {
            Some(e) if e == "E" => {}
            Some(e) => self.errors.push(
                e.span(),
                format!("selection is over the expert dim `E`, not `{e}`"),
            ),
            None => self.errors.push(
                decl.mode.span(),
                format!(
                    "write `{} E{}`",
                    decl.mode,
                    if want_by { " by R" } else { "" }
                ),
            ),
        }
        match (&decl.by, want_by) {
            (Some(r), true) if r == "R" => {}
            (Some(r), true) => self
                .errors
                .push(r.span(), format!("routes are the dim `R`, not `{r}`")),
            (None, true) if decl.over.is_some() => self
                .errors
                .push(decl.mode.span(), format!("write `{} E by R`", decl.mode)),
            (Some(r), false) => self
                .errors
                .push(r.span(), "`dense E` reads every expert: remove `by ..`"),
            _ => {}
        }
        mode
    }

    pub(super) fn all_blocks(
        &mut self,
        op: Op,
        sizes: &HashMap<DimName, Option<usize>>,
        decls: &[BlocksDecl],
        kind: BlockKind,
    ) -> Vec<Blocks> {
        let mut out: Vec<Blocks> = Vec::new();
        for decl in decls {
            if let Some(b) = self.blocks(op, sizes, decl, kind) {
                if out.iter().any(|o| o.dim == b.dim) {
                    self.errors.push(
                        decl.dim.span(),
                        format!("duplicate {} blocks on `{}`", kind.name(), b.dim),
                    );
                } else {
                    out.push(b);
                }
            }
        }
        out
    }

    /// Blocks cover a fixed dim of the right kind exactly.
    pub(super) fn blocks(
        &mut self,
        op: Op,
        sizes: &HashMap<DimName, Option<usize>>,
        decl: &BlocksDecl,
        kind: BlockKind,
    ) -> Option<Blocks> {
        let name = decl.dim.to_string();
        let valid: Vec<DimName> = match kind {
            BlockKind::Reduce => op
                .reduction_dims(Phase::All)
                .iter()
                .copied()
                .filter(|d| *d != DimName::R)
                .collect(),
            BlockKind::Columns => vec![op.column_dim()],
        };
        let Some(dim) = DimName::from_name(&name).filter(|d| valid.contains(d)) else {
            self.errors.push(
                decl.dim.span(),
                format!(
                    "`{name}` is not {} dim of `{op}`; valid: {}",
                    kind.what(),
                    join(&valid)
                ),
            );
            return None;
        };
        let mut block_sizes = Vec::new();
        for lit in &decl.sizes {
            block_sizes.push(self.positive(lit, "a block")?);
        }
        if let Some(count) = &decl.count {
            self.positive(count, "a block count")?;
        }
        let Some(Some(size)) = sizes.get(&dim) else {
            self.errors.push(
                decl.dim.span(),
                format!(
                    "{} blocks need a fixed `{name}`; it is free here",
                    kind.name()
                ),
            );
            return None;
        };
        let total: usize = block_sizes.iter().sum();
        if total != *size {
            let span = decl
                .count
                .as_ref()
                .map_or_else(|| decl.dim.span(), |c| c.span());
            let span = decl
                .sizes
                .last()
                .map_or(span, |l| if decl.count.is_some() { span } else { l.span() });
            self.errors.push(
                span,
                format!(
                    "{} blocks of `{name}` sum to {total}, not {size}: they must cover it exactly",
                    kind.name()
                ),
            );
            return None;
        }
        Some(Blocks {
            dim,
            sizes: block_sizes,
        })
    }

    /// Core splits: known dims, at most a fixed size's elements (dividing it exactly on Spyre), at
    /// most 32 cores, one reduction dim split.
    pub(super) fn cores(
        &mut self,
        op: Op,
        select: Selection,
        sizes: &HashMap<DimName, Option<usize>>,
        decls: &[(Phase, Span, CoresDecl)],
        spyre: bool,
    ) -> Vec<CoreSplit> {
        let mut out = Vec::new();
        for (phase, key_span, decl) in decls {
            if decl.dims.len() != decl.parts.len() {
                self.errors.push(
                    *key_span,
                    format!(
                        "{} dims but {} factors: write one factor per dim, as in `T x H = 8 x 4`",
                        decl.dims.len(),
                        decl.parts.len()
                    ),
                );
                continue;
            }
            if select == Selection::Grouped {
                self.errors.push(
                    *key_span,
                    "grouped selection makes one work unit per expert (group sizes depend on the routes): remove `cores`",
                );
                continue;
            }
            let mut splits: Vec<Split> = Vec::new();
            let mut ok = true;
            let can_split = op.splittable_dims(select, *phase);
            for (ident, lit) in decl.dims.iter().zip(&decl.parts) {
                let name = ident.to_string();
                if let Some(dim) = DimName::from_name(&name)
                    .filter(|d| op.dims().contains(d) && !can_split.contains(d))
                {
                    self.errors.push(
                        ident.span(),
                        format!(
                            "`{op}` cannot split `{dim}` across cores{}; splittable: {}",
                            phase_suffix(*phase),
                            join(&can_split)
                        ),
                    );
                    ok = false;
                    continue;
                }
                let Some(dim) = self.op_dim(op, ident) else {
                    ok = false;
                    continue;
                };
                if splits.iter().any(|s| s.dim == dim) {
                    self.errors
                        .push(ident.span(), format!("`{name}` is split twice"));
                    ok = false;
                    continue;
                }
                let Some(parts) = self.positive(lit, "a core split") else {
                    ok = false;
                    continue;
                };
                // CPU and wgpu cut a dim into near-equal parts (`i * n / parts`), as they do a
                // free one; Spyre's slices are equal, so its specs need exact divisors.
                if let Some(&Some(size)) = sizes.get(&dim) {
                    if parts > size {
                        self.errors.push(
                            lit.span(),
                            format!(
                                "split {parts} is more parts than `{name}` {size} has elements"
                            ),
                        );
                        ok = false;
                    } else if spyre && size % parts != 0 {
                        let valid: Vec<String> = (1..=CORES.min(size))
                            .filter(|d| size % d == 0)
                            .map(|d| d.to_string())
                            .collect();
                        self.errors.push(
                            lit.span(),
                            format!(
                                "split {parts} does not divide `{name}` {size}, and spyre cuts equal slices; valid: {} (cpu and wgpu alone take near-equal parts)",
                                valid.join(", ")
                            ),
                        );
                        ok = false;
                    }
                }
                splits.push(Split { dim, parts });
            }
            let product: usize = splits.iter().map(|s| s.parts).product();
            if product > MAX_CORES {
                let desc: Vec<String> = splits.iter().map(|s| s.parts.to_string()).collect();
                self.errors.push_range(
                    decl.parts[0].span(),
                    decl.parts[decl.parts.len() - 1].span(),
                    format!(
                        "core splits use {} = {product} cores; at most {MAX_CORES}",
                        desc.join(" x ")
                    ),
                );
                ok = false;
            }
            let reductions: Vec<&Split> = splits
                .iter()
                .filter(|s| s.parts > 1 && op.reduction_dims(*phase).contains(&s.dim))
                .collect();
            if reductions.len() > 1 {
                let names: Vec<String> =
                    reductions.iter().map(|s| format!("`{}`", s.dim)).collect();
                let keep: Vec<String> = reductions
                    .iter()
                    .map(|s| format!("`{} = {}`", s.dim, s.parts))
                    .collect();
                let (all, one) = if names.len() == 2 {
                    ("both", "either")
                } else {
                    ("all", "one")
                };
                self.errors.push_range(
                    decl.dims[0].span(),
                    decl.parts[decl.parts.len() - 1].span(),
                    format!(
                        "{} are {all} reduction dims of `{op}`{}: a phase completes one reduction across cores, so split at most one; keep {one} of {}",
                        names.join(" and "),
                        phase_suffix(*phase),
                        keep.join(", ")
                    ),
                );
                ok = false;
            }
            if ok {
                out.push(CoreSplit {
                    phase: *phase,
                    splits,
                });
            }
        }
        out
    }

    pub(super) fn groups(
        &mut self,
        g: &SizeDecl,
        sizes: &HashMap<DimName, Option<usize>>,
        has_loop: bool,
    ) -> Option<Split> {
        if g.dim != "T" {
            self.errors.push(
                g.dim.span(),
                format!("groups are token groups: write `T = N`, not `{}`", g.dim),
            );
            return None;
        }
        let parts = self.positive(&g.size, "a group count")?;
        if !has_loop {
            self.errors.push(g.dim.span(), "token groups own x and the accumulator around a persistent loop: add `loop: E persistent;`");
        }
        if let Some(Some(t)) = sizes.get(&DimName::T)
            && t % parts != 0
        {
            let valid: Vec<String> = (1..=MAX_CORES.min(*t))
                .filter(|d| t % d == 0)
                .map(|d| d.to_string())
                .collect();
            self.errors.push(
                g.size.span(),
                format!(
                    "{parts} groups do not divide `T` {t}; valid (at most {MAX_CORES}, one per core): {}",
                    valid.join(", ")
                ),
            );
            return None;
        }
        if parts > MAX_CORES {
            self.errors.push(
                g.size.span(),
                format!("{parts} token groups; at most {MAX_CORES} (one per core)"),
            );
            return None;
        }
        Some(Split {
            dim: DimName::T,
            parts,
        })
    }

    pub(super) fn persistent(&mut self, l: &LoopDecl, select: Selection) -> Option<DimName> {
        if l.kind != "persistent" {
            self.errors.push(
                l.kind.span(),
                format!("unknown loop kind `{}`; valid: persistent", l.kind),
            );
            return None;
        }
        if l.dim != "E" {
            self.errors.push(
                l.dim.span(),
                format!("the persistent loop runs over experts `E`, not `{}`", l.dim),
            );
            return None;
        }
        if select != Selection::Dense {
            self.errors.push(
                l.dim.span(),
                "a persistent loop over `E` visits every expert: it needs `select: dense E;`",
            );
            return None;
        }
        Some(DimName::E)
    }

    pub(super) fn stream(
        &mut self,
        op: Op,
        s: &SizeDecl,
        sizes: &HashMap<DimName, Option<usize>>,
    ) -> Option<Tile> {
        let name = s.dim.to_string();
        let dim = self.op_dim(op, &s.dim)?;
        let size = self.positive(&s.size, "a stream tile")?;
        if let Some(Some(n)) = sizes.get(&dim)
            && size > *n
        {
            self.errors.push(
                s.size.span(),
                format!("stream tile {size} is larger than `{name}` {n}"),
            );
            return None;
        }
        Some(Tile { dim, size })
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum BlockKind {
    Reduce,
    Columns,
}

impl BlockKind {
    pub(super) fn name(self) -> &'static str {
        match self {
            BlockKind::Reduce => "reduction",
            BlockKind::Columns => "column",
        }
    }
    pub(super) fn what(self) -> &'static str {
        match self {
            BlockKind::Reduce => "a reduction",
            BlockKind::Columns => "an output column",
        }
    }
}

fn phase_suffix(phase: Phase) -> String {
    match phase {
        Phase::All => String::new(),
        p => format!(" in its {p} phase"),
    }
}
