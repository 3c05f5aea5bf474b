//! The moek kernel DSL, as an ordinary crate: the proc macro (`moek-dsl-macros`) is a thin shell
//! over [`expand`], and run-time tools (`moek list`, `moek emit`) use the same IR and emitters.
//!
//! Stages: [`parse`] (tokens -> [`ast`]), [`check`] (ast -> [`ir`], every error collected and
//! spanned), [`emit`] (ir -> CPU Rust, the module each spec expands to, and the block's
//! `entries()`).
//! [`reference`] holds the f64 semantics of every op; [`tolerance`] the one table of limits.

pub mod ast;
pub mod check;
pub mod emit;
pub mod errors;
pub mod parse;

use proc_macro2::TokenStream;

/// What `kernel! { ... }` expands to. Never fails: errors become `compile_error!` beside stubs of
/// the user's items, so one mistake does not cascade into unresolved names.
pub fn expand(input: TokenStream) -> TokenStream {
    let specs = match parse::parse_specs(input) {
        Ok(specs) => specs,
        Err(err) => return err.to_compile_error(),
    };
    let mut out: TokenStream = specs
        .iter()
        .map(|spec| match check::check(spec) {
            Ok(kernel) => emit::module(spec, &kernel),
            Err(err) => {
                let mut out = err.to_compile_error();
                out.extend(emit::stub(spec));
                out
            }
        })
        .collect();
    out.extend(emit::entries(&specs));
    out
}
