//! Bad specs must fail to compile with spanned errors carrying the numbers (one mistake per file,
//! named for it; `several_mistakes.rs` proves all are reported at once); good specs compile, and
//! run, from a crate that is not `moek-kernels`.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    for group in [
        "keys",
        "names",
        "activation",
        "blocks",
        "cores",
        "select",
        "spyre",
        "wgpu",
        "quant",
    ] {
        t.compile_fail(format!("ui/{group}/*.rs"));
    }
    t.compile_fail("ui/several_mistakes.rs");
    t.pass("ui/pass/*.rs");
}
