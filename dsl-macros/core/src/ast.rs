//! What the parser reads: a spec's header and its `key: value;` entries, tokens kept so every later
//! stage can point at the user's literal.

use proc_macro2::TokenStream;
use syn::{Attribute, Ident, Lit, LitInt, Visibility};

/// `/// doc  pub NAME = OP { entries }`
#[derive(Debug)]
pub struct Spec {
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub name: Ident,
    pub op: Ident,
    pub entries: Vec<Entry>,
}

/// `key: tokens;` or `key(phase): tokens;`; the value is parsed by the check stage, per key.
#[derive(Debug)]
pub struct Entry {
    pub key: Ident,
    pub phase: Option<Ident>,
    pub value: TokenStream,
}

/// `T = 512` (fixed), `T` (free), `T = 2..` or `T = 2..=4096` (free within bounds).
#[derive(Debug)]
pub struct DimDecl {
    pub name: Ident,
    pub size: Option<LitInt>,
    /// Present for a range: `(min, max)`.
    pub range: Option<(LitInt, Option<LitInt>)>,
}

/// `gather E by R`, `dense E`, `grouped E by R`.
#[derive(Debug)]
pub struct SelectDecl {
    pub mode: Ident,
    pub over: Option<Ident>,
    pub by: Option<Ident>,
}

/// `H = 704 x 4` or `H = [1024, 1024, 768]`.
#[derive(Debug)]
pub struct BlocksDecl {
    pub dim: Ident,
    pub sizes: Vec<LitInt>,
    /// For `size x count`: the count literal (sizes then holds `count` copies of size).
    pub count: Option<LitInt>,
}

/// `T x H = 8 x 4`.
#[derive(Debug)]
pub struct CoresDecl {
    pub dims: Vec<Ident>,
    pub parts: Vec<LitInt>,
}

/// `T = 32` (groups), `F = 64` (stream tiles).
#[derive(Debug)]
pub struct SizeDecl {
    pub dim: Ident,
    pub size: LitInt,
}

/// `E persistent`.
#[derive(Debug)]
pub struct LoopDecl {
    pub dim: Ident,
    pub kind: Ident,
}

/// `silu`, or `swiglu_clamped(limit = 7.0, alpha = 1.702)`: a name and its parameters.
#[derive(Debug)]
pub struct ActivationDecl {
    pub name: Ident,
    /// `key = literal` pairs, in the order written; `None` without parentheses.
    pub params: Option<Vec<(Ident, Lit)>>,
}
