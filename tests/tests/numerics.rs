//! What blocking does to the numbers, measured and bounded; repeated routes; determinism across
//! runs and thread counts; and proof that the harness catches wrong variants.

use half::bf16;
use moek_ir::tolerance::{Deviation, tolerance};
use moek_kernels::ir::{Activation, DType, Op, Target};
use moek_kernels::registry::{CpuFns, KernelEntry};
use moek_kernels::specs::*;
use moek_kernels::testing::{Case, check_spec, fresh_seeds};
use moek_kernels::{Inputs, Shape};

use moek_kernels::geometry::DECODE;

moek_kernels::kernel! {
    /// gpt-oss's clamped SwiGLU with a limit the test cases' gates and ups cross often, so its
    /// generated equivalence tests (cpu, wgpu) check the clamps, not only the smooth part.
    pub tight_swiglu = expert_ffn {
        dims:       T, R, E, H, F;
        dtypes:     f16, bf16, f32;
        targets:    cpu, wgpu;
        activation: swiglu_clamped(limit = 0.25, alpha = 1.702);
        select:     gather E by R;
        cores:      R = 8;
    }

    /// A core split that does not divide its fixed dim: CPU and wgpu take near-equal parts
    /// (100 columns of F as 33, 33, 34), and the generated tests check every element.
    pub uneven_split = gate_up {
        dims:    T, R, E, H = 96, F = 100;
        dtypes:  bf16, f32;
        targets: cpu, wgpu;
        select:  gather E by R;
        cores:   F = 3;
    }

    /// Biases through the two-phase gather (gate/up split over H, so no route owners): each
    /// bias alone, so a bias lost or doubled in either phase fails its own test.
    pub biased_gate_up_two_phase = expert_ffn {
        dims:            T, R, E, H, F;
        dtypes:          bf16, f32;
        targets:         cpu, wgpu;
        activation:      silu;
        bias:            gate_up;
        select:          gather E by R;
        cores(gate_up):  H = 2;
        cores(down):     R = 2;
    }

    pub biased_down_two_phase = expert_ffn {
        dims:            T, R, E, H, F;
        dtypes:          bf16, f32;
        targets:         cpu, wgpu;
        activation:      silu;
        bias:            down;
        select:          gather E by R;
        cores(gate_up):  H = 2;
        cores(down):     H = 2;
    }

    /// The same on Spyre, whose programs are fixed: a small decode geometry.
    pub tight_swiglu_spyre = expert_ffn {
        dims:       T = 1, R = 8, E = 16, H = 512, F = 256;
        dtypes:     f16, bf16;
        targets:    spyre;
        activation: swiglu_clamped(limit = 0.25, alpha = 1.702);
        select:     gather E by R;
        cores:      R = 8;
    }
}

fn run(f: moek_kernels::CpuFn<bf16>, case: &Case<bf16>, len: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; len];
    f(&case.shape, &case.inputs(), &mut out);
    out
}

fn diff(a: &[f32], b: &[f32]) -> Deviation {
    let b: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
    Deviation::measure(a, &b)
}

/// Gate/up in 4 x 704 blocks vs one 2816-term sum: both accumulate in f32, so they differ by
/// reassociation only, bounded by twice the f32 accumulation error (~sqrt(2816) * 2^-24 = 3e-6
/// relative per sum; limit 1e-5 relative L2 and max abs).
#[test]
fn gate_up_blocking_changes_rounding_within_the_f32_accumulation_bound() {
    let seed = fresh_seeds(1)[0];
    let case = Case::<bf16>::new(Op::GateUp, DECODE, seed);
    let blocked = run(
        decode_gate_up_h704x4::entry().cpu.bf16.unwrap(),
        &case,
        8 * 704,
    );
    let plain = run(general_gate_up::entry().cpu.bf16.unwrap(), &case, 8 * 704);
    let d = diff(&blocked, &plain);
    println!("gate/up 704 x 4 vs unblocked (seed {seed}): {d}");
    assert_eq!(d.non_finite, 0);
    assert!(
        d.rel_l2 <= 1e-5 && d.max_abs_rel() <= 1e-5,
        "seed {seed}: {d}"
    );
    assert!(
        d.max_abs > 0.0,
        "blocking reassociates the sums: some bits must differ (seed {seed})"
    );
}

/// Column blocks only cut the output: each column keeps its full, identically ordered reduction,
/// so the results are bit-identical.
#[test]
fn down_column_blocks_do_not_change_a_bit() {
    let case = Case::<bf16>::new(Op::Down, DECODE, fresh_seeds(1)[0]);
    let blocked = run(
        decode_down_cols_1024_1024_768::entry().cpu.bf16.unwrap(),
        &case,
        2816,
    );
    let plain = run(general_down::entry().cpu.bf16.unwrap(), &case, 2816);
    assert!(
        blocked
            .iter()
            .zip(&plain)
            .all(|(a, b)| a.to_bits() == b.to_bits())
    );
}

