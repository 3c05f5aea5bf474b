//! Programs the hardware would refuse are refused before anything runs, each with an error that
//! names what is wrong and the numbers. The base program is the lowering of a small gather spec.

use moek_dsl::{check, parse};
use moek_ir::DType;
use moek_ir::spyre::*;
use moek_lower::spyre::lower;
use moek_spyre::{Data, Device, Invalid, Mode, SimError, ValidationError, simulate, validate};
use quote::quote;

fn base() -> Program {
    let specs = parse::parse_specs(quote! {
        pub small = expert_ffn {
            dims: T = 1, R = 2, E = 4, H = 128, F = 64;
            dtypes: bf16; targets: spyre;
            select: gather E by R;
            reduce: H = 64 x 2;
            cores(gate_up): R x H = 2 x 2;
            cores(down): R = 2;
        }
    })
    .unwrap();
    let k = check::check(&specs[0]).unwrap();
    let p = lower::program(&k, DType::Bf16).unwrap();
    validate(&p).expect("the base program is valid");
    p
}

/// The first op of `phase` matching `pick`.
fn op_mut(p: &mut Program, phase: usize, pick: impl Fn(&Instr) -> bool) -> &mut Instr {
    p.phases[phase]
        .body
        .iter_mut()
        .find(|o| pick(o))
        .expect("the base program has such an op")
}

fn refused(p: &Program) -> ValidationError {
    validate(p).expect_err("the program must be refused")
}

#[test]
fn more_than_32_cores() {
    let mut p = base();
    p.phases[0].slices = vec![("R".into(), 33)];
    p.phases[0].core_slice = (0..33).map(|c| vec![c]).collect();
    assert_eq!(
        refused(&p),
        ValidationError {
            phase: "gate_up".into(),
            op: None,
            core: None,
            kind: Invalid::TooManyCores { cores: 33, max: 32 }
        }
    );
}

#[test]
fn slices_that_do_not_cover_the_work() {
    let mut p = base();
    p.phases[0].core_slice.pop();
    assert_eq!(
        refused(&p).kind,
        Invalid::SliceCount {
            expected: 4,
            got: 3
        }
    );
}

#[test]
fn two_cores_on_one_slice() {
    let mut p = base();
    p.phases[0].core_slice[1] = p.phases[0].core_slice[0].clone();
    assert_eq!(refused(&p).kind, Invalid::SlicesOverlap { a: 0, b: 1 });
}

#[test]
fn a_slice_beyond_its_dim() {
    let mut p = base();
    p.phases[0].core_slice[3] = vec![1, 2];
    let err = refused(&p);
    assert_eq!(err.core, Some(3));
    assert!(matches!(
        err.kind,
        Invalid::SliceOutOfRange {
            coord: 2,
            parts: 2,
            ..
        }
    ));
}

#[test]
fn a_buffer_off_the_128_byte_grid() {
    let mut p = base();
    p.phases[0].buffers[1].addr += 64;
    assert!(matches!(refused(&p).kind, Invalid::Misaligned { addr, .. } if addr % 128 == 64));
}

#[test]
fn a_plan_over_the_lx_budget() {
    let mut p = base();
    p.lx_budget = 1024;
    assert!(matches!(
        refused(&p).kind,
        Invalid::OverBudget { budget: 1024, .. }
    ));
}

#[test]
fn live_buffers_that_overlap() {
    let mut p = base();
    let addr = p.phases[0].buffers[0].addr;
    p.phases[0].buffers[1].addr = addr;
    assert!(matches!(refused(&p).kind, Invalid::Overlap { .. }));
}

#[test]
fn a_buffer_used_outside_its_live_range() {
    let mut p = base();
    let name = match &p.phases[0].body[0] {
        Instr::DmaIn { to, .. } => to.clone(),
        other => panic!("the first op loads x: {other:?}"),
    };
    let b = p.phases[0]
        .buffers
        .iter_mut()
        .find(|b| b.name == name)
        .unwrap();
    b.live = (1, 5);
    let err = refused(&p);
    assert_eq!(err.op, Some(0));
    assert!(matches!(err.kind, Invalid::NotLive { from: 1, .. }));
}

#[test]
fn a_dma_that_is_not_whole_sticks() {
    let mut p = base();
    if let Instr::DmaIn { region, .. } = op_mut(&mut p, 0, |o| matches!(o, Instr::DmaIn { .. })) {
        region.extent[1] = 32;
    }
    assert!(matches!(
        refused(&p).kind,
        Invalid::NotWholeSticks {
            extent: 32,
            stick: 64,
            ..
        }
    ));
}

#[test]
fn a_dma_out_of_bounds_on_one_core() {
    let mut p = base();
    if let Instr::DmaIn { region, .. } = op_mut(&mut p, 0, |o| matches!(o, Instr::DmaIn { .. })) {
        region.start[1] = region.start[1].clone().plus("H", 64);
    }
    let err = refused(&p);
    assert_eq!(err.core, Some(1));
    assert!(matches!(
        err.kind,
        Invalid::OutOfBounds {
            end: 192,
            size: 128,
            ..
        }
    ));
}

#[test]
fn an_indexed_load_of_a_tensor_that_is_not_a_bank() {
    let mut p = base();
    if let Instr::IndexedLoad { region, .. } =
        op_mut(&mut p, 0, |o| matches!(o, Instr::IndexedLoad { .. }))
    {
        region.tensor = "act".into();
    }
    assert!(matches!(refused(&p).kind, Invalid::NotABank { .. }));
}

