//! [`ast`] -> [`ir`]: every rule of the DSL, each error spanned on the offending token and
//! carrying the numbers (and the valid choices where there are few). The stage never returns early
//! on a bad entry: it records the error and goes on.

use crate::ast::*;
use crate::errors::Errors;
use crate::parse;
use crate::spyre;
use moek_ir::spyre::{CORES, LX_BUDGET, STICK_ELEMS};
use moek_ir::*;
use proc_macro2::Span;
use std::collections::HashMap;
use syn::parse::Parser;
use syn::spanned::Spanned;
use syn::{Ident, LitInt};

/// Every key a spec may use, in the order docs/dsl.md documents them.
pub const KEYS: &[&str] = &[
    "dims",
    "dtypes",
    "targets",
    "select",
    "reduce",
    "columns",
    "cores",
    "groups",
    "loop",
    "stream",
    "requires",
    "activation",
];

/// Validates one spec. All errors are collected; the IR is returned only when there are none.
pub fn check(spec: &Spec) -> syn::Result<Kernel> {
    let mut cx = Checker {
        errors: Errors::default(),
        seen: Default::default(),
    };
    let kernel = cx.kernel(spec);
    cx.errors.finish()?;
    Ok(kernel.expect("a kernel is built whenever no error was recorded"))
}

#[derive(Debug)]
struct Checker {
    errors: Errors,
    /// First occurrence of each key (with its phase), for duplicate-key errors.
    seen: std::collections::HashSet<String>,
}

/// Entry values parsed per key, with their tokens for later rules.
#[derive(Debug, Default)]
struct Parsed {
    dims: Option<Vec<DimDecl>>,
    dtypes: Vec<(DType, Span)>,
    targets: Vec<(Target, Span)>,
    select: Option<SelectDecl>,
    reduce: Vec<BlocksDecl>,
    columns: Vec<BlocksDecl>,
    cores: Vec<(Phase, Span, CoresDecl)>,
    groups: Option<SizeDecl>,
    persistent: Option<LoopDecl>,
    stream: Vec<SizeDecl>,
    requires: Vec<Capability>,
    activation: Option<(Activation, Span)>,
    has_dtypes: bool,
    has_targets: bool,
}

impl Checker {
    fn kernel(&mut self, spec: &Spec) -> Option<Kernel> {
        let op = Op::from_name(&spec.op.to_string());
        if op.is_none() {
            self.errors.push(
                spec.op.span(),
                format!("unknown op `{}`; valid ops: {}", spec.op, Op::valid_names()),
            );
        }
        let p = self.entries(spec, op);
        let op = op?;
        let dims = self.dims(spec, op, p.dims.as_deref());
        let sizes: HashMap<DimName, Option<usize>> =
            dims.iter().map(|d| (d.name, d.size)).collect();
        for (name, present, msg) in [
            ("dtypes", p.has_dtypes, "f16, bf16, f32"),
            ("targets", p.has_targets, "cpu, wgpu, spyre"),
        ] {
            if !present {
                self.errors.push(
                    spec.name.span(),
                    format!("spec `{}` has no `{name}:` (choose from {msg})", spec.name),
                );
            }
        }
        let targets: Vec<Target> = p.targets.iter().map(|t| t.0).collect();
        let select = self.select(spec, op, p.select.as_ref());
        let reduce = self.all_blocks(op, &sizes, &p.reduce, BlockKind::Reduce);
        let columns = self.all_blocks(op, &sizes, &p.columns, BlockKind::Columns);
        let cores = self.cores(op, select, &sizes, &p.cores);
        let groups = p
            .groups
            .as_ref()
            .and_then(|g| self.groups(g, &sizes, p.persistent.is_some()));
        let persistent = p
            .persistent
            .as_ref()
            .and_then(|l| self.persistent(l, select));
        let stream = p
            .stream
            .iter()
            .filter_map(|s| self.stream(op, s, &sizes))
            .collect();
        let kernel = Kernel {
            name: spec.name.to_string(),
            doc: doc_string(&spec.attrs),
            op,
            dims,
            dtypes: p.dtypes.iter().map(|d| d.0).collect(),
            targets,
            schedule: Schedule {
                select,
                reduce,
                columns,
                cores,
                groups,
                persistent,
                stream,
            },
            requires: p.requires.clone(),
            activation: p.activation.map(|a| a.0).unwrap_or_default(),
        };
        if let Some((_, span)) = p.activation
            && !op.has_activation()
        {
            self.errors.push(
                span,
                format!("`{op}` has no gated pair: `activation` applies to gate_up, expert_ffn and dense_mlp"),
            );
        }
        if kernel.targets.contains(&Target::Spyre) {
            self.spyre_rules(spec, &kernel, &p);
        }
        if kernel.targets.contains(&Target::Wgpu) && kernel.schedule.select == Selection::Grouped {
            let span = p
                .select
                .as_ref()
                .map_or(spec.name.span(), |s| s.mode.span());
            self.errors.push(span, "grouped selection has data-dependent group sizes, which the wgpu emitter does not generate: use `gather` or `dense`, or drop `wgpu`");
        }
        self.errors.is_empty().then_some(kernel)
    }

