//! The CPU variant: a spec's schedule tables ([`Tables`]) bound to an op's inputs and run by
//! moek-cpu's generic skeletons. A generated variant is its spec's tables as a constant and a
//! call to [`run_gathered`] or [`run_gemm`]; an entry scheduled at run time
//! ([`crate::KernelEntry::scheduled`]) runs the same functions on tables built from its IR.

use crate::inputs::{AnyInputs, Inputs};
use moek_cpu::Weight;
use moek_cpu::skeleton::{self, Bank, Routes};
use moek_ir::Element;
use moek_ir::cpu::{Skeleton, Tables};
use moek_ir::reference::Shape;
use moek_ir::tensors::{
    ACT, DENSE_DOWN, DENSE_GATE, DENSE_UP, DOWN, EMB, GATE_UP, HIDDEN, IDX, Optional,
    ROUTE_WEIGHTS, X,
};
use moek_ir::{DType, Op};

/// Runs a schedule whose skeleton reads weights only through products
/// ([`Skeleton::reads_weights_apart`]): any stored weight `W` beside activations in `A`.
/// Returns the argmax for the LM head row.
pub fn run_gathered<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    inputs: &Inputs<'_, W, A>,
    out: &mut [f32],
) -> Option<u32> {
    t.check_shape(s);
    let i = *inputs;
    // The parallel loops are joined from a worker (see `moek_cpu::pool`).
    moek_cpu::on_pool(move || match (t.skeleton, i.op()) {
        (Skeleton::GateUp, Op::GateUp) => {
            skeleton::gate_up(t, s, i.act(&X), i.indices(&IDX), i.weight(&GATE_UP), out);
            None
        }
        (Skeleton::Down, Op::Down) => {
            let routes = Routes {
                idx: i.indices(&IDX),
                weights: i.f32s(&ROUTE_WEIGHTS),
            };
            skeleton::down(t, s, i.f32s(&ACT), routes, i.weight(&DOWN), out);
            None
        }
        (sk @ (Skeleton::Gathered | Skeleton::RouteOwned), Op::ExpertFfn) => {
            let (routes, bank) = expert_ffn(&i);
            match sk {
                Skeleton::RouteOwned => {
                    skeleton::route_owned_ffn(t, s, i.act(&X), routes, bank, out)
                }
                _ => skeleton::gathered_ffn(t, s, i.act(&X), routes, bank, out),
            }
            None
        }
        (Skeleton::LmHeadRow, Op::LmHeadRow) => Some(skeleton::lm_head_row(
            t,
            s,
            i.act(&HIDDEN),
            i.weight(&EMB),
            i.softcap(),
            out,
        )),
        (sk, op) => mismatch(t, sk, op),
    })
}

/// Runs a schedule whose skeleton multiplies GEMM operands ([`Weight::gemm_nt`]): plain weights
/// beside activations of their own type, or blocks beside f32 or bf16 activations.
pub fn run_gemm<W: Weight, A: Element>(
    t: &Tables,
    s: &Shape,
    inputs: &Inputs<'_, W, A>,
    out: &mut [f32],
) -> Option<u32> {
    t.check_shape(s);
    let i = *inputs;
    moek_cpu::on_pool(move || {
        match (t.skeleton, i.op()) {
            (sk @ (Skeleton::Grouped | Skeleton::Persistent), Op::ExpertFfn) => {
                let (routes, bank) = expert_ffn(&i);
                match sk {
                    Skeleton::Grouped => skeleton::grouped_ffn(t, s, i.act(&X), routes, bank, out),
                    _ => skeleton::persistent_ffn(t, s, i.act(&X), routes, bank, out),
                }
            }
            (Skeleton::DenseMlp, Op::DenseMlp) => {
                let weights = [DENSE_GATE, DENSE_UP, DENSE_DOWN].map(|row| i.weight(&row));
                let gate = i.optional_weight(Optional::OutputGate);
                skeleton::dense_mlp(t, s, i.act(&X), weights, gate, out)
            }
            (sk, op) => mismatch(t, sk, op),
        };
        None
    })
}

/// An expert FFN's routes and banks, its biases included.
fn expert_ffn<'a, W, A>(i: &Inputs<'a, W, A>) -> (Routes<'a>, Bank<'a, W>) {
    let routes = Routes {
        idx: i.indices(&IDX),
        weights: i.f32s(&ROUTE_WEIGHTS),
    };
    let bank = Bank {
        gate_up: i.weight(&GATE_UP),
        down: i.weight(&DOWN),
        bias: i.biases(),
    };
    (routes, bank)
}

fn mismatch(t: &Tables, sk: Skeleton, op: moek_ir::Op) -> ! {
    panic!(
        "kernel `{}` runs the {sk:?} skeleton and was given {op:?} inputs",
        t.name
    )
}

/// Runs tables built at run time on type-erased inputs: the dtype picks the instantiation, as
/// the compiled function table does for a generated variant. `None` when the inputs are not of
/// that dtype.
pub(crate) fn run_tables(
    t: &Tables,
    s: &Shape,
    inputs: &AnyInputs<'_, '_>,
    out: &mut [f32],
) -> Option<Option<u32>> {
    fn typed<W: Weight, A: Element>(
        t: &Tables,
        s: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Option<Option<u32>> {
        let typed = inputs.typed::<W, A>()?;
        Some(match t.skeleton.reads_weights_apart() {
            true => run_gathered(t, s, typed, out),
            false => run_gemm(t, s, typed, out),
        })
    }
    match inputs.storage.dtype {
        DType::F16 => typed::<half::f16, half::f16>(t, s, inputs, out),
        DType::Bf16 => typed::<half::bf16, half::bf16>(t, s, inputs, out),
        DType::F32 => typed::<f32, f32>(t, s, inputs, out),
        d => crate::with_block!(d, inputs.storage.values, |Q| match d.activation() {
            DType::Bf16 => typed::<Q, half::bf16>(t, s, inputs, out),
            _ => typed::<Q, f32>(t, s, inputs, out),
        }),
    }
}
