//! Fuzzing the parsers the DSL and the Spyre backend own (docs/reliability.md): token-level
//! mutations of every built-in spec through parse -> check -> emit, and mutations of every
//! emitted Spyre program through the loader and the simulator. Never a panic; every refusal is
//! an error (a spec's with a span inside the input). Counts and seeds: `moek_tests::fuzz`.

use moek_dsl::{check, emit, parse};
use moek_ir::spyre::{DeviceRole, Program};
use moek_ir::{DType, Target};
use moek_spyre::{Data, Device, Mode, SimError, simulate};
use moek_tests::fuzz::{Fuzz, mutate_json};
use proc_macro2::{Delimiter, TokenStream, TokenTree};
use rand::Rng;
use rand::rngs::SmallRng;
use std::sync::OnceLock;

/// Each built-in spec's tokens, flattened: a group is its open and close delimiters around its
/// contents, every other token its text.
fn spec_tokens() -> &'static [Vec<String>] {
    static SPECS: OnceLock<Vec<Vec<String>>> = OnceLock::new();
    SPECS.get_or_init(|| {
        let file: TokenStream = include_str!("../../kernels/src/specs.rs").parse().unwrap();
        let mut bodies = vec![];
        let tokens: Vec<TokenTree> = file.into_iter().collect();
        for w in tokens.windows(3) {
            if let [
                TokenTree::Ident(i),
                TokenTree::Punct(p),
                TokenTree::Group(g),
            ] = w
                && i == "kernel"
                && p.as_char() == '!'
            {
                bodies.push(g.stream());
            }
        }
        // One spec: its attributes and header up to and including its braced body.
        let mut specs = vec![];
        for body in bodies {
            let mut spec = vec![];
            for t in body {
                let braced = matches!(&t, TokenTree::Group(g) if g.delimiter() == Delimiter::Brace);
                flatten(t, &mut spec);
                if braced {
                    specs.push(std::mem::take(&mut spec));
                }
            }
        }
        assert!(specs.len() > 10, "the built-in specs were found");
        specs
    })
}

fn flatten(t: TokenTree, out: &mut Vec<String>) {
    match t {
        TokenTree::Group(g) => {
            let (open, close) = match g.delimiter() {
                Delimiter::Brace => ("{", "}"),
                Delimiter::Bracket => ("[", "]"),
                Delimiter::Parenthesis => ("(", ")"),
                Delimiter::None => ("", ""),
            };
            out.push(open.into());
            g.stream().into_iter().for_each(|t| flatten(t, out));
            out.push(close.into());
        }
        TokenTree::Punct(p) => out.push(p.as_char().to_string()),
        other => out.push(other.to_string()),
    }
}

/// What a mutation may put in: the grammar's own words, dims, numbers at and past the edges,
/// punctuation.
const POOL: &[&str] = &[
    "dims",
    "dtypes",
    "targets",
    "select",
    "reduce",
    "columns",
    "cores",
    "requires",
    "activation",
    "groups",
    "persistent",
    "stream",
    "gather",
    "by",
    "x",
    "T",
    "R",
    "E",
    "H",
    "F",
    "V",
    "bf16",
    "f16",
    "f32",
    "cpu",
    "wgpu",
    "spyre",
    "silu",
    "gelu_tanh",
    "expert_ffn",
    "gate_up",
    "down",
    "dense_mlp",
    "lm_head_row",
    "pub",
    "zz",
    "0",
    "1",
    "2",
    "3",
    "8",
    "32",
    "64",
    "704",
    "2816",
    "1099511627776",
    "18446744073709551616",
    "99999999999999999999999999",
    "3.5",
    "\"s\"",
    ",",
    ";",
    ":",
    "=",
    "..",
    "..=",
    "-",
    "*",
    "+",
    "[ ]",
    "( )",
    "[ 1 , 2 ]",
];

fn is_delimiter(t: &str) -> bool {
    matches!(t, "{" | "}" | "[" | "]" | "(" | ")")
}

/// One to three token-level mutations of a random built-in spec, as source text.
fn mutated_spec(rng: &mut SmallRng) -> String {
    let specs = spec_tokens();
    let mut toks = specs[rng.random_range(0..specs.len())].clone();
    for _ in 0..rng.random_range(1..=3) {
        let leaves: Vec<usize> = (0..toks.len())
            .filter(|&i| !is_delimiter(&toks[i]))
            .collect();
        let i = leaves[rng.random_range(0..leaves.len())];
        let pick = POOL[rng.random_range(0..POOL.len())].to_string();
        match rng.random_range(0..6) {
            0 => {
                toks.remove(i);
            }
            1 => toks.insert(i, toks[i].clone()),
            2 if i + 1 < toks.len() && !is_delimiter(&toks[i + 1]) => toks.swap(i, i + 1),
            3 => toks.insert(i, pick),
            4 => {
                // Empty a bracketed or parenthesised group, or drop it whole.
                if let Some(open) = (0..toks.len()).find(|&j| toks[j] == "[" || toks[j] == "(") {
                    let close = matching(&toks, open);
                    let from = if rng.random_bool(0.5) { open } else { open + 1 };
                    let to = if from == open { close + 1 } else { close };
                    toks.drain(from..to);
                } else {
                    toks[i] = pick;
                }
            }
            _ => toks[i] = pick,
        }
    }
    toks.join(" ")
}

