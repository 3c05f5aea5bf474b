//! Every built-in Spyre program renders as KTIR, one KTIR construct per program construct: the
//! rendering restates the program, it does not tile again (docs/ktir.md). Running the KTIR is
//! `scripts/ktir-crosscheck`'s, with the external interpreter.

use moek_ir::spyre::{Instr, Program};
use moek_kernels::Registry;
use moek_kernels::ir::{DType, Target};
use moek_lower::ktir::{KtirError, render};
use moek_lower::spyre::lower;

/// (indexed loads, ring reduces, loops) of a body, loops included.
fn count(body: &[Instr], n: &mut [usize; 3]) {
    for i in body {
        match i {
            Instr::IndexedLoad { .. } => n[0] += 1,
            Instr::RingReduce { .. } => n[1] += 1,
            Instr::Loop {
                preheader,
                body,
                drain,
                ..
            } => {
                n[2] += 1;
                for part in [preheader, body, drain] {
                    count(part, n);
                }
            }
            _ => {}
        }
    }
}

fn programs() -> Vec<Program> {
    Registry::builtin()
        .entries()
        .map(|e| e.ir())
        .filter(|k| k.targets.contains(&Target::Spyre) && k.dtypes.contains(&DType::F16))
        .map(|k| lower::program(k, DType::F16).expect("a built-in lowers"))
        .collect()
}

#[test]
fn every_spyre_program_renders_one_construct_per_instruction() {
    let programs = programs();
    assert!(
        programs.len() >= 10,
        "only {} Spyre programs",
        programs.len()
    );
    for p in programs {
        let text = render(&p).unwrap_or_else(|e| panic!("{}: {e}", p.kernel));
        let mut n = [0; 3];
        for ph in &p.phases {
            count(&ph.body, &mut n);
        }
        let occurs = |s: &str| text.matches(s).count();
        assert_eq!(
            occurs("ktdp.construct_indirect_access_tile"),
            n[0],
            "{}: one in-place gather per indexed load",
            p.kernel
        );
        assert_eq!(occurs("ktdp.inter_tile_reduce("), n[1], "{}", p.kernel);
        assert_eq!(occurs("= scf.for "), n[2], "{}", p.kernel);
        assert_eq!(
            occurs("iter_args("),
            n[2],
            "{}: loops carry LX values",
            p.kernel
        );
        let args: Vec<String> = p
            .tensors
            .iter()
            .map(|t| format!("%{}_ptr: index", t.name))
            .collect();
        let head = format!(
            "func.func @{}({}) attributes {{grid = [{}]}}",
            p.kernel,
            args.join(", "),
            p.cores_used
        );
        assert!(text.contains(&head), "{}: {head}", p.kernel);
        assert_eq!(occurs("{"), occurs("}"), "{}: unbalanced braces", p.kernel);
        well_formed(&p, &text);
    }
}

/// Every SSA value is defined before it is used (at entry, by an op's results, a block's
/// arguments, a loop's induction variable and carried values, an indirect tile's variables),
/// and every argument is used.
fn well_formed(p: &Program, text: &str) {
    let name = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut defined: std::collections::HashSet<String> = p
        .tensors
        .iter()
        .map(|t| format!("{}_ptr", t.name))
        .collect();
    let mut used = std::collections::HashSet::new();
    // The arguments are defined by the signature, which uses none.
    let body = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("func.func"));
    for line in body {
        // What the line defines: its results, and the names bound inside it.
        let (results, rest) = match line.split_once(" = ") {
            Some((lhs, rhs)) if lhs.starts_with('%') => (lhs, rhs),
            _ => ("", line),
        };
        let mut binds: Vec<String> = results
            .split(", ")
            .map(|r| name(r.trim_start_matches('%')))
            .collect();
        for key in ["intermediate_variables(", "^bb0(", "iter_args(", "scf.for "] {
            if let Some(at) = rest.find(key).or_else(|| line.find(key)) {
                let tail = &line[line.find(key).unwrap_or(at) + key.len()..];
                let close = tail.find(')').unwrap_or(tail.len());
                let inner = match key {
                    "scf.for " => &tail[..tail.find(' ').unwrap_or(0)],
                    _ => &tail[..close],
                };
                for part in inner.split(", ") {
                    let part = part.trim().trim_start_matches('%');
                    binds.push(name(part));
                }
            }
        }
        defined.extend(binds.into_iter().filter(|b| !b.is_empty()));
        for (i, _) in rest.match_indices('%') {
            let v = name(&rest[i + 1..]);
            assert!(
                v.is_empty() || defined.contains(&v),
                "{}: `%{v}` is used before it is defined: {line}",
                p.kernel
            );
            used.insert(v);
        }
    }
    for t in &p.tensors {
        assert!(
            used.contains(&format!("{}_ptr", t.name)),
            "{}: argument `{}_ptr` is never used",
            p.kernel,
            t.name
        );
    }
}

