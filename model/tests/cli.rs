//! The `moek` command as users run it.

use std::process::Command;

fn moek(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moek"))
        .args(args)
        .output()
        .expect("moek runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn list_prints_every_spec_name_first() {
    let (ok, out, _) = moek(&["list"]);
    assert!(ok);
    let names: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let want: Vec<&str> = moek_kernels::specs::all()
        .iter()
        .map(|e| e.name())
        .collect();
    assert_eq!(names, want);
    assert!(out.contains("reduce H=704x4"), "{out}");
}

#[test]
fn emit_prints_the_generated_cpu_variant() {
    let (ok, out, _) = moek(&["emit", "decode_gate_up_h704x4", "--backend", "cpu"]);
    assert!(ok);
    assert!(out.contains("pub fn cpu<W"), "{out}");
    assert!(
        out.contains("(0usize, 704usize),\n") && out.contains("(2112usize, 2816usize),\n"),
        "the blocks are baked in: {out}"
    );
    assert!(out.contains("is fixed at T=1 but was given"), "{out}");
    looks_formatted(&out);
}

/// The printed source is formatted Rust (prettyplease output ends each item with a newline).
fn looks_formatted(src: &str) {
    assert!(src.lines().count() > 20 && src.ends_with("}\n"), "{src}");
}

#[test]
fn emit_errors_are_clear() {
    let (ok, _, err) = moek(&["emit", "nope", "--backend", "cpu"]);
    assert!(!ok);
    assert!(err.contains("no spec is named `nope`"), "{err}");
    let (ok, _, err) = moek(&["emit", "general_down", "--backend", "spyre"]);
    assert!(!ok);
    assert!(
        err.contains("does not target spyre (targets: cpu)"),
        "{err}"
    );
}

#[test]
fn check_runs_specs_at_real_size_and_reports() {
    let (ok, out, err) = moek(&["check", "--filter", "decode_gate_up", "--require", "cpu"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("decode_gate_up_h704x4                bf16  T=1 R=8 E=128 H=2816 F=704"),
        "{out}"
    );
    assert!(
        out.lines().filter(|l| l.ends_with("yes")).count() == 2,
        "{out}"
    );
}

#[test]
fn check_refuses_a_backend_it_cannot_run() {
    let (ok, _, err) = moek(&["check", "--require", "wgpu"]);
    assert!(!ok);
    assert!(
        err.contains("backend `wgpu` is required but it is not part of this build yet"),
        "{err}"
    );
}