/// The whole blocked decode FFN against the unblocked one, bounded as gate/up (down adds no
/// reassociation; the activation difference propagates through a 704-term sum).
#[test]
fn blocked_decode_ffn_vs_unblocked_is_bounded() {
    let seed = fresh_seeds(1)[0];
    let case = Case::<bf16>::new(Op::ExpertFfn, DECODE, seed);
    let blocked = run(
        decode_expert_ffn_blocked::entry().cpu.bf16.unwrap(),
        &case,
        2816,
    );
    let plain = run(
        general_expert_ffn_gather::entry().cpu.bf16.unwrap(),
        &case,
        2816,
    );
    let d = diff(&blocked, &plain);
    println!("decode FFN blocked vs unblocked (seed {seed}): {d}");
    assert!(d.non_finite == 0 && d.rel_l2 <= 1e-5, "seed {seed}: {d}");
}

/// A token may route to the same expert twice: every variant must count both routes.
#[test]
fn repeated_route_indices_count_twice_in_every_variant() {
    let shape = Shape { t: 512, ..DECODE };
    let mut case = Case::<bf16>::new(Op::ExpertFfn, shape, fresh_seeds(1)[0]);
    for t in 0..shape.t {
        case.idx[t * 8 + 1] = case.idx[t * 8];
        case.idx[t * 8 + 7] = case.idx[t * 8];
    }
    for entry in [
        prefill_expert_ffn_persistent::entry(),
        prefill_expert_ffn_grouped::entry(),
    ] {
        let out = run(entry.cpu.bf16.unwrap(), &case, shape.t * shape.h);
        let (dev, _) = case.compare(Activation::GeluTanh, &out, None, 11);
        assert!(
            dev.within(tolerance(DType::Bf16)),
            "{}: {dev}",
            entry.name()
        );
    }
    let mut one = Case::<bf16>::new(Op::ExpertFfn, DECODE, fresh_seeds(1)[0]);
    one.idx = vec![5; 8];
    let out = run(
        decode_expert_ffn_blocked::entry().cpu.bf16.unwrap(),
        &one,
        2816,
    );
    let (dev, _) = one.compare(Activation::GeluTanh, &out, None, 1);
    assert!(dev.within(tolerance(DType::Bf16)), "decode: {dev}");
}

/// The declared order fixes every sum: results are bit-identical across runs and thread counts.
#[test]
fn results_are_identical_across_runs_and_thread_counts() {
    let shape = Shape { t: 64, ..DECODE };
    let case = Case::<bf16>::new(Op::ExpertFfn, shape, fresh_seeds(1)[0]);
    for entry in [
        prefill_expert_ffn_grouped::entry(),
        prefill_expert_ffn_grouped::entry(),
        general_expert_ffn_gather::entry(),
    ] {
        let f = entry.cpu.bf16.unwrap();
        let runs: Vec<Vec<f32>> = [1, 2, 3, 2]
            .iter()
            .map(|&threads| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| run(f, &case, shape.t * shape.h))
            })
            .collect();
        for r in &runs[1..] {
            assert!(
                r.iter()
                    .zip(&runs[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{}",
                entry.name()
            );
        }
    }
}

/// A variant that leaves one element unwritten (the poisoned NaN stays) fails the harness.
#[test]
#[should_panic(expected = "1 non-finite")]
fn the_harness_fails_an_unwritten_element() {
    fn skips_last(s: &Shape, i: &Inputs<'_, f32>, out: &mut [f32]) -> Option<u32> {
        let n = out.len();
        let mut full = vec![0f32; n];
        general_down::cpu(s, i, &mut full);
        out[..n - 1].copy_from_slice(&full[..n - 1]);
        None
    }
    let entry = KernelEntry::new(
        general_down::IR_JSON,
        general_down::CPU_SOURCE,
        CpuFns {
            f32: Some(skips_last),
            ..CpuFns::NONE
        },
    );
    check_spec(&entry, Target::Cpu, DType::F32);
}

