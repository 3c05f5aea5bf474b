//! The docs' worked examples are the specs the tests compile: docs/dsl.md's copy of each model's
//! decode spec is the one `tests/ui/pass/model_decode_specs.rs` builds and runs.

/// The `kernel! { ... }` block of `source`, up to its closing brace at the start of a line.
fn kernel_block(source: &str) -> &str {
    let start = source.find("kernel! {").expect("a kernel! invocation");
    let end = source[start..]
        .find("\n}\n")
        .expect("a closing brace at the start of a line");
    &source[start..start + end + 3]
}

#[test]
fn the_per_model_specs_in_the_docs_are_the_ones_compiled() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let pass = std::fs::read_to_string(format!("{root}/tests/ui/pass/model_decode_specs.rs"))
        .expect("the pass case");
    let docs = std::fs::read_to_string(format!("{root}/docs/dsl.md")).expect("docs/dsl.md");
    let block = kernel_block(&pass);
    assert!(
        docs.contains(block),
        "docs/dsl.md's \"One spec per model\" example differs from the pass case; copy:\n{block}"
    );
    for name in [
        "gemma4_decode",
        "qwen3_decode",
        "mixtral_decode",
        "deepseek_decode",
        "gpt_oss_decode",
    ] {
        assert!(
            block.contains(&format!("pub {name} = ")),
            "{name} is missing"
        );
    }
}

#[test]
fn the_tuned_specs_in_the_docs_are_the_ones_compiled() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let pass = std::fs::read_to_string(format!("{root}/tests/ui/pass/tuned_decode_specs.rs"))
        .expect("the pass case");
    let docs = std::fs::read_to_string(format!("{root}/docs/dsl.md")).expect("docs/dsl.md");
    let block = kernel_block(&pass);
    assert!(
        docs.contains(block),
        "docs/dsl.md's \"Tuned specs\" differ from the pass case; copy:\n{block}"
    );
    assert_eq!(block.matches(" = expert_ffn {").count(), 5);
}