fn matching(toks: &[String], open: usize) -> usize {
    let mut depth = 0;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t.as_str() {
            "{" | "[" | "(" => depth += 1,
            "}" | "]" | ")" => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    unreachable!("the flattened tokens are balanced")
}

/// Every error of `e` points into `text`: a non-empty byte range inside it (a call-site span
/// would be empty).
fn spans_inside(e: &syn::Error, text: &str) -> Result<(), String> {
    for one in e.clone() {
        let r = one.span().byte_range();
        if r.is_empty() || r.end > text.len() {
            return Err(format!(
                "error `{one}` has span {r:?}, not inside the {}-byte input",
                text.len()
            ));
        }
    }
    Ok(())
}

#[test]
fn mutated_specs_give_spanned_errors_never_panics() {
    let fuzz = Fuzz::new("spec grammar", 3000);
    let counts = fuzz.run(mutated_spec, |text| {
        let Ok(ts) = text.parse::<TokenStream>() else {
            return Ok(false); // Not Rust tokens: rustc's lexer refuses it before the macro runs.
        };
        let specs = match parse::parse_specs(ts) {
            Ok(specs) => specs,
            Err(e) => return spans_inside(&e, text).map(|()| false),
        };
        let mut accepted = true;
        for spec in &specs {
            match check::check(spec) {
                Ok(k) => {
                    emit::module(spec, &k);
                }
                Err(e) => {
                    spans_inside(&e, text)?;
                    accepted = false;
                }
            }
        }
        Ok(accepted)
    });
    assert!(counts.refused > 0 && counts.accepted > 0, "{counts:?}");
}

/// Every built-in spec's Spyre program, in every dtype it has, as JSON.
fn programs() -> &'static [serde_json::Value] {
    static PROGRAMS: OnceLock<Vec<serde_json::Value>> = OnceLock::new();
    PROGRAMS.get_or_init(|| {
        let mut out = vec![];
        for e in moek_kernels::Registry::builtin().entries() {
            let k = e.ir();
            if !k.targets.contains(&Target::Spyre) {
                continue;
            }
            for &dtype in &k.dtypes {
                if let Ok(p) = moek_lower::spyre::lower::program(k, dtype) {
                    out.push(serde_json::to_value(&p).unwrap());
                }
            }
        }
        assert!(out.len() > 10, "the built-in Spyre programs were emitted");
        // Small ones of both shapes, whose accepted mutants the simulator runs here in
        // milliseconds; each weighs as much as all the built-in ones together.
        let small = parse::parse_specs(quote::quote! {
            pub small_gather = expert_ffn {
                dims: T = 1, R = 2, E = 4, H = 128, F = 64;
                dtypes: bf16; targets: spyre;
                select: gather E by R;
                reduce: H = 64 x 2;
                cores(gate_up): R x H = 2 x 2;
                cores(down): R = 2;
            }
            pub small_persistent = expert_ffn {
                dims: T = 16, R = 2, E = 4, H = 128, F = 64;
                dtypes: bf16; targets: spyre;
                select: dense E;
                loop: E persistent;
                groups: T = 4;
                cores(gate_up): T x H = 2 x 2;
                cores(down): T x H = 2 x 2;
                requires: lx_completed_sum;
            }
        })
        .unwrap();
        let builtin = out.len();
        for spec in &small {
            let k = check::check(spec).unwrap();
            let p =
                serde_json::to_value(moek_lower::spyre::lower::program(&k, DType::Bf16).unwrap());
            out.extend(std::iter::repeat_n(p.unwrap(), builtin));
        }
        out
    })
}

/// Elements a program's tensors declare, if that count is one a test can hold.
fn small(p: &Program) -> bool {
    let elems = p.tensors.iter().try_fold(0usize, |n, t| {
        t.shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))?
            .checked_add(n)
    });
    elems.is_some_and(|n| n <= 1 << 22)
}

#[test]
fn mutated_spyre_programs_are_refused_or_run_never_panic() {
    let fuzz = Fuzz::new("spyre program", 2000);
    let mut simulated = 0;
    let counts = fuzz.run(
        |rng| {
            let all = programs();
            let mut v = all[rng.random_range(0..all.len())].clone();
            let n = rng.random_range(1..=3);
            mutate_json(&mut v, n, rng);
            v.to_string()
        },
        |text| {
            let p = match moek_spyre::load(text) {
                Ok(p) => p,
                Err(moek_spyre::LoadError::Parse(_)) => return Ok(false),
                Err(moek_spyre::LoadError::Invalid(why)) => {
                    // The simulator runs nothing of a program the validator refuses.
                    let p: Program = serde_json::from_str(text).unwrap();
                    return match simulate(&p, Mode::F32, &mut Device::default()) {
                        Err(SimError::Invalid(e)) if e == why => Ok(false),
                        other => Err(format!("refused ({why}) but the simulator gave {other:?}")),
                    };
                }
            };
            // Accepted: unbound tensors are an error before anything runs...
            if !p.tensors.is_empty()
                && !matches!(
                    simulate(&p, Mode::F32, &mut Device::default()),
                    Err(SimError::Tensor { .. })
                )
            {
                return Err("an accepted program ran with its tensors unbound".into());
            }
            // ...and, bound, it runs or errors (small ones: the full-size ones take seconds).
            if small(&p) {
                let mut dev = Device::default();
                for t in &p.tensors {
                    let n: usize = t.shape.iter().product();
                    if t.role == DeviceRole::Routes {
                        dev.routes.insert(t.name.clone(), vec![0; n]);
                    } else {
                        dev.tensors.insert(t.name.clone(), Data::F32(vec![0.5; n]));
                    }
                }
                let _ = simulate(&p, Mode::F32, &mut dev);
                simulated += 1;
            }
            Ok(true)
        },
    );
    eprintln!("fuzz spyre program: {simulated} accepted mutants simulated");
    assert!(counts.refused > 0, "{counts:?}");
}
