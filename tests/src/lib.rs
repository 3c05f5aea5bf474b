//! Cross-crate tests live in `tests/`: trybuild UI tests of specs, dispatch, numerics of blocking.
