//! The equivalence harness: runs a spec's variant on random inputs and compares it with the f64
//! reference (`moek_ir::reference`) under the dtype's written tolerance
//! (`moek_ir::tolerance`). Every spec's generated tests call [`check_spec`]; `moek check` prints
//! the same [`Report`]s.
//!
//! Outputs are poisoned with NaN before a run, so an element a variant fails to write is NaN and
//! fails. Full-size specs check a random sample of output rows against the reference (the f64
//! reference of a 26B-A4B layer is minutes of work); every element is still checked for NaN.

pub use crate::backend::Modeled;
use crate::backend::{self, Ran};
use crate::inputs::{AnyInputs, Bound, Inputs, output_len};
use crate::registry::KernelEntry;
use half::{bf16, f16};
use moek_ir::Element;
use moek_ir::reference::{self, Biases, Shape};
use moek_ir::tensors::{ACT, ElemClass, Optional, Optionals, TensorDef, TensorRole};
use moek_ir::tolerance::{Deviation, Tolerance};
use moek_ir::{Activation, DType, DimName, Kernel, Op, Target};

mod case;
mod cases;
mod conformance;
mod draws;
mod quant_case;
mod reports;
mod shapes;

pub use crate::geometry::{admits, shape_for};
pub use case::*;
pub use cases::*;
pub use conformance::{conformance, conformance_of};
pub use draws::*;
pub use quant_case::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
pub use reports::*;
pub use shapes::*;
use std::time::Instant;

/// Sizes given to free dims in tests: small, and off every SIMD width so tails run.
pub const SMALL: Shape = Shape {
    t: 5,
    r: 3,
    e: 7,
    h: 200,
    f: 72,
    v: 301,
};

/// Output rows (tokens, or vocabulary rows of the LM head) checked against the reference per run.
pub const SAMPLE_ROWS: usize = 6;

/// Runs `entry`'s variant on `target` for `dtype` on fresh seeds and panics, with the seed and the
/// figures, if any run is outside the tolerance or leaves an element unwritten.
pub fn check_spec(entry: &KernelEntry, target: Target, dtype: DType) {
    check_spec_sharing(
        &mut Cases::default(),
        fresh_seeds(1)[0],
        entry,
        target,
        dtype,
    );
}

/// [`check_spec`] on cases kept in `cases`, their weights (and the first run's activations) drawn
/// from `seed`: the specs of one op, shape and dtype then share weights (the conformance suite)
/// instead of each drawing its own (a full-size expert bank is hundreds of millions of numbers).
pub fn check_spec_sharing(
    cases: &mut Cases,
    seed: u64,
    entry: &KernelEntry,
    target: Target,
    dtype: DType,
) {
    let k = entry.ir();
    if cfg!(moek_unoptimised) {
        eprintln!(
            "{}: built unoptimised, so this test runs 10-30x slower; add `[profile.test] opt-level = 3` to the workspace's Cargo.toml",
            k.name
        );
    }
    let mut shapes = vec![shape_for(k, &SMALL)];
    if k.dim(DimName::T)
        .is_some_and(|d| d.size.is_none() && d.admits(1))
    {
        shapes.push(shape_for(k, &Shape { t: 1, ..SMALL }));
    }
    for shape in shapes {
        let shape = cpu_driver_shape(target, &shape).map_or(shape, |cut| {
            eprintln!(
                "{} on a CPU wgpu driver: run at {}, not {}",
                k.name,
                crate::inputs::describe(k.op, &cut),
                crate::inputs::describe(k.op, &shape)
            );
            cut
        });
        let seeds: Vec<u64> = std::iter::once(seed)
            .chain(fresh_seeds(seeds_within_budget(k, &shape) - 1))
            .collect();
        let reports = cases
            .run_seeds(entry, target, dtype, &shape, &seeds)
            .unwrap_or_else(|e| panic!("{e}"));
        for report in reports {
            assert!(
                report.passed(),
                "{report}\nreproduce with seed {}",
                report.seed
            );
        }
    }
}

/// Runs `entry`'s variant on `inputs` the harness drew, checked first (a malformed draw is a
/// harness bug, not a variant's failure).
fn run_checked(
    on: &crate::Backend,
    entry: &KernelEntry,
    shape: &Shape,
    inputs: AnyInputs<'_, '_>,
    out: &mut [f32],
) -> Result<Ran, String> {
    inputs
        .validate(shape, out.len())
        .expect("the harness builds well-formed inputs");
    backend::run(on, entry, shape, &inputs, out)
}
