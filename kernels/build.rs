//! Tells the test harness whether it was built unoptimised, so generated tests can say why they
//! run slowly (a dependency's `[profile.test]` is not inherited by the crate that uses it).
fn main() {
    println!("cargo::rustc-check-cfg=cfg(moek_unoptimised)");
    println!("cargo::rerun-if-env-changed=OPT_LEVEL");
    if std::env::var("OPT_LEVEL").is_ok_and(|level| level == "0") {
        println!("cargo::rustc-cfg=moek_unoptimised");
    }
}
