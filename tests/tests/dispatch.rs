//! Dispatch: the most specific eligible variant is chosen and the choice says why; missing
//! capabilities fall back visibly; an explicit ineligible request fails before any output is written.

use moek_kernels::dispatch::{self, Backend, DispatchError, Ineligible};
use moek_kernels::ir::{Activation, Capability, DType, Function, Op, Storage};
use moek_kernels::testing::Case;
use moek_kernels::{Registry, Shape, specs};

use moek_kernels::geometry::{DECODE, PREFILL};

/// Dispatches `case` on the CPU backend over the built-in specs.
fn run_on_cpu<W: moek_kernels::Element>(
    case: &Case<W>,
    out: &mut [f32],
    requested: Option<&str>,
) -> Result<(dispatch::Choice, moek_kernels::backend::Ran), DispatchError> {
    dispatch::run(
        &Registry::builtin(),
        &Backend::cpu(),
        &case.shape,
        &case.inputs(),
        out,
        requested,
    )
}

fn choose(op: Op, dtype: DType, shape: &Shape) -> dispatch::Choice {
    dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        op,
        dtype,
        shape,
        None,
    )
    .expect("some variant is eligible")
}

#[test]
fn decode_takes_the_blocked_variants() {
    let c = choose(Op::ExpertFfn, DType::Bf16, &DECODE);
    assert_eq!(c.kernel, "decode_expert_ffn_blocked");
    assert!(c.why.starts_with("most specific"), "{}", c.why);
    assert_eq!(
        choose(Op::GateUp, DType::F16, &DECODE).kernel,
        "decode_gate_up_h704x4"
    );
    assert_eq!(
        choose(Op::Down, DType::Bf16, &DECODE).kernel,
        "decode_down_cols_1024_1024_768"
    );
}

#[test]
fn the_activation_is_part_of_what_is_asked_for() {
    // Gemma's (the default) never gets the SiLU variant, however specific it is.
    let gelu = choose(Op::ExpertFfn, DType::Bf16, &DECODE);
    assert_eq!(gelu.kernel, "decode_expert_ffn_blocked");
    let (_, why) = gelu
        .passed_over
        .iter()
        .find(|(name, _)| name == "decode_expert_ffn_blocked_silu")
        .expect("the SiLU variant is considered and passed over");
    assert!(why.contains("silu"), "{why}");
    // Asked for SiLU, dispatch picks it, and only specs with SiLU are eligible.
    let silu = Function::new(Op::ExpertFfn, Activation::Silu);
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        silu,
        DType::Bf16,
        &DECODE,
        None,
    )
    .expect("the SiLU variant serves decode");
    assert_eq!(c.kernel, "decode_expert_ffn_blocked_silu");
    // In f32 the blocked SiLU variant has no variant, and no GELU one is taken for it: the
    // general SiLU one serves.
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        silu,
        DType::F32,
        &DECODE,
        None,
    )
    .expect("the general SiLU variant serves f32");
    assert_eq!(c.kernel, "general_expert_ffn_gather_silu");
    let why = |name: &str| &c.passed_over.iter().find(|(n, _)| n == name).unwrap().1;
    assert!(why("decode_expert_ffn_blocked_silu").contains("no f32 variant"));
    assert!(
        why("general_expert_ffn_gather")
            .contains("computes `expert_ffn with gelu_tanh`, not `expert_ffn with silu`")
    );
}

#[test]
fn prefill_on_the_cpu_takes_the_grouped_variant_and_says_why() {
    let c = choose(Op::ExpertFfn, DType::Bf16, &PREFILL);
    assert_eq!(c.kernel, "prefill_expert_ffn_grouped");
    assert!(
        c.why
            .starts_with("most specific eligible (4 fixed dims, 1 bounded"),
        "{}",
        c.why
    );
    let persistent = c
        .passed_over
        .iter()
        .find(|(n, _)| n == "prefill_expert_ffn_persistent")
        .expect("recorded");
    assert_eq!(
        persistent.1,
        "it requires capability `lx_completed_sum`, which the cpu backend lacks"
    );
    // Any prompt length, not only 512.
    assert_eq!(
        choose(Op::ExpertFfn, DType::Bf16, &Shape { t: 77, ..DECODE }).kernel,
        "prefill_expert_ffn_grouped"
    );
}

