//! Tokens -> [`ast`]. The header grammar is strict (a malformed header stops here); entry values
//! are only split off at `;` and parsed per key by the check stage, so one bad value does not hide
//! the others.

use crate::ast::*;
use proc_macro2::{TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::{Attribute, Ident, Lit, LitInt, Token, Visibility, braced, bracketed, parenthesized};

/// Parses one or more specs.
pub fn parse_specs(input: TokenStream) -> syn::Result<Vec<Spec>> {
    let parser = |input: ParseStream| {
        let mut specs = Vec::new();
        while !input.is_empty() {
            specs.push(input.parse()?);
        }
        Ok(specs)
    };
    // A spec cut short is reported at its last token, not at the whole macro call.
    let end = crate::errors::end_of(&input);
    parser.parse2(input).map_err(|e| match end {
        Some(end) => crate::errors::ending_at(e, end),
        None => e,
    })
}

impl Parse for Spec {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let name: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let op: Ident = input.call(Ident::parse_any)?;
        let body;
        braced!(body in input);
        let mut entries = Vec::new();
        while !body.is_empty() {
            entries.push(body.parse()?);
        }
        Ok(Spec {
            attrs,
            vis,
            name,
            op,
            entries,
        })
    }
}

impl Parse for Entry {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let key = input.call(Ident::parse_any)?;
        let phase = if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            Some(inner.call(Ident::parse_any)?)
        } else {
            None
        };
        input.parse::<Token![:]>()?;
        let mut value = TokenStream::new();
        while !input.is_empty() && !input.peek(Token![;]) {
            value.extend([input.parse::<TokenTree>()?]);
        }
        input.parse::<Token![;]>()?;
        Ok(Entry { key, phase, value })
    }
}

/// Comma-separated names (`f16, bf16`).
pub fn names(input: ParseStream) -> syn::Result<Vec<Ident>> {
    Ok(
        Punctuated::<Ident, Token![,]>::parse_separated_nonempty_with(input, Ident::parse_any)?
            .into_iter()
            .collect(),
    )
}

impl Parse for ActivationDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = Ident::parse_any(input)?;
        let params = if input.peek(syn::token::Paren) {
            let inner;
            parenthesized!(inner in input);
            let pairs =
                Punctuated::<(Ident, Lit), Token![,]>::parse_terminated_with(&inner, |p| {
                    let key = Ident::parse_any(p)?;
                    p.parse::<Token![=]>()?;
                    Ok((key, p.parse()?))
                })?;
            Some(pairs.into_iter().collect())
        } else {
            None
        };
        Ok(ActivationDecl { name, params })
    }
}

/// Comma-separated activations (a spec may name one; the check stage says so at the second).
pub fn activations(input: ParseStream) -> syn::Result<Vec<ActivationDecl>> {
    Ok(
        Punctuated::<ActivationDecl, Token![,]>::parse_separated_nonempty(input)?
            .into_iter()
            .collect(),
    )
}

/// Comma-separated dims (`T = 1, R = 8, H`).
pub fn dims(input: ParseStream) -> syn::Result<Vec<DimDecl>> {
    Ok(
        Punctuated::<DimDecl, Token![,]>::parse_separated_nonempty(input)?
            .into_iter()
            .collect(),
    )
}

impl Parse for DimDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name = input.parse()?;
        if !input.peek(Token![=]) {
            return Ok(DimDecl {
                name,
                size: None,
                range: None,
            });
        }
        input.parse::<Token![=]>()?;
        let first: LitInt = input.parse()?;
        if input.peek(Token![..=]) {
            input.parse::<Token![..=]>()?;
            return Ok(DimDecl {
                name,
                size: None,
                range: Some((first, Some(input.parse()?))),
            });
        }
        if input.peek(Token![..]) {
            input.parse::<Token![..]>()?;
            return Ok(DimDecl {
                name,
                size: None,
                range: Some((first, None)),
            });
        }
        Ok(DimDecl {
            name,
            size: Some(first),
            range: None,
        })
    }
}

impl Parse for SelectDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mode = input.call(Ident::parse_any)?;
        let over = if input.is_empty() {
            None
        } else {
            Some(input.parse()?)
        };
        let by = if input.is_empty() {
            None
        } else {
            let kw: Ident = input.parse()?;
            if kw != "by" {
                return Err(syn::Error::new(
                    kw.span(),
                    "expected `by`, as in `gather E by R`",
                ));
            }
            Some(input.parse()?)
        };
        Ok(SelectDecl { mode, over, by })
    }
}

/// Comma-separated block lists (`H = 704 x 4`).
pub fn blocks(input: ParseStream) -> syn::Result<Vec<BlocksDecl>> {
    Ok(
        Punctuated::<BlocksDecl, Token![,]>::parse_separated_nonempty(input)?
            .into_iter()
            .collect(),
    )
}

impl Parse for BlocksDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let dim = input.parse()?;
        input.parse::<Token![=]>()?;
        if input.peek(syn::token::Bracket) {
            let inner;
            bracketed!(inner in input);
            let sizes = Punctuated::<LitInt, Token![,]>::parse_terminated(&inner)?;
            return Ok(BlocksDecl {
                dim,
                sizes: sizes.into_iter().collect(),
                count: None,
            });
        }
        let size: LitInt = input.parse()?;
        times(input)?;
        let count: LitInt = input.parse()?;
        let n = count.base10_parse::<usize>()?;
        Ok(BlocksDecl {
            dim,
            sizes: vec![size; n.min(4096)],
            count: Some(count),
        })
    }
}

impl Parse for CoresDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut dims = vec![input.parse::<Ident>()?];
        while !input.peek(Token![=]) {
            times(input)?;
            dims.push(input.parse()?);
        }
        input.parse::<Token![=]>()?;
        let mut parts = vec![input.parse::<LitInt>()?];
        while !input.is_empty() {
            times(input)?;
            parts.push(input.parse()?);
        }
        Ok(CoresDecl { dims, parts })
    }
}

/// Comma-separated `DIM = N` (`F = 64`).
pub fn sizes(input: ParseStream) -> syn::Result<Vec<SizeDecl>> {
    Ok(
        Punctuated::<SizeDecl, Token![,]>::parse_separated_nonempty(input)?
            .into_iter()
            .collect(),
    )
}

impl Parse for SizeDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let dim = input.parse()?;
        input.parse::<Token![=]>()?;
        Ok(SizeDecl {
            dim,
            size: input.parse()?,
        })
    }
}

impl Parse for LoopDecl {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        Ok(LoopDecl {
            dim: input.parse()?,
            kind: input.call(Ident::parse_any)?,
        })
    }
}

/// The `x` between factors (`8 x 4`).
fn times(input: ParseStream) -> syn::Result<()> {
    let x: Ident = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), "expected `x`, as in `704 x 4`"))?;
    if x != "x" {
        return Err(syn::Error::new(x.span(), "expected `x`, as in `704 x 4`"));
    }
    Ok(())
}
