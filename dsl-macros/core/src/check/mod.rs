//! [`ast`] -> [`ir`]: every rule of the DSL, each error spanned on the offending token and
//! carrying the numbers (and the valid choices where there are few). The stage never returns early
//! on a bad entry: it records the error and goes on.
//!
//! One module per rule group: [`entries`] (keys and their values), [`dims`], [`schedule`]
//! (selection, blocks, core splits, groups, loops, tiles), [`quant`] (quantized weights), and
//! one per target ([`spyre`], [`wgpu`]) over that target's lowering in `moek_lower`.

mod dims;
mod entries;
mod quant;
mod schedule;
mod spyre;
mod wgpu;

use schedule::BlockKind;

use crate::ast::*;
use crate::errors::Errors;
use moek_ir::tensors::Optional;
use moek_ir::*;
use proc_macro2::Span;
use std::collections::HashMap;

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
    "bias",
    "output_gate",
    "quant_block",
];

/// Validates one spec. All errors are collected; the IR is returned only when there are none.
pub fn check(spec: &Spec) -> syn::Result<Kernel> {
    check_within(spec, moek_ir::spyre::LX_BUDGET)
}

/// [`check`] with Spyre plans held to `lx` bytes of LX per core instead of the device's budget:
/// only for forcing a plan the device cannot hold through to the KTIR interpreter
/// (`moek emit --lx-budget`), to show that its cap refuses the plan too.
pub fn check_within(spec: &Spec, lx: usize) -> syn::Result<Kernel> {
    let mut cx = Checker {
        errors: Errors::default(),
        seen: Default::default(),
        lx_budget: lx,
    };
    let kernel = cx.kernel(spec);
    cx.errors.finish()?;
    Ok(kernel.expect("a kernel is built whenever no error was recorded"))
}

#[derive(Debug)]
pub(crate) struct Checker {
    pub(crate) errors: Errors,
    /// First occurrence of each key (with its phase), for duplicate-key errors.
    seen: std::collections::HashSet<String>,
    /// LX bytes per core a Spyre plan must fit (the device's budget, unless forced).
    pub(crate) lx_budget: usize,
}

/// Entry values parsed per key, with their tokens for later rules.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    pub(crate) dims: Option<Vec<DimDecl>>,
    pub(crate) dtypes: Vec<(DType, Span)>,
    pub(crate) targets: Vec<(Target, Span)>,
    pub(crate) select: Option<SelectDecl>,
    pub(crate) reduce: Vec<BlocksDecl>,
    pub(crate) columns: Vec<BlocksDecl>,
    pub(crate) cores: Vec<(Phase, Span, CoresDecl)>,
    pub(crate) groups: Option<SizeDecl>,
    pub(crate) persistent: Option<LoopDecl>,
    pub(crate) stream: Vec<SizeDecl>,
    pub(crate) requires: Vec<Capability>,
    pub(crate) activation: Option<(Activation, Span)>,
    /// `bias: gate_up, down`: each named phase's bias, and the span naming it.
    pub(crate) bias: Vec<(Phase, Span)>,
    /// `output_gate: sigmoid`, and the span of its value.
    pub(crate) output_gate: Option<Span>,
    /// `quant_block: N`: the block size of quantized weights, as written.
    pub(crate) quant_block: Option<syn::LitInt>,
    pub(crate) has_dtypes: bool,
    pub(crate) has_targets: bool,
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
            ("dtypes", p.has_dtypes, DType::valid_names()),
            ("targets", p.has_targets, Target::valid_names()),
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
        let spyre = p.targets.iter().any(|t| t.0 == Target::Spyre);
        let cores = self.cores(op, select, &sizes, &p.cores, spyre);
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
            optional: p
                .bias
                .iter()
                .map(|&(phase, _)| Optional::bias(phase.name()).expect("a bias names a phase"))
                .chain(p.output_gate.map(|_| Optional::OutputGate))
                .collect(),
            quant_block: self.quant_block(&p),
        };
        self.bias_rules(&kernel, &p);
        self.quant_rules(&kernel, &p);
        if let Some(span) = p.output_gate
            && op != Op::DenseMlp
        {
            self.errors.push(
                span,
                format!("`output_gate` scales a dense MLP's output (shared experts), not `{op}`'s"),
            );
        }
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
        if kernel.targets.contains(&Target::Wgpu) {
            self.wgpu_rules(spec, &kernel, &p);
        }
        self.errors.is_empty().then_some(kernel)
    }
}

impl Checker {
    /// Biases are lowered for a gathered expert FFN (CPU and wgpu) and a grouped one (the CPU,
    /// the one target of grouped selection).
    fn bias_rules(&mut self, k: &Kernel, p: &Parsed) {
        let Some(&(_, span)) = p.bias.first() else {
            return;
        };
        if k.op != Op::ExpertFfn {
            self.errors.push(
                span,
                format!(
                    "`bias` applies to `expert_ffn` (its gate/up and down products), not `{}`",
                    k.op
                ),
            );
        } else if !matches!(k.schedule.select, Selection::Gather | Selection::Grouped) {
            self.errors.push(
                span,
                format!(
                    "expert biases are emitted for `select: gather` and `grouped`; `{}` selection has no biased variant yet",
                    k.schedule.select
                ),
            );
        }
        if let Some(&(_, at)) = p.targets.iter().find(|t| t.0 == Target::Spyre) {
            self.errors.push(
                at,
                "the Spyre lowering has no bias operands yet (each route's bias row would be one more DMA per phase): drop `spyre`, or the biases",
            );
        }
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