#[test]
fn other_sizes_and_dtypes_fall_back_to_general_variants_with_reasons() {
    let c = choose(Op::ExpertFfn, DType::F32, &DECODE);
    assert_eq!(c.kernel, "general_expert_ffn_gather");
    let blocked = c
        .passed_over
        .iter()
        .find(|(n, _)| n == "decode_expert_ffn_blocked")
        .unwrap();
    assert_eq!(blocked.1, "it has no f32 variant (dtypes: f16, bf16)");
    let grouped = c
        .passed_over
        .iter()
        .find(|(n, _)| n == "prefill_expert_ffn_grouped")
        .unwrap();
    assert_eq!(grouped.1, "it serves T in 2.., the problem has T=1");
    let small = Shape {
        t: 1,
        r: 4,
        e: 16,
        h: 256,
        f: 64,
        v: 0,
    };
    let c = choose(Op::GateUp, DType::Bf16, &small);
    assert_eq!(c.kernel, "general_gate_up");
    assert!(
        c.passed_over
            .iter()
            .any(|(_, why)| why == "it is fixed at R=8, the problem has R=4"),
        "{c}"
    );
}

#[test]
fn a_missing_capability_falls_back_and_is_recorded() {
    for backend in [Backend::cpu(), Backend::spyre()] {
        let target = backend.target;
        let without = backend.without(Capability::IndexedSelectionLayout);
        let c = dispatch::choose(
            &Registry::builtin(),
            &without,
            Op::ExpertFfn,
            DType::Bf16,
            &DECODE,
            None,
        )
        .unwrap();
        assert_eq!(c.kernel, "decode_expert_ffn_ordinary", "on {target}");
        let why = &c
            .passed_over
            .iter()
            .find(|(n, _)| n == "decode_expert_ffn_blocked")
            .unwrap()
            .1;
        assert_eq!(
            why,
            &format!(
                "it requires capability `indexed_selection_layout`, which the {target} backend lacks"
            )
        );
        let err = dispatch::choose(
            &Registry::builtin(),
            &without,
            Op::ExpertFfn,
            DType::Bf16,
            &DECODE,
            Some("decode_expert_ffn_blocked"),
        );
        assert!(
            matches!(err, Err(DispatchError::Requested { .. })),
            "an explicit request fails: {err:?}"
        );
    }
    // With every capability, Spyre decode takes the blocked variant.
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::spyre(),
        Op::ExpertFfn,
        DType::Bf16,
        &DECODE,
        None,
    )
    .unwrap();
    assert_eq!(c.kernel, "decode_expert_ffn_blocked");
}

#[test]
fn a_spyre_run_through_dispatch_matches_the_reference_and_writes_nothing_when_refused() {
    let case = Case::<half::bf16>::new(Op::ExpertFfn, DECODE, 5);
    let mut out = vec![f32::NAN; DECODE.h];
    let without = Backend::spyre().without(Capability::IndexedSelectionLayout);
    let err = dispatch::run(
        &Registry::builtin(),
        &without,
        &DECODE,
        &case.inputs(),
        &mut out,
        Some("decode_expert_ffn_blocked"),
    );
    assert!(err.is_err());
    assert!(
        out.iter().all(|v| v.is_nan()),
        "a refused request writes nothing"
    );
    let (choice, _) = dispatch::run(
        &Registry::builtin(),
        &without,
        &DECODE,
        &case.inputs(),
        &mut out,
        None,
    )
    .unwrap();
    assert_eq!(choice.kernel, "decode_expert_ffn_ordinary");
    let (dev, _) = case.compare(Activation::GeluTanh, &out, None, 5);
    assert!(
        dev.within(moek_ir::tolerance::tolerance_dl16(DType::Bf16)),
        "{dev}"
    );
}

