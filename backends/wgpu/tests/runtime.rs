//! The runtime alone, with no kernel: a hand-written plan (an input bound as two chunks of whole
//! rows, a trip number copied into the params before a dispatch, one workgroup per row) runs on
//! the adapter present (lavapipe where there is no GPU) and reads back what the program wrote.

use moek_ir::plan::{BufferRole, DevicePlan, Step, TensorPlan};
use moek_wgpu::{Gpu, GpuError, GpuTensor};

/// `out[r][i] = 2 x[r][i] + trip` over four rows of four, rows 0-1 in `x_0`, 2-3 in `x_1`.
const SOURCE: &str = "struct Params { trip: u32, softcap: f32, pad0: u32, pad1: u32 }
@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x_0: array<f32>;
@group(0) @binding(2) var<storage, read> x_1: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) i: u32) {
    let row = wg.x;
    if (i < 4u) {
        var v: f32;
        if (row < 2u) { v = x_0[row * 4u + i]; } else { v = x_1[(row - 2u) * 4u + i]; }
        out[row * 4u + i] = 2.0 * v + f32(params.trip);
    }
}
";

fn tensor(name: &str, role: BufferRole, elems: usize, chunk_rows: usize) -> TensorPlan {
    TensorPlan {
        name: name.into(),
        role,
        elems,
        elem_bytes: 4,
        values_per_elem: 1,
        integer: role == BufferRole::Params,
        row_len: 4,
        chunk_rows,
        chunks: elems.div_ceil(4 * chunk_rows),
    }
}

fn plan(source: &str) -> DevicePlan {
    DevicePlan {
        source: source.into(),
        tensors: vec![
            tensor("params", BufferRole::Params, 4, 1),
            tensor("x", BufferRole::Input, 16, 2),
            tensor("out", BufferRole::Output, 16, 4),
        ],
        steps: vec![
            Step::Trip(3),
            Step::Rows {
                entry: "rows".into(),
                rows: 4,
            },
        ],
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn a_plan_runs_over_chunked_tensors_with_its_trip() {
    let gpu = Gpu::shared().expect("an adapter (lavapipe where there is no GPU)");
    let plan = plan(SOURCE);
    assert_eq!(
        plan.tensors[1].chunks, 2,
        "the input is bound as two chunks"
    );
    let p = gpu
        .program("runtime-test", || Ok::<_, ()>(plan.clone()))
        .unwrap()
        .expect("the program compiles");
    let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.5 - 3.0).collect();
    let x_dev = GpuTensor::upload(gpu, &plan.tensors[1], &bytes(&x));
    // The output starts poisoned: an element the program fails to write stays NaN.
    let out_dev = GpuTensor::upload(gpu, &plan.tensors[2], &bytes(&[f32::NAN; 16]));
    let got = gpu
        .run(&p, &[&x_dev, &out_dev], 0.0)
        .expect("the run succeeds");
    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 3.0).collect();
    assert_eq!(got[..16], want[..]);
}

#[test]
fn a_program_the_device_refuses_is_an_error_not_a_panic() {
    let gpu = Gpu::shared().expect("an adapter (lavapipe where there is no GPU)");
    let broken = plan(&SOURCE.replace("2.0 * v", "2.0 * undefined_name"));
    let Err(err) = gpu
        .program("runtime-test-broken", || Ok::<_, ()>(broken))
        .unwrap()
    else {
        panic!("an invalid shader is refused");
    };
    assert!(matches!(err, GpuError::Validation { .. }), "{err}");
}