/// A variant that drops the route weights is far outside the tolerance.
#[test]
#[should_panic(expected = "reproduce with seed")]
fn the_harness_fails_a_wrong_combine() {
    fn unweighted(s: &Shape, i: &Inputs<'_, f32>, out: &mut [f32]) -> Option<u32> {
        use moek_kernels::ir::tensors::{ACT, DOWN, IDX};
        let ones = vec![1.0f32; i.indices(&IDX).len()];
        let dropped = Inputs::down(i.f32s(&ACT), i.indices(&IDX), &ones, i.weight(&DOWN));
        general_down::cpu::<f32, f32>(s, &dropped, out)
    }
    let entry = KernelEntry::new(
        general_down::IR_JSON,
        general_down::CPU_SOURCE,
        CpuFns {
            f32: Some(unweighted),
            ..CpuFns::NONE
        },
    );
    check_spec(&entry, Target::Cpu, DType::F32);
}

#[test]
fn nan_never_passes() {
    let d = Deviation::measure(&[1.0, f32::NAN], &[1.0, 2.0]);
    assert!(!d.within(tolerance(DType::Bf16)));
    let d = Deviation::measure(&[1.0, f32::INFINITY], &[1.0, 2.0]);
    assert!(!d.within(tolerance(DType::Bf16)));
}

/// The clamps of `tight_swiglu` bind on the cases its generated tests draw: its reference differs
/// from an unclamped one's by far more than any tolerance.
#[test]
fn the_tight_swiglu_cases_cross_the_clamp() {
    let k = tight_swiglu::entry();
    let shape = moek_kernels::testing::shape_for(k.ir(), &moek_kernels::testing::SMALL);
    let case = Case::<bf16>::new(Op::ExpertFfn, shape, 1);
    let loose = Activation::SwigluClamped {
        limit: 1e6,
        alpha: 1.702,
    };
    let rel = rel_l2(
        &reference(&case, loose),
        &reference(&case, k.ir().activation),
    );
    assert!(
        rel > 0.05,
        "the clamp changes the reference by only {rel:e}"
    );
}

/// The generated tests' cost budget: a dense persistent prefill over 128 experts and 512 tokens
/// runs one seed, decode runs all three.
#[test]
fn the_cost_budget_cuts_seeds_only_where_a_seed_is_dear() {
    use moek_kernels::testing::{SEEDS, macs, seeds_within_budget};
    let prefill = prefill_expert_ffn_persistent::entry();
    let shape = moek_kernels::geometry::PREFILL;
    assert!(macs(prefill.ir(), &shape) > 3e11);
    let full = std::env::var("MOEK_FULL_TESTS").is_ok_and(|v| v == "1");
    assert_eq!(
        seeds_within_budget(prefill.ir(), &shape),
        if full { SEEDS } else { 1 }
    );
    let decode = decode_expert_ffn_blocked::entry();
    assert_eq!(seeds_within_budget(decode.ir(), &DECODE), SEEDS);
}

/// The biases the biased specs' generated tests add move the reference far beyond any tolerance:
/// a variant that dropped them would fail.
#[test]
fn the_biases_change_the_reference() {
    use moek_kernels::ir::tensors::{Optional, Optionals};
    let shape = moek_kernels::testing::shape_for(
        general_expert_ffn_gather_swiglu_biased::entry().ir(),
        &moek_kernels::testing::SMALL,
    );
    let mut case = Case::<bf16>::new(Op::ExpertFfn, shape, 3);
    let act = Activation::Silu;
    let plain = reference(&case, act);
    for bias in [Optional::GateUpBias, Optional::DownBias] {
        case.optional = Optionals::NONE.with(bias);
        let rel = rel_l2(&reference(&case, act), &plain);
        assert!(rel > 0.1, "{bias}: the reference moves by only {rel:e}");
    }
}

/// The output gate of `general_shared_experts_gated` scales rows by sigmoids spread well away
/// from 1 on the cases its generated tests draw: a variant that skipped it would fail.
#[test]
fn the_output_gate_changes_the_reference() {
    let shape = moek_kernels::testing::shape_for(
        general_shared_experts_gated::entry().ir(),
        &moek_kernels::testing::SMALL,
    );
    let mut case = Case::<bf16>::new(Op::DenseMlp, shape, 5);
    let plain = reference(&case, Activation::Silu);
    use moek_kernels::ir::tensors::{Optional, Optionals};
    case.optional = Optionals::NONE.with(Optional::OutputGate);
    let rel = rel_l2(&reference(&case, Activation::Silu), &plain);
    assert!(
        rel > 0.2,
        "the output gate moves the reference by only {rel:e}"
    );
}

/// Every output row of `case`'s reference for activation `act`, in row order.
fn reference(case: &Case<bf16>, act: Activation) -> Vec<f64> {
    (0..case.rows().0)
        .flat_map(|row| case.reference_row(act, row))
        .collect()
}

/// `|a - reference| / |reference|` in L2.
fn rel_l2(a: &[f64], reference: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(reference).map(|(a, b)| (a - b).powi(2)).sum();
    let norm: f64 = reference.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}