#[test]
fn an_explicit_ineligible_request_fails_before_writing_anything() {
    let case = Case::<half::f16>::new(
        Op::ExpertFfn,
        Shape {
            t: 2,
            r: 2,
            e: 4,
            h: 64,
            f: 32,
            v: 0,
        },
        7,
    );
    let mut out = vec![f32::NAN; 2 * 64];
    let err = run_on_cpu(&case, &mut out, Some("decode_expert_ffn_blocked")).unwrap_err();
    assert_eq!(
        err,
        DispatchError::Requested {
            name: "decode_expert_ffn_blocked".into(),
            reason: Ineligible::Dim {
                dim: moek_kernels::ir::DimName::T,
                fixed: 1,
                got: 2
            }
        }
    );
    assert!(
        out.iter().all(|v| v.is_nan()),
        "nothing may be written before the request is refused"
    );
    let err = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        Op::ExpertFfn,
        DType::F16,
        &case.shape,
        Some("nope"),
    );
    assert!(matches!(err, Err(DispatchError::Unknown { .. })));
}

#[test]
fn bad_inputs_are_typed_errors_naming_the_tensor() {
    let shape = Shape {
        t: 2,
        r: 2,
        e: 4,
        h: 64,
        f: 32,
        v: 0,
    };
    let mut case = Case::<f32>::new(Op::ExpertFfn, shape, 1);
    case.param_mut("down").pop();
    let mut out = vec![f32::NAN; 2 * 64];
    let err = run_on_cpu(&case, &mut out, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor `down` has 8191 elements; expected 8192 for T=2 R=2 E=4 H=64 F=32"
    );
    let mut case = Case::<f32>::new(Op::ExpertFfn, shape, 1);
    case.idx[3] = 4;
    let err = run_on_cpu(&case, &mut out, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "route index 4 at slot 3 of `idx` is out of range for E = 4"
    );
    assert!(out.iter().all(|v| v.is_nan()));
}

#[test]
fn the_dispatched_variant_runs_and_matches_the_reference() {
    let shape = Shape {
        t: 3,
        r: 2,
        e: 5,
        h: 96,
        f: 40,
        v: 0,
    };
    let case = Case::<half::bf16>::new(Op::ExpertFfn, shape, 3);
    let mut out = vec![f32::NAN; 3 * 96];
    let (choice, _) = run_on_cpu(&case, &mut out, None).unwrap();
    assert_eq!(choice.kernel, "general_expert_ffn_grouped");
    let (dev, _) = case.compare(Activation::GeluTanh, &out, None, 3);
    assert!(
        dev.within(moek_ir::tolerance::tolerance(DType::Bf16)),
        "{dev}"
    );
}

#[test]
fn on_wgpu_prefill_falls_back_from_the_persistent_variant_and_a_forced_one_writes_nothing() {
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::wgpu(),
        Op::ExpertFfn,
        DType::Bf16,
        &PREFILL,
        None,
    )
    .unwrap();
    assert_eq!(c.kernel, "general_expert_ffn_gather");
    let why = &c
        .passed_over
        .iter()
        .find(|(n, _)| n == "prefill_expert_ffn_persistent")
        .unwrap()
        .1;
    assert!(why.contains("`lx_completed_sum`"), "{why}");
    let s = Shape {
        t: 3,
        r: 2,
        e: 4,
        h: 64,
        f: 32,
        v: 0,
    };
    let case = Case::<half::bf16>::new(Op::ExpertFfn, s, 3);
    let mut out = vec![f32::NAN; s.t * s.h];
    let err = dispatch::run(
        &Registry::builtin(),
        &Backend::wgpu(),
        &s,
        &case.inputs(),
        &mut out,
        Some("prefill_expert_ffn_persistent"),
    );
    assert!(
        matches!(err, Err(DispatchError::Requested { .. })),
        "{err:?}"
    );
    assert!(
        out.iter().all(|v| v.is_nan()),
        "a refused request writes nothing"
    );
    let (choice, _) = dispatch::run(
        &Registry::builtin(),
        &Backend::wgpu(),
        &s,
        &case.inputs(),
        &mut out,
        None,
    )
    .expect("an adapter is present where tests run (lavapipe in CI)");
    assert_eq!(choice.kernel, "general_expert_ffn_gather");
    let (dev, _) = case.compare(Activation::GeluTanh, &out, None, 3);
    assert!(
        dev.within(moek_ir::tolerance::tolerance(DType::Bf16)),
        "{dev}"
    );
}