/// The interpreter has no bf16: a bf16 program is refused, saying so.
#[test]
fn a_bf16_program_is_refused() {
    let k = Registry::builtin()
        .get("decode_expert_ffn_blocked")
        .expect("a built-in")
        .ir()
        .clone();
    let p = lower::program(&k, DType::Bf16).unwrap();
    assert_eq!(render(&p), Err(KtirError::Dtype("bf16".into())));
}

/// The well-formedness check fails a text whose value is used undefined, or whose argument is
/// unused.
#[test]
fn the_well_formedness_check_can_fail() {
    let p = programs().remove(0);
    let text = render(&p).unwrap();
    let undefined = text.replacen("%zf = arith.constant", "%zq = arith.constant", 1);
    assert!(std::panic::catch_unwind(|| well_formed(&p, &undefined)).is_err());
    let unused = text.replace("%x_ptr, sizes", "%idx_ptr, sizes");
    assert!(std::panic::catch_unwind(|| well_formed(&p, &unused)).is_err());
}

/// The LX-overflow spec (tests/specs/lx_overflow.spec, which `scripts/ktir-crosscheck
/// --overflow` hands the interpreter): the checker refuses it at `H`, and forced within a larger
/// budget it lowers to a plan whose single weight tile alone is the interpreter's whole 2 MiB cap
/// (so its cap must refuse it too).
#[test]
fn the_overflow_spec_is_refused_and_forced_past_the_interpreters_cap() {
    use std::str::FromStr;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/specs/lx_overflow.spec");
    let text = std::fs::read_to_string(path).expect("the overflow spec");
    let tokens = proc_macro2::TokenStream::from_str(&text).expect("spec text tokenizes");
    let specs = moek_dsl::parse::parse_specs(tokens).expect("the spec parses");
    let [spec] = specs.as_slice() else {
        panic!("one spec")
    };
    let refused = moek_dsl::check::check(spec).expect_err("over the device's LX budget");
    let why = refused.to_string();
    assert!(why.contains("over the budget of"), "{why}");
    let at = refused.span().start();
    let line = text.lines().nth(at.line - 1).expect("the span's line");
    assert_eq!(
        &line[at.column..at.column + 1],
        "H",
        "pointed at `H`: {why}"
    );
    let forced = moek_dsl::check::check_within(spec, 8 << 20).expect("within 8 MiB it checks");
    let p = lower::program_within(&forced, DType::F16, 8 << 20).expect("and lowers");
    let tile = p.phases[0]
        .buffers
        .iter()
        .find(|b| b.name == "w_gate")
        .expect("a gate tile");
    let cap = 2 << 20;
    assert!(tile.bytes >= cap, "{} B tile under the cap", tile.bytes);
    let text = render(&p).expect("forced plans render");
    assert!(
        text.contains("tensor<1x8192x128xf16>"),
        "one whole tile loaded"
    );
}
