//! The conformance suite a backend crate instantiates in its own tests: every built-in spec the
//! backend is targeted by, in every dtype the spec declares, held to the f64 reference exactly as
//! the spec's generated tests hold it. A new backend crate gets the whole suite with one test
//! that calls [`conformance`].

use super::check_spec;
use crate::Registry;
use moek_ir::Target;

/// Runs every (built-in spec targeting `target`) x (its dtype) pair through [`check_spec`], all of
/// them, then fails naming each pair that failed (a missing adapter or backend fails every pair:
/// nothing is skipped).
pub fn conformance(target: Target) {
    let registry = Registry::builtin();
    let pairs: Vec<_> = registry
        .entries()
        .filter(|e| e.ir().targets.contains(&target))
        .flat_map(|e| e.ir().dtypes.iter().map(move |&d| (e, d)))
        .collect();
    assert!(!pairs.is_empty(), "no built-in spec targets {target}");
    let failed: Vec<String> = pairs
        .iter()
        .filter(|(entry, dtype)| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_spec(entry, target, *dtype)
            }))
            .is_err()
        })
        .map(|(entry, dtype)| format!("{} ({dtype})", entry.name()))
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} spec x dtype pairs fail (their messages are above): {}",
        failed.len(),
        pairs.len(),
        failed.join(", ")
    );
    eprintln!("{target}: all {} spec x dtype pairs conform", pairs.len());
}