#[test]
fn a_wgpu_session_uploads_expert_banks_once_for_prefill_and_decode() {
    use moek_kernels::wgpu::Session;
    let s = Shape {
        t: 4,
        r: 2,
        e: 5,
        h: 96,
        f: 40,
        v: 0,
    };
    let prefill = Case::<half::f16>::new(Op::ExpertFfn, s, 11);
    let mut session = Session::new().expect("an adapter (lavapipe in CI)");
    session.keep(prefill.param("gate_up"));
    session.keep(prefill.param("down"));
    let k = specs::general_expert_ffn_gather::entry().ir().clone();
    let mut out = vec![f32::NAN; s.t * s.h];
    session.run(&k, &s, &prefill.inputs(), &mut out).unwrap();
    let (dev, _) = prefill.compare(Activation::GeluTanh, &out, None, 11);
    assert!(
        dev.within(moek_ir::tolerance::tolerance(DType::F16)),
        "{dev}"
    );
    assert_eq!(session.weight_uploads(), 2);
    // Decode: one token of the same layer, the same banks.
    let one = Shape { t: 1, ..s };
    let x = prefill.x[..s.h].to_vec();
    let (idx, weights) = (&prefill.idx[..s.r], &prefill.weights[..s.r]);
    let (gate_up, down) = (prefill.param("gate_up"), prefill.param("down"));
    let inputs = moek_kernels::Inputs::expert_ffn(&x, idx, weights, gate_up, down);
    let mut row = vec![f32::NAN; s.h];
    session.run(&k, &one, &inputs, &mut row).unwrap();
    assert_eq!(session.weight_uploads(), 2, "decode reuses the kept banks");
    let want = moek_ir::reference::expert_ffn(
        &one,
        Activation::GeluTanh,
        &x,
        idx,
        weights,
        prefill.param("gate_up"),
        prefill.param("down"),
        Default::default(),
        0,
    );
    let dev = moek_ir::tolerance::Deviation::measure(&row, &want);
    assert!(
        dev.within(moek_ir::tolerance::tolerance(DType::F16)),
        "{dev}"
    );
}

/// Every op's bound inputs follow its table entry: one slice per tensor (every optional one
/// bound), in table order, of the table's element class and length, so checks and binders
/// derived from the table see the tensors the variants read.
#[test]
fn bound_inputs_follow_the_op_table() {
    use moek_kernels::inputs::Bound;
    use moek_kernels::ir::tensors::ElemClass;
    let shape = moek_kernels::testing::SMALL;
    for &op in Op::ALL {
        let mut case = Case::<half::bf16>::new(op, shape, 3);
        case.optional = op.optionals();
        let inputs = case.inputs();
        let bound = inputs.bound();
        assert_eq!(bound.len(), op.tensors().len(), "{op}");
        for (def, t) in op.tensors().iter().zip(&bound) {
            let class = match t {
                Bound::Act(_) => ElemClass::Activation,
                Bound::Weight(_) => ElemClass::Weight,
                Bound::F32(_) => ElemClass::F32,
                Bound::Index(_) => ElemClass::Index,
            };
            assert_eq!(class, def.class, "{op}: `{}`", def.name);
            assert_eq!(t.len(), def.len(&shape), "{op}: `{}`", def.name);
        }
    }
}

