//! Keys and their values: each entry parsed by its key; unknown and repeated keys are errors.

use super::{Checker, KEYS, Parsed};
use crate::ast::*;
use crate::parse;
use moek_ir::*;
use proc_macro2::Span;
use syn::Ident;
use syn::parse::Parser;
use syn::spanned::Spanned;

impl Checker {
    /// Parses each entry's value by its key; unknown and repeated keys are errors.
    pub(super) fn entries(&mut self, spec: &Spec, op: Option<Op>) -> Parsed {
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
            // Where a value that ends too soon is reported: its last token.
            let last = crate::errors::end_of(&value).unwrap_or(entry.key.span());
            macro_rules! parse_or_record {
                ($parser:expr) => {
                    match ($parser).parse2(value) {
                        Ok(v) => Some(v),
                        Err(e) => {
                            if entry.value.is_empty() {
                                self.errors.push(span, format!("`{key}:` needs a value"));
                            } else {
                                self.errors.push_err_ending_at(e, last);
                            }
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
    pub(super) fn phase(&mut self, entry: &Entry, op: Option<Op>) -> Phase {
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
    pub(super) fn named<T: PartialEq + Copy>(
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
}
