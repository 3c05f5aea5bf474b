//! The run time prints a spec's CPU variant without the compiler: each entry embeds the source
//! the macro generated, and it is byte for byte what the DSL's emitter gives for the entry's IR.

use moek_kernels::Registry;
use moek_kernels::ir::Target;

#[test]
fn every_entrys_embedded_cpu_source_is_the_emitters() {
    let mut checked = 0;
    for entry in Registry::builtin().entries() {
        let k = entry.ir();
        if !k.targets.contains(&Target::Cpu) {
            assert_eq!(entry.cpu_source(), "", "{}", k.name);
            continue;
        }
        assert_eq!(
            entry.cpu_source(),
            moek_dsl::emit::cpu_source(k),
            "{}: the embedded CPU source differs from the emitter's",
            k.name
        );
        checked += 1;
    }
    assert!(checked > 20, "only {checked} specs target the CPU");
}
