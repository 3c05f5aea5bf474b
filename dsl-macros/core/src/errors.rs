//! The error collector of the check stage: every mistake is recorded with its span and the stage
//! goes on, so the user sees them all at once.

use proc_macro2::Span;
use std::fmt::Display;

#[derive(Debug, Default)]
pub struct Errors {
    errors: Vec<syn::Error>,
}

impl Errors {
    pub fn push(&mut self, span: Span, msg: impl Display) {
        self.errors.push(syn::Error::new(span, msg));
    }

    /// Records an error whose caret runs from `start` to `end` (syn renders the range on stable,
    /// where spans cannot be joined).
    pub fn push_range(&mut self, start: Span, end: Span, msg: impl Display) {
        let ends: proc_macro2::TokenStream = [start, end]
            .into_iter()
            .map(|s| proc_macro2::TokenTree::Ident(proc_macro2::Ident::new("range", s)))
            .collect();
        self.errors.push(syn::Error::new_spanned(ends, msg));
    }

    pub fn push_err(&mut self, err: syn::Error) {
        self.errors.push(err);
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// Records `err`, its errors at the end of their input (syn puts those at the call site,
    /// which is the whole macro call) moved to `end`, the last token they were parsing.
    pub fn push_err_ending_at(&mut self, err: syn::Error, end: Span) {
        self.errors.push(ending_at(err, end));
    }

    /// All errors combined into one (each keeps its own span), or `Ok` when there were none.
    pub fn finish(self) -> syn::Result<()> {
        let mut it = self.errors.into_iter();
        match it.next() {
            None => Ok(()),
            Some(mut first) => {
                first.extend(it);
                Err(first)
            }
        }
    }
}

/// Whether `span` is the call site: where syn reports "unexpected end of input" at the top level
/// of a token stream. (Spans have no equality; their debug text names their byte range.)
fn is_call_site(span: Span) -> bool {
    format!("{span:?}") == format!("{:?}", Span::call_site())
}

/// The span of the last token of `ts` (a group's closing delimiter), if it has one.
pub fn end_of(ts: &proc_macro2::TokenStream) -> Option<Span> {
    ts.clone().into_iter().last().map(|t| match t {
        proc_macro2::TokenTree::Group(g) => g.span_close(),
        t => t.span(),
    })
}

/// `err` with each of its errors at the call site moved to `end`.
pub fn ending_at(err: syn::Error, end: Span) -> syn::Error {
    let mut out: Option<syn::Error> = None;
    for e in err {
        let e = if is_call_site(e.span()) {
            syn::Error::new(end, e.to_string())
        } else {
            e
        };
        match &mut out {
            None => out = Some(e),
            Some(o) => o.combine(e),
        }
    }
    out.expect("a syn::Error holds at least one error")
}
