//! The `kernel!` macro: a thin shell over `moek_dsl::expand` (parse, check, emit live there, so
//! they are unit-tested and usable at run time). Use it through `moek_kernels::kernel!`.

use proc_macro::TokenStream;

/// Declares one or more kernel specs; see docs/dsl.md for every key.
#[proc_macro]
pub fn kernel(input: TokenStream) -> TokenStream {
    moek_dsl::expand(input.into()).into()
}