#[test]
fn an_activations_parameters_are_part_of_what_is_asked_for() {
    let swiglu = |limit| {
        let activation = Activation::SwigluClamped {
            limit,
            alpha: 1.702,
        };
        Function::new(Op::ExpertFfn, activation)
    };
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        swiglu(7.0),
        DType::Bf16,
        &DECODE,
        None,
    )
    .expect("the blocked clamped-SwiGLU variant serves decode");
    assert_eq!(c.kernel, "decode_expert_ffn_blocked_swiglu");
    // Another limit is another function: no spec computes it, and the refusal names both.
    let err = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        swiglu(5.0),
        DType::Bf16,
        &DECODE,
        None,
    )
    .expect_err("no spec clamps at 5");
    let msg = err.to_string();
    assert!(
        msg.contains(
            "computes `expert_ffn with swiglu_clamped(limit = 7, alpha = 1.702)`, not \
             `expert_ffn with swiglu_clamped(limit = 5, alpha = 1.702)`"
        ),
        "{msg}"
    );
}

#[test]
fn qwen3_30b_a3b_takes_its_own_blocked_and_grouped_variants() {
    use moek_kernels::geometry::{QWEN3_DECODE, QWEN3_PREFILL};
    let silu = Function::new(Op::ExpertFfn, Activation::Silu);
    let pick = |shape| {
        dispatch::choose(
            &Registry::builtin(),
            &Backend::cpu(),
            silu,
            DType::Bf16,
            shape,
            None,
        )
        .expect("a SiLU variant serves Qwen3-30B-A3B")
        .kernel
    };
    assert_eq!(pick(&QWEN3_DECODE), "qwen3_decode_expert_ffn_blocked");
    assert_eq!(pick(&QWEN3_PREFILL), "qwen3_prefill_expert_ffn_grouped");
}

#[test]
fn biases_are_part_of_what_is_asked_for_and_a_spec_refuses_inputs_without_its_own() {
    use moek_kernels::ir::tensors::Optional;
    let activation = Activation::SwigluClamped {
        limit: 7.0,
        alpha: 1.702,
    };
    let unbiased = Function::new(Op::ExpertFfn, activation);
    let task = unbiased.with(Optional::GateUpBias).with(Optional::DownBias);
    let c = dispatch::choose(
        &Registry::builtin(),
        &Backend::cpu(),
        task,
        DType::Bf16,
        &DECODE,
        None,
    )
    .expect("the biased gpt-oss variant serves any size");
    assert_eq!(c.kernel, "general_expert_ffn_gather_swiglu_biased");
    let why = &c
        .passed_over
        .iter()
        .find(|(n, _)| n == "decode_expert_ffn_blocked_swiglu")
        .expect("the unbiased variant is passed over")
        .1;
    assert!(
        why.contains(
            "computes `expert_ffn with swiglu_clamped(limit = 7, alpha = 1.702)`, not \
             `expert_ffn with swiglu_clamped(limit = 7, alpha = 1.702) + gate_up_bias + down_bias`"
        ),
        "{why}"
    );
    // The biased spec forced on inputs without biases: refused before anything is written.
    let s = Shape {
        t: 2,
        r: 3,
        e: 5,
        h: 64,
        f: 32,
        v: 0,
    };
    let case = Case::<half::bf16>::new(Op::ExpertFfn, s, 7);
    let mut out = vec![f32::NAN; s.t * s.h];
    let err = dispatch::run_function(
        &Registry::builtin(),
        &Backend::cpu(),
        unbiased,
        &s,
        &case.inputs(),
        &mut out,
        Some("general_expert_ffn_gather_swiglu_biased"),
    )
    .expect_err("the inputs carry no biases");
    assert!(
        err.to_string()
            .contains("+ gate_up_bias + down_bias`, not `expert_ffn with swiglu_clamped"),
        "{err}"
    );
    assert!(out.iter().all(|x| x.is_nan()), "nothing was written");
}

