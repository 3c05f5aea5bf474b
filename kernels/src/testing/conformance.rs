//! The conformance suite a backend crate instantiates in its own tests: every built-in spec the
//! backend is targeted by, in every dtype the spec declares, held to the f64 reference exactly as
//! the spec's generated tests hold it. A new backend crate gets the whole suite with one test
//! that calls [`conformance`].

use super::{Cases, SMALL, check_spec_sharing, fresh_seeds, shape_for};
use crate::Registry;
use moek_ir::{DType, Target};

/// Runs every (built-in spec targeting `target`) x (its dtype) pair through
/// [`check_spec_sharing`], all of them, then fails naming each pair that failed (a missing adapter
/// or backend fails every pair: nothing is skipped). Pairs run grouped by op, dtype and weight
/// shape, and share one case (weights drawn once, from one seed) per group.
pub fn conformance(target: Target) {
    conformance_of(target, |_| true);
}

/// [`conformance`] for the dtypes `dtypes` admits (a backend whose code paths split by dtype
/// tests the parts apart, or one part under a forced setting).
pub fn conformance_of(target: Target, dtypes: impl Fn(DType) -> bool) {
    let registry = Registry::builtin();
    let mut pairs: Vec<_> = registry
        .entries()
        .filter(|e| e.ir().targets.contains(&target))
        .flat_map(|e| e.ir().dtypes.iter().map(move |&d| (e, d)))
        .filter(|&(_, d)| dtypes(d))
        .collect();
    assert!(
        !pairs.is_empty(),
        "no built-in spec targets {target} in these dtypes"
    );
    pairs.sort_by_key(|(entry, dtype)| {
        let s = shape_for(entry.ir(), &SMALL);
        // A quantized case serves both activation dtypes of its block format.
        let drawn = dtype.blocks().map_or(dtype.to_string(), |f| f.to_string());
        let op = entry.ir().op.to_string();
        (op, drawn, (s.e, s.h, s.f, s.v), dtype.to_string())
    });
    let (mut cases, seed) = (Cases::default(), fresh_seeds(1)[0]);
    let failed: Vec<String> = pairs
        .iter()
        .filter(|(entry, dtype)| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_spec_sharing(&mut cases, seed, entry, target, *dtype)
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
