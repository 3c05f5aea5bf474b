//! How much a generated test runs: seeds per shape within a budget of multiply-adds, and the
//! smaller shapes a CPU wgpu driver runs.

use super::*;

/// Seeds a generated test runs per shape.
pub const SEEDS: usize = 3;

/// Multiply-adds a generated test may spend per seed before it runs one seed instead of
/// [`SEEDS`]: about seven seconds of the Spyre simulator on two cores. A dense persistent prefill
/// over 128 experts and 512 tokens is 3.9e11 (26 s a seed there); decode and the free-dim sizes
/// are far below it. `MOEK_FULL_TESTS=1` runs every seed regardless.
pub const MACS_PER_SEED_BUDGET: f64 = 1e11;

/// Multiply-adds the variant of `k` performs at `shape`: a dense selection computes every
/// expert for every token.
pub fn macs(k: &Kernel, s: &Shape) -> f64 {
    let (t, h, f, v) = (s.t as f64, s.h as f64, s.f as f64, s.v as f64);
    let per_token = if k.schedule.select == moek_ir::Selection::Dense {
        s.e as f64
    } else {
        s.r as f64
    };
    match k.op {
        Op::GateUp => t * per_token * 2.0 * f * h,
        Op::Down => t * per_token * h * f,
        Op::ExpertFfn => t * per_token * 3.0 * f * h,
        Op::DenseMlp => t * 3.0 * f * h,
        Op::LmHeadRow => v * h,
    }
}

/// [`SEEDS`], or one where a seed costs more than [`MACS_PER_SEED_BUDGET`] (said on stderr),
/// unless `MOEK_FULL_TESTS=1`.
pub fn seeds_within_budget(k: &Kernel, shape: &Shape) -> usize {
    let cost = macs(k, shape);
    let full = std::env::var("MOEK_FULL_TESTS").is_ok_and(|v| v == "1");
    if cost <= MACS_PER_SEED_BUDGET || full {
        return SEEDS;
    }
    eprintln!(
        "{}: one seed of {SEEDS} ({cost:.1e} multiply-adds a seed, over the budget of {MACS_PER_SEED_BUDGET:.0e}); MOEK_FULL_TESTS=1 runs all",
        k.name
    );
    1
}

/// The smaller problem a wgpu run of `shape` takes on a CPU driver (Mesa's lavapipe or
/// llvmpipe): prefill at 32 tokens, expert banks at 16 experts, the LM head at 32768 vocabulary
/// rows. There, the dense persistent loop over 128 experts and 512 tokens takes three minutes a
/// run (still 25-50 s at 8 tokens: each of the 32 token groups reads every expert's weights), the
/// 262144-row head 13-21 s, and a decode step over a 128-expert bank 5-15 s, nearly all of it
/// copying the bank (1.5-3 GB) into the driver's buffers: the 8 routed experts it reads are the
/// same work at 16. Cut, the same programs (every loop trip's steps, core split, route list,
/// column block and weight chunk switch) take a second or two. `None` on a GPU, for other
/// targets, or where nothing is cut.
pub fn cpu_driver_shape(target: Target, shape: &Shape) -> Option<Shape> {
    const PREFILL_T: usize = 32;
    const BANK_E: usize = 16;
    const HEAD_V: usize = 32768;
    #[cfg(feature = "wgpu")]
    let cpu_driver = target == Target::Wgpu && crate::wgpu::Gpu::shared().is_ok_and(|g| g.is_cpu());
    #[cfg(not(feature = "wgpu"))]
    let cpu_driver = {
        let _ = target;
        false
    };
    let mut cut = *shape;
    cut.t = cut.t.min(PREFILL_T);
    // Never below the routes a token takes (each of them a distinct expert).
    cut.e = cut.e.min(BANK_E.max(cut.r));
    cut.v = cut.v.min(HEAD_V);
    (cpu_driver && cut != *shape).then_some(cut)
}