    /// Parses each entry's value by its key; unknown and repeated keys are errors.
    fn entries(&mut self, spec: &Spec, op: Option<Op>) -> Parsed {
        let mut p = Parsed::default();
        for entry in &spec.entries {
            let key = entry.key.to_string();
            if !KEYS.contains(&key.as_str()) {
                self.errors.push(
                    entry.key.span(),
                    format!("unknown key `{key}`; valid keys: {}", KEYS.join(", ")),
                );
                continue;
            }
            let phase = self.phase(entry, op);
            let seen_key = format!("{key}/{phase:?}");
            if self.seen.contains(&seen_key) {
                self.errors.push(
                    entry.key.span(),
                    format!("duplicate key `{key}`: each key may appear once per spec"),
                );
                continue;
            }
            self.seen.insert(seen_key);
            if entry.phase.is_some() && key != "cores" {
                self.errors.push(
                    entry.key.span(),
                    format!("only `cores` takes a phase, not `{key}`"),
                );
            }
            let value = entry.value.clone();
            let span = if value.is_empty() {
                entry.key.span()
            } else {
                value.span()
            };
            macro_rules! parse_or_record {
                ($parser:expr) => {
                    match ($parser).parse2(value) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            self.errors.push_err(if entry.value.is_empty() {
                                syn::Error::new(span, format!("`{key}:` needs a value"))
                            } else {
                                e
                            });
                            None
                        }
                    }
                };
            }
            match key.as_str() {
                "dims" => p.dims = parse_or_record!(parse::dims),
                "dtypes" => {
                    p.has_dtypes = true;
                    let names = parse_or_record!(parse::names);
                    p.dtypes = self.named(names, DType::from_name, "dtype", DType::valid_names);
                }
                "targets" => {
                    p.has_targets = true;
                    let names = parse_or_record!(parse::names);
                    p.targets = self.named(names, Target::from_name, "target", Target::valid_names);
                }
                "requires" => {
                    let names = parse_or_record!(parse::names);
                    p.requires = self
                        .named(
                            names,
                            Capability::from_name,
                            "capability",
                            Capability::valid_names,
                        )
                        .into_iter()
                        .map(|c| c.0)
                        .collect()
                }
                "select" => p.select = parse_or_record!(<SelectDecl as syn::parse::Parse>::parse),
                "reduce" => p.reduce = parse_or_record!(parse::blocks).unwrap_or_default(),
                "columns" => p.columns = parse_or_record!(parse::blocks).unwrap_or_default(),
                "cores" => {
                    if let Some(c) = parse_or_record!(<CoresDecl as syn::parse::Parse>::parse) {
                        p.cores.push((phase, entry.key.span(), c));
                    }
                }
                "groups" => p.groups = parse_or_record!(<SizeDecl as syn::parse::Parse>::parse),
                "loop" => p.persistent = parse_or_record!(<LoopDecl as syn::parse::Parse>::parse),
                "stream" => p.stream = parse_or_record!(parse::sizes).unwrap_or_default(),
                "activation" => {
                    let names = parse_or_record!(parse::names);
                    let acts = self.named(
                        names,
                        Activation::from_name,
                        "activation",
                        Activation::valid_names,
                    );
                    if acts.len() > 1 {
                        self.errors.push(acts[1].1, "a spec has one activation");
                    }
                    p.activation = acts.first().copied();
                }
                _ => unreachable!("every key in KEYS is handled"),
            }
        }
        p
    }

    /// The phase of a `cores(phase):` entry; only multi-phase ops take one.
    fn phase(&mut self, entry: &Entry, op: Option<Op>) -> Phase {
        let Some(ident) = &entry.phase else {
            return Phase::All;
        };
        match Phase::from_name(&ident.to_string()) {
            Some(p @ (Phase::GateUp | Phase::Down)) if op.is_none_or(Op::has_phases) => p,
            Some(Phase::GateUp | Phase::Down) => {
                let op = op.expect("checked by is_none_or");
                self.errors.push(
                    ident.span(),
                    format!("`{op}` has one phase; write `cores:` without `({ident})`"),
                );
                Phase::All
            }
            _ => {
                self.errors.push(
                    ident.span(),
                    format!("unknown phase `{ident}`; valid phases: gate_up, down"),
                );
                Phase::All
            }
        }
    }

    /// Maps names to values, recording unknown and repeated names.
    fn named<T: PartialEq + Copy>(
        &mut self,
        idents: Option<Vec<Ident>>,
        from_name: fn(&str) -> Option<T>,
        what: &str,
        valid: fn() -> String,
    ) -> Vec<(T, Span)> {
        let mut out: Vec<(T, Span)> = Vec::new();
        for ident in idents.unwrap_or_default() {
            match from_name(&ident.to_string()) {
                None => self.errors.push(
                    ident.span(),
                    format!("unknown {what} `{ident}`; valid: {}", valid()),
                ),
                Some(v) if out.iter().any(|o| o.0 == v) => self
                    .errors
                    .push(ident.span(), format!("duplicate {what} `{ident}`")),
                Some(v) => out.push((v, ident.span())),
            }
        }
        out
    }

    /// Dims: exactly the op's, each once, sizes positive. Returns them in canonical order.
    fn dims(&mut self, spec: &Spec, op: Op, decls: Option<&[DimDecl]>) -> Vec<Dim> {
        let mut found: Vec<Dim> = Vec::new();
        let mut declared: Vec<DimName> = Vec::new();
        let valid = op
            .dims()
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(", ");
        for decl in decls.unwrap_or_default() {
            let name = decl.name.to_string();
            let Some(dim) = self.op_dim(op, &decl.name) else {
                continue;
            };
            if declared.contains(&dim) {
                self.errors
                    .push(decl.name.span(), format!("duplicate dim `{name}`"));
                continue;
            }
            declared.push(dim);
            let what = format!("dim `{name}`");
            let size = decl.size.as_ref().and_then(|lit| self.positive(lit, &what));
            if decl.size.is_some() && size.is_none() {
                continue;
            }
            let (mut min, mut max) = (1, None);
            if let Some((lo, hi)) = &decl.range {
                let Some(lo_n) = self.positive(lo, &what) else {
                    continue;
                };
                min = lo_n;
                if let Some(hi) = hi {
                    let Some(hi_n) = self.positive(hi, &what) else {
                        continue;
                    };
                    if hi_n < lo_n {
                        self.errors
                            .push(hi.span(), format!("{what} range {lo_n}..={hi_n} is empty"));
                        continue;
                    }
                    max = Some(hi_n);
                }
            }
            found.push(Dim {
                name: dim,
                size,
                min,
                max,
            });
        }
        let missing: Vec<&str> = op
            .dims()
            .iter()
            .filter(|d| !declared.contains(d))
            .map(|d| d.name())
            .collect();
        if !missing.is_empty() && decls.is_some() {
            self.errors.push(
                spec.name.span(),
                format!(
                    "`{op}` needs dims {valid}; missing: {} (write `D` alone for a free dim)",
                    missing.join(", ")
                ),
            );
        } else if decls.is_none() {
            self.errors.push(
                spec.name.span(),
                format!("spec `{}` has no `dims:` (`{op}` needs {valid})", spec.name),
            );
        }
        op.dims()
            .iter()
            .filter_map(|d| found.iter().find(|f| f.name == *d).cloned())
            .collect()
    }

    /// The op's dim named by `ident`, or an error listing the op's dims.
    fn op_dim(&mut self, op: Op, ident: &Ident) -> Option<DimName> {
        let dim = DimName::from_name(&ident.to_string()).filter(|d| op.dims().contains(d));
        if dim.is_none() {
            self.errors.push(
                ident.span(),
                format!("`{op}` has no dim `{ident}`; its dims: {}", join(op.dims())),
            );
        }
        dim
    }

    /// A literal that must be a positive integer.
    fn positive(&mut self, lit: &LitInt, what: &str) -> Option<usize> {
        match lit.base10_parse::<usize>() {
            Ok(0) => {
                self.errors
                    .push(lit.span(), format!("{what} must be positive, not 0"));
                None
            }
            Ok(n) => Some(n),
            Err(e) => {
                self.errors.push(lit.span(), format!("{what}: {e}"));
                None
            }
        }
    }

    fn select(&mut self, spec: &Spec, op: Op, decl: Option<&SelectDecl>) -> Selection {
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

    fn all_blocks(
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
    fn blocks(
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

    /// Core splits: known dims, dividing fixed sizes, at most 32 cores, one reduction dim split.
    fn cores(
        &mut self,
        op: Op,
        select: Selection,
        sizes: &HashMap<DimName, Option<usize>>,
        decls: &[(Phase, Span, CoresDecl)],
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
            let can_split = splittable(op, select, *phase);
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
                if let Some(Some(size)) = sizes.get(&dim)
                    && size % parts != 0
                {
                    let valid: Vec<String> = (1..=CORES.min(*size))
                        .filter(|d| size % d == 0)
                        .map(|d| d.to_string())
                        .collect();
                    self.errors.push(
                        lit.span(),
                        format!(
                            "split {parts} does not divide `{name}` {size}; valid: {}",
                            valid.join(", ")
                        ),
                    );
                    ok = false;
                }
                splits.push(Split { dim, parts });
            }
            let product: usize = splits.iter().map(|s| s.parts).product();
            if product > MAX_CORES {
                let desc: Vec<String> = splits.iter().map(|s| s.parts.to_string()).collect();
                self.errors.push(
                    decl.parts[0].span(),
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
                let names: Vec<String> = reductions.iter().map(|s| s.dim.to_string()).collect();
                self.errors.push(
                    *key_span,
                    format!(
                        "{} are all reduction dims of `{op}`; at most one reduction dim may be split across cores",
                        names.join(" and ")
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

    fn groups(
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
            self.errors.push(
                g.size.span(),
                format!("{parts} groups do not divide `T` {t}"),
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

    fn persistent(&mut self, l: &LoopDecl, select: Selection) -> Option<DimName> {
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

    fn stream(
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

    /// Rules for specs that target Spyre: programs are fixed at macro time, edges fall on sticks,
    /// resident operands fit LX.
    fn spyre_rules(&mut self, spec: &Spec, k: &Kernel, p: &Parsed) {
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
                if r.bytes > LX_BUDGET {
                    self.errors.push(
                        spec.name.span(),
                        format!(
                            "resident operand `{}` needs {} bytes of LX per core; the budget is {} bytes (2 MiB less 20% reserved): split tokens further or use more groups",
                            r.name, r.bytes, LX_BUDGET
                        ),
                    );
                }
            }
            if self.errors.is_empty() {
                for &dtype in &k.dtypes {
                    if let Err(why) = spyre::lower::program(k, dtype) {
                        self.errors.push(
                            spec.name.span(),
                            format!("no spyre program for {dtype}: {why}"),
                        );
                        break;
                    }
                }
            }
            let total: usize = spyre::resident(k).iter().map(|r| r.bytes).sum();
            if total > LX_BUDGET && spyre::resident(k).iter().all(|r| r.bytes <= LX_BUDGET) {
                self.errors.push(
                    spec.name.span(),
                    format!("resident operands need {total} bytes of LX per core together; the budget is {} bytes", LX_BUDGET),
                );
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum BlockKind {
    Reduce,
    Columns,
}

impl BlockKind {
    fn name(self) -> &'static str {
        match self {
            BlockKind::Reduce => "reduction",
            BlockKind::Columns => "column",
        }
    }
    fn what(self) -> &'static str {
        match self {
            BlockKind::Reduce => "a reduction",
            BlockKind::Columns => "an output column",
        }
    }
}

/// Dims a phase's work units may be cut along (what the emitters map onto cores).
fn splittable(op: Op, select: Selection, phase: Phase) -> Vec<DimName> {
    use DimName::*;
    let of = |p: Phase| -> &'static [DimName] {
        match (op, p) {
            (Op::ExpertFfn, Phase::GateUp) if select == Selection::Dense => &[T, F, H],
            (Op::ExpertFfn, Phase::Down) if select == Selection::Dense => &[T, H, F],
            (Op::GateUp, _) => &[T, R, F, H],
            (Op::Down, _) => &[T, R, H, F],
            (Op::ExpertFfn, Phase::GateUp) => &[T, R, F, H],
            (Op::ExpertFfn, Phase::Down) => &[T, R, H, F],
            (Op::DenseMlp, Phase::GateUp) => &[T, F, H],
            (Op::DenseMlp, Phase::Down) => &[T, H, F],
            (Op::LmHeadRow, _) => &[V],
            (Op::ExpertFfn | Op::DenseMlp, Phase::All) => unreachable!("resolved below"),
        }
    };
    match (op.has_phases(), phase) {
        (true, Phase::All) => of(Phase::GateUp)
            .iter()
            .copied()
            .filter(|d| of(Phase::Down).contains(d))
            .collect(),
        _ => of(phase).to_vec(),
    }
}

fn phase_suffix(phase: Phase) -> String {
    match phase {
        Phase::All => String::new(),
        p => format!(" in its {p} phase"),
    }
}

fn join<T: std::fmt::Display>(v: &[T]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The spec's `///` lines, joined.
fn doc_string(attrs: &[syn::Attribute]) -> String {
    attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value().trim().to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}
