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

    pub fn push_err(&mut self, err: syn::Error) {
        self.errors.push(err);
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
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