#[test]
fn a_route_slot_beyond_the_routes() {
    let mut p = base();
    if let Instr::IndexedLoad { route, .. } =
        op_mut(&mut p, 0, |o| matches!(o, Instr::IndexedLoad { .. }))
    {
        route.slot.constant += 7;
    }
    assert!(matches!(
        refused(&p).kind,
        Invalid::RouteSlot { slots: 2, .. }
    ));
}

#[test]
fn a_view_wider_than_256_mb() {
    // One core loads two rows of a tensor whose rows are 300 MB apart.
    let x = Tensor {
        name: "x".into(),
        role: DeviceRole::Input,
        shape: vec![2, 150_000_000],
        elem_bytes: 2,
        stick_elems: 64,
        base: 0,
    };
    let region = |rows| Region {
        tensor: "x".into(),
        start: vec![Affine::constant(0); 2],
        extent: vec![rows, 64],
    };
    let buffer = Buffer {
        name: "b".into(),
        addr: 0,
        bytes: 256,
        elems: 128,
        dl16: true,
        live: (0, 0),
    };
    let phase = |rows| Stage {
        name: "p".into(),
        slices: vec![],
        core_slice: vec![vec![]],
        divisions: vec![],
        buffers: vec![buffer.clone()],
        body: vec![Instr::DmaIn {
            region: region(rows),
            to: "b".into(),
        }],
        selected_copy: 0,
    };
    let program = |rows| Program {
        kernel: "k".into(),
        dtype: "bf16".into(),
        cores_used: 1,
        lx_budget: 1 << 20,
        tensors: vec![x.clone()],
        phases: vec![phase(rows)],
    };
    validate(&program(1)).expect("one row is a 128-byte view");
    assert!(
        matches!(refused(&program(2)).kind, Invalid::Span { bytes, limit: 268_435_456, .. } if bytes > 256 << 20)
    );
}

#[test]
fn a_matmul_operand_too_small() {
    let mut p = base();
    if let Instr::Matmul { k, .. } = op_mut(&mut p, 0, |o| matches!(o, Instr::Matmul { .. })) {
        *k *= 4;
    }
    assert!(matches!(refused(&p).kind, Invalid::Operand { .. }));
}

#[test]
fn a_ring_reduction_over_a_dim_not_split() {
    let mut p = base();
    if let Instr::RingReduce { dim, .. } =
        op_mut(&mut p, 0, |o| matches!(o, Instr::RingReduce { .. }))
    {
        *dim = "T".into();
    }
    assert!(matches!(refused(&p).kind, Invalid::NotSplit { .. }));
}

#[test]
fn a_loop_that_breaks_the_persistent_contract() {
    let mut p = base();
    let body = std::mem::take(&mut p.phases[1].body);
    let advancing = ["gate", "up", "down"]
        .map(|t| Advance {
            tensor: t.into(),
            per_trip: 1,
        })
        .to_vec();
    p.phases[1].body = vec![Instr::Loop {
        trips: 4,
        advancing,
        preheader: vec![],
        body,
        drain: vec![],
    }];
    let err = refused(&p);
    assert!(
        matches!(&err.kind, Invalid::Loop { why } if why.contains("exactly four")),
        "{err}"
    );
}

#[test]
fn a_route_outside_the_bank_fails_the_run() {
    let p = base();
    let mut dev = Device::default();
    for t in &p.tensors {
        let len: usize = t.shape.iter().product();
        if t.role == DeviceRole::Routes {
            dev.routes.insert(t.name.clone(), vec![9; len]);
        } else {
            dev.tensors
                .insert(t.name.clone(), Data::F32(vec![0.0; len]));
        }
    }
    let err = simulate(&p, Mode::F32, &mut dev).unwrap_err();
    assert!(
        matches!(
            err,
            SimError::Route {
                route: 9,
                experts: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_missing_tensor_fails_the_run() {
    let p = base();
    let err = simulate(&p, Mode::F32, &mut Device::default()).unwrap_err();
    assert!(matches!(err, SimError::Tensor { got: 0, .. }), "{err}");
}

#[test]
fn programs_load_from_their_json_and_bad_text_is_refused() {
    let p = base();
    let json = serde_json::to_string(&p).unwrap();
    assert_eq!(moek_spyre::load(&json).unwrap(), p);
    let err = moek_spyre::load("{\"kernel\": 3}").unwrap_err();
    assert!(err.to_string().starts_with("not a Spyre program"), "{err}");
    let mut bad = p.clone();
    bad.lx_budget = 1;
    let err = moek_spyre::load(&serde_json::to_string(&bad).unwrap()).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("invalid Spyre program: phase `gate_up`: LX peak"),
        "{err}"
    );
}

#[test]
fn a_tensor_too_large_to_count_is_refused_even_with_no_phase() {
    // The simulator multiplies every tensor's shape out before it runs any phase.
    let mut p = base();
    p.phases.clear();
    p.tensors[0].shape = vec![usize::MAX, 2];
    let e = refused(&p);
    assert_eq!(e.phase, "");
    assert!(matches!(e.kind, Invalid::TensorSize { .. }), "{e}");
    assert!(e.to_string().starts_with("the program's tensors: "), "{e}");
    let sim = simulate(&p, Mode::F32, &mut Device::default());
    assert!(matches!(sim, Err(SimError::Invalid(_))), "{sim:?}");
}
