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
