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
                    let decls = parse_or_record!(parse::activations).unwrap_or_default();
                    if let Some(second) = decls.get(1) {
                        self.errors
                            .push(second.name.span(), "a spec has one activation");
                    }
                    p.activation = decls.first().and_then(|d| self.activation(d));
                }
                "bias" => {
                    let names = parse_or_record!(parse::names);
                    p.bias = self.named(
                        names,
                        |n| Phase::from_name(n).filter(|p| *p != Phase::All),
                        "bias",
                        || "gate_up, down".into(),
                    );
                }
                "output_gate" => {
                    let names = parse_or_record!(parse::names).unwrap_or_default();
                    match names.as_slice() {
                        [one] if one == "sigmoid" => p.output_gate = Some(one.span()),
                        [one] => self.errors.push(
                            one.span(),
                            format!("unknown output gate `{one}`; valid: sigmoid"),
                        ),
                        [_, second, ..] => self
                            .errors
                            .push(second.span(), "a dense MLP has one output gate: `sigmoid`"),
                        [] => {}
                    }
                }
                "quant_block" => {
                    p.quant_block = parse_or_record!(<syn::LitInt as syn::parse::Parse>::parse)
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
    /// An activation's name and parameters: each parameter the name takes given once, as a
    /// finite, positive number, and nothing else.
    fn activation(&mut self, d: &ActivationDecl) -> Option<(Activation, Span)> {
        let name = d.name.to_string();
        let Some(wanted) = Activation::parameters(&name) else {
            self.errors.push(
                d.name.span(),
                format!(
                    "unknown activation `{name}`; valid: {}",
                    Activation::valid_names()
                ),
            );
            return None;
        };
        let given = d.params.as_deref().unwrap_or_default();
        if wanted.is_empty() {
            if let Some((key, _)) = given.first() {
                self.errors
                    .push(key.span(), format!("`{name}` takes no parameters"));
            } else if d.params.is_some() {
                self.errors.push(
                    d.name.span(),
                    format!("`{name}` takes no parameters; write `{name}`"),
                );
            }
            return Activation::from_parts(&name, &[]).map(|a| (a, d.name.span()));
        }
        let spelled = wanted
            .iter()
            .map(|w| format!("{w} = .."))
            .collect::<Vec<_>>()
            .join(", ");
        let mut values = vec![None; wanted.len()];
        let mut ok = true;
        for (key, lit) in given {
            let Some(i) = wanted.iter().position(|w| key == w) else {
                self.errors.push(
                    key.span(),
                    format!(
                        "`{name}` has no parameter `{key}`; it takes {}",
                        wanted.join(", ")
                    ),
                );
                ok = false;
                continue;
            };
            if values[i].is_some() {
                self.errors
                    .push(key.span(), format!("duplicate parameter `{key}`"));
                ok = false;
                continue;
            }
            let value = match lit {
                syn::Lit::Float(f) => f.base10_parse::<f32>().ok(),
                syn::Lit::Int(n) => n.base10_parse::<f32>().ok(),
                _ => None,
            };
            match value {
                Some(v) if v.is_finite() && v > 0.0 => values[i] = Some(v),
                _ => {
                    self.errors.push(
                        lit.span(),
                        format!("`{key}` must be a finite, positive number, such as 7.0"),
                    );
                    ok = false;
                }
            }
        }
        let missing: Vec<&str> = wanted
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(w, _)| *w)
            .collect();
        if ok && !missing.is_empty() {
            self.errors.push(
                d.name.span(),
                format!(
                    "`{name}` needs {}: write `{name}({spelled})`",
                    missing
                        .iter()
                        .map(|m| format!("`{m}`"))
                        .collect::<Vec<_>>()
                        .join(" and ")
                ),
            );
        }
        let values: Option<Vec<f32>> = values.into_iter().collect();
        Activation::from_parts(&name, &values?).map(|a| (a, d.name.span()))
    }

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
