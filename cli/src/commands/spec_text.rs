//! Spec text read at run time, checked as `kernel!` checks it (the DSL's own parser and checker):
//! the candidates `moek tune` states, the winners it writes, and the tuned specs `--tuned` gives
//! the model. The `moek` command is the one binary that links the checker.

use moek_kernels::ir::Kernel;
use std::str::FromStr;

/// Why spec text did not compile: the spec (if it parsed) and the checker's messages, in order.
#[derive(Debug)]
pub struct Refused {
    pub spec: Option<String>,
    pub messages: Vec<String>,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(name) = &self.spec {
            write!(f, "`{name}`: ")?;
        }
        f.write_str(&self.messages.join("; "))
    }
}

fn refused(spec: Option<String>, e: syn::Error) -> Refused {
    Refused {
        spec,
        messages: e.into_iter().map(|m| m.to_string()).collect(),
    }
}

/// Every spec of `text` (specs as `kernel!` takes them, one after another), checked: their IR,
/// or the first spec's refusal.
pub fn compile_all(text: &str) -> Result<Vec<Kernel>, Refused> {
    compile_all_within(text, moek_kernels::ir::spyre::LX_BUDGET)
}

/// [`compile_all`] with Spyre plans held to `lx` bytes of LX per core (`--lx-budget`).
pub fn compile_all_within(text: &str, lx: usize) -> Result<Vec<Kernel>, Refused> {
    let tokens = proc_macro2::TokenStream::from_str(text).map_err(|e| Refused {
        spec: None,
        messages: vec![e.to_string()],
    })?;
    let specs = moek_dsl::parse::parse_specs(tokens).map_err(|e| refused(None, e))?;
    specs
        .iter()
        .map(|spec| {
            moek_dsl::check::check_within(spec, lx)
                .map_err(|e| refused(Some(spec.name.to_string()), e))
        })
        .collect()
}

/// The one spec of `text`, checked.
pub fn compile(text: &str) -> Result<Kernel, Refused> {
    let mut all = compile_all(text)?;
    match all.len() {
        1 => Ok(all.remove(0)),
        n => Err(Refused {
            spec: None,
            messages: vec![format!("expected one spec, found {n}")],
        }),
    }
}
