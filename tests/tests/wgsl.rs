//! Every wgpu program the emitter can produce parses and validates with naga (the WGSL front end
//! wgpu itself uses), without an adapter: both f16 paths, and bindings cut into chunks.
//! Running them is the generated `equivalence::wgpu_*` tests' job.

use moek_ir::plan::{BufferRole, DeviceCaps, Step};
use moek_ir::{DType, Target};
use moek_kernels::testing::{SMALL, shape_for};
use moek_kernels::{Registry, specs};
use moek_lower::wgsl;

fn validate(name: &str, source: &str) {
    let module = naga::front::wgsl::parse_str(source)
        .unwrap_or_else(|e| panic!("{name}: {}\n{source}", e.emit_to_string(source)));
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{name}: {e:?}\n{source}"));
}

#[test]
fn every_program_validates_in_both_f16_modes_and_when_chunked() {
    let mut checked = 0;
    for entry in Registry::builtin().entries() {
        let k = entry.ir();
        if !k.targets.contains(&Target::Wgpu) {
            continue;
        }
        let s = shape_for(k, &SMALL);
        for &dtype in &k.dtypes {
            // A limit a third of the largest weight forces three or four chunks on it.
            let whole = DeviceCaps {
                binding_limit: 1 << 27,
                f16: false,
            };
            let largest = wgsl::program(k, dtype, &s, &whole)
                .unwrap_or_else(|e| panic!("{}: {e}", k.name))
                .tensors
                .iter()
                .filter(|t| t.role == BufferRole::Weight)
                .map(|t| t.bytes() as u64)
                .max()
                .expect("every wgpu op reads weights");
            for binding_limit in [1 << 27, largest.div_ceil(3)] {
                for f16 in [false, true] {
                    let dev = DeviceCaps { binding_limit, f16 };
                    let p = match wgsl::program(k, dtype, &s, &dev) {
                        Ok(p) => p,
                        Err(e) => panic!("{}: {e}", k.name),
                    };
                    let name = format!("{} {dtype} f16={f16} limit={binding_limit}", k.name);
                    if binding_limit < 1 << 27 {
                        assert!(
                            p.tensors.iter().any(|t| t.chunks > 1),
                            "{name}: the low limit cuts a weight into chunks"
                        );
                    }
                    validate(&name, &p.source);
                    assert_eq!(
                        p.source.contains("enable f16;"),
                        f16 && dtype == DType::F16,
                        "{name}: `enable f16` only for native f16"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked >= 40, "only {checked} programs checked");
}

#[test]
fn weights_over_the_binding_limit_are_bound_in_whole_rows() {
    let k = specs::decode_expert_ffn_blocked::entry().ir().clone();
    let s = shape_for(&k, &SMALL);
    let dev = DeviceCaps {
        binding_limit: 128 << 20,
        f16: false,
    };
    let p = wgsl::program(&k, DType::Bf16, &s, &dev).expect("the blocked decode emits");
    let gate_up = p.tensors.iter().find(|t| t.name == "gate_up").unwrap();
    // [128, 1408, 2816] bf16 = 1.01 GB: 8 chunks of 16 expert banks, rows never split.
    assert_eq!(gate_up.chunks, 8, "{gate_up:?}");
    assert_eq!(gate_up.row_len, 2816);
    assert!(gate_up.chunk_bytes(0) <= dev.binding_limit);
    let down = p.tensors.iter().find(|t| t.name == "down").unwrap();
    assert_eq!(down.chunks, 4, "{down:?}");
    for t in p.tensors.iter().filter(|t| t.role == BufferRole::Weight) {
        let covered: usize = (0..t.chunks).map(|c| t.chunk(c).len()).sum();
        assert_eq!(covered, t.elems, "{} chunks cover it exactly", t.name);
    }
    validate("decode_expert_ffn_blocked", &p.source);
}

#[test]
fn the_schedule_shows_in_the_program() {
    let dev = DeviceCaps {
        binding_limit: 128 << 20,
        f16: false,
    };
    let k = specs::decode_expert_ffn_blocked::entry().ir().clone();
    let p = wgsl::program(&k, DType::Bf16, &shape_for(&k, &SMALL), &dev).unwrap();
    // Gate/up: four 704-term segments in order; down: three column blocks, route owners and the
    // K-axis combine on the device.
    assert!(
        p.source
            .contains("[0, 704) [704, 1408) [1408, 2112) [2112, 2816)")
    );
    let entries: Vec<&str> = p
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Rows { entry, .. } | Step::Elems { entry, .. } | Step::Indirect { entry, .. } => {
                Some(entry.as_str())
            }
            Step::Trip(_) | Step::IndirectArgs(_) => None,
        })
        .collect();
    assert_eq!(
        entries,
        [
            "gate_up",
            "down_routes_cols0",
            "down_routes_cols1",
            "down_routes_cols2",
            "combine"
        ]
    );
    // The persistent prefill: the accumulator filled once, then one trip per expert bank.
    let k = specs::prefill_expert_ffn_persistent::entry().ir().clone();
    let p = wgsl::program(&k, DType::Bf16, &shape_for(&k, &SMALL), &dev).unwrap();
    let trips = p
        .steps
        .iter()
        .filter(|s| matches!(s, Step::Trip(_)))
        .count();
    assert_eq!(trips, 128);
    assert!(matches!(&p.steps[0], Step::Elems { entry, .. } if entry == "fill"));
    // Gate/up's H split over 4 cores completes as 4 ordered partial sums.
    assert!(
        p.source
            .contains("[0, 704) [704, 1408) [1408, 2112) [2112, 2816)")
    );
}
