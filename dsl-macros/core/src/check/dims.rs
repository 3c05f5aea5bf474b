//! Dims: exactly the op's, each once, sizes positive.

use super::{Checker, join};
use crate::ast::*;
use moek_ir::*;
use syn::{Ident, LitInt};

impl Checker {
    /// Dims: exactly the op's, each once, sizes positive. Returns them in canonical order.
    pub(super) fn dims(&mut self, spec: &Spec, op: Op, decls: Option<&[DimDecl]>) -> Vec<Dim> {
        let mut found: Vec<Dim> = Vec::new();
        let mut declared: Vec<(DimName, proc_macro2::Span)> = Vec::new();
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
            if let Some(&(_, first)) = declared.iter().find(|(d, _)| *d == dim) {
                self.errors.push(
                    decl.name.span(),
                    format!("duplicate dim `{name}`: each dim is declared once"),
                );
                self.errors
                    .push(first, format!("note: `{name}` is first declared here"));
                continue;
            }
            declared.push((dim, decl.name.span()));
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
            .filter(|d| !declared.iter().any(|(x, _)| x == *d))
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
    pub(super) fn op_dim(&mut self, op: Op, ident: &Ident) -> Option<DimName> {
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
    pub(super) fn positive(&mut self, lit: &LitInt, what: &str) -> Option<usize> {
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
}
