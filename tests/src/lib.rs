//! Cross-crate tests live in `tests/`: trybuild UI tests of specs, dispatch, numerics of blocking,
//! and the fuzz targets. The library holds what several test crates share: [`fuzz`], the
//! bounded fuzzing harness and its mutators.

pub mod fuzz;