#[test]
fn an_output_gate_is_served_only_when_asked_for() {
    let shape = Shape {
        t: 3,
        h: 64,
        f: 96,
        ..Shape::default()
    };
    let task = |output_gate| {
        let f = Function::new(Op::DenseMlp, Activation::Silu);
        match output_gate {
            true => f.with(moek_kernels::ir::tensors::Optional::OutputGate),
            false => f,
        }
    };
    let pick = |output_gate| {
        dispatch::choose(
            &Registry::builtin(),
            &Backend::cpu(),
            task(output_gate),
            DType::Bf16,
            &shape,
            None,
        )
        .expect("a SiLU dense MLP serves it")
    };
    assert_eq!(pick(true).kernel, "general_shared_experts_gated");
    let plain = pick(false);
    assert_eq!(plain.kernel, "general_dense_mlp_silu");
    let why = &plain
        .passed_over
        .iter()
        .find(|(n, _)| n == "general_shared_experts_gated")
        .expect("considered")
        .1;
    assert!(
        why.contains("computes `dense_mlp with silu + output_gate`, not `dense_mlp with silu`"),
        "{why}"
    );
}

/// Asked for what each built-in spec computes, at its own sizes, dispatch picks a spec that
/// computes the same function (op, activation and its parameters, biases, output gate).
#[test]
fn dispatch_serves_each_specs_function_with_that_function() {
    for entry in Registry::builtin().entries() {
        let k = entry.ir();
        let shape = moek_kernels::geometry::real_shape(k);
        let task = k.function();
        let c = dispatch::choose(
            &Registry::builtin(),
            &Backend::cpu(),
            task,
            Storage::new(k.dtypes[0], k.quant_block),
            &shape,
            None,
        )
        .unwrap_or_else(|e| panic!("{}: nothing serves its own function: {e}", k.name));
        let chosen = Registry::builtin().get(&c.kernel).cloned().unwrap();
        assert_eq!(chosen.ir().function(), task, "{} -> {}", k.name, c.kernel);
    }
}

/// A quantized variant serves only the block size its spec declares: Q8_0 weights in blocks of
/// 32 pass over the 64-value spec, saying why, and an explicit request for it fails before
/// anything is written; the same weights in blocks of 64 take it.
#[test]
fn quantized_variants_serve_only_their_declared_block_size() {
    use moek_kernels::ir::quant::{BlockQ8, BlockQ8_0};
    use moek_kernels::testing::QuantCase;
    let shape = Shape {
        t: 1,
        r: 8,
        e: 8,
        h: 2816,
        f: 704,
        v: 0,
    };
    let wide = "expert_ffn_blocked_quantized_b64";
    // The block size is the inputs' own: the function asked for is the same.
    let function = Function::from(Op::ExpertFfn);

    let q32 = QuantCase::<BlockQ8_0>::new(Op::ExpertFfn, shape, 3);
    let inputs = q32.inputs(&q32.exact.x);
    let mut out = vec![f32::NAN; 2816];
    let run = |out: &mut [f32], requested| {
        dispatch::run_quantized(
            &Registry::builtin(),
            &Backend::cpu(),
            function,
            &shape,
            &inputs,
            out,
            requested,
        )
    };
    let err = run(&mut out, Some(wide)).unwrap_err();
    assert_eq!(
        err,
        DispatchError::Requested {
            name: wide.into(),
            reason: Ineligible::QuantBlock {
                dtype: DType::Q8_0,
                spec: 64,
                wanted: 32
            }
        }
    );
    assert!(out.iter().all(|v| v.is_nan()), "refused before writing");
    let (choice, _) = run(&mut out, None).expect("a 32-value variant");
    assert_eq!(choice.kernel, "expert_ffn_blocked_quantized");
    let (_, why) = choice
        .passed_over
        .iter()
        .find(|(name, _)| name == wide)
        .expect("the 64-value spec is considered");
    assert!(why.contains("blocks of 64 values, not 32"), "{why}");
    assert!(out.iter().all(|v| v.is_finite()));

    let q64 = QuantCase::<BlockQ8<2>>::new(Op::ExpertFfn, shape, 3);
    let (choice, _) = dispatch::run_quantized(
        &Registry::builtin(),
        &Backend::cpu(),
        function,
        &shape,
        &q64.inputs(&q64.exact.x),
        &mut out,
        None,
    )
    .expect("the 64-value variant");
    assert_eq!(choice.kernel, wide);
    assert!(out.iter().all(|v| v.is_finite()));
}
