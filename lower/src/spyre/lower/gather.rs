//! Gate/up and down over gathered routes (the decode variants).

use super::*;
use moek_ir::spyre::*;
use moek_ir::{DimName, Kernel, Phase};

/// Gate/up over gathered routes: per route, per F tile, per H block (in declared order) an
/// indexed load of the gate and up tiles, a matmul and an add; H partials split across cores are
/// completed over the ring; the epilogue writes `gelu_tanh(g) * u`.
pub(super) fn gate_up(k: &Kernel, s: &Sizes, phase: Phase, out: &str) -> Result<Stage, LowerError> {
    let div = Division::of(k, phase)?;
    let (tc, rc, fc) = (
        s.t / div.parts(DimName::T),
        s.r / div.parts(DimName::R),
        s.f / div.parts(DimName::F),
    );
    if tc > 1 {
        return Err(LowerError::NotYet(
            "gate/up over gathered routes with more than one token per core".into(),
        ));
    }
    let segs = segments(
        k.reduce_blocks(DimName::H),
        s.h,
        div.parts(DimName::H),
        "reduction",
    )?;
    let widest = segs.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let (t0, r0, f0, h0) = (
        div.start(DimName::T, s.t),
        div.start(DimName::R, s.r),
        div.start(DimName::F, s.f),
        div.start(DimName::H, s.h),
    );
    let mut plan = Plan::new(s.lx);
    let mut body = vec![];
    // Resident: this core's x, one buffer per H segment.
    let xs: Vec<String> = segs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| plan.buf(&format!("x{i}"), tc * (b - a), true))
        .collect();
    // Streamed: gate and up tiles (double-buffered as a pair), one partial, g/u accumulators, a.
    let fixed = plan.next + 4 * STICK_BYTES;
    let streamed = Streamed {
        phase,
        along: DimName::F,
        reduction: DimName::H,
        size: s.h,
        widest,
        blocks_shorten: true,
        per_reduction: 2 * DL16,
        per_column: 4 * F32 + F32,
    };
    let tile = tile_for(k, s.lx, fc, fixed, &streamed)?;
    let (wg, wu) = (
        plan.buf("w_gate", widest * tile, true),
        plan.buf("w_up", widest * tile, true),
    );
    let part = plan.buf("part", tile, false);
    let (g, u, a) = (
        plan.buf("g", tile, false),
        plan.buf("u", tile, false),
        plan.buf("a", tile, false),
    );
    for (x, &(a0, a1)) in xs.iter().zip(&segs) {
        let start = vec![t0.clone(), add(&h0, a0)];
        body.push(Instr::DmaIn {
            region: Region {
                tensor: "x".into(),
                start,
                extent: vec![tc, a1 - a0],
            },
            to: x.clone(),
        });
    }
    let h_split = div.parts(DimName::H) > 1;
    for ti in 0..tc {
        for ri in 0..rc {
            let slot = slot(&t0, &r0, ti, ri, s.r);
            let route = RouteRef {
                routes: "idx".into(),
                slot,
            };
            for &(c0, c1) in &tiles(&[(0, fc)], tile) {
                let n = c1 - c0;
                for (acc, w, bank) in [(&g, &wg, "gate"), (&u, &wu, "up")] {
                    body.push(Instr::Sfp(Sfp::Zero {
                        out: acc.clone(),
                        elems: n,
                    }));
                    for (x, &(a0, a1)) in xs.iter().zip(&segs) {
                        let start = vec![Affine::constant(0), add(&h0, a0), add(&f0, c0)];
                        let region = Region {
                            tensor: bank.into(),
                            start,
                            extent: vec![1, a1 - a0, n],
                        };
                        body.push(Instr::IndexedLoad {
                            region,
                            route: route.clone(),
                            to: w.clone(),
                        });
                        // x row `ti` of this segment is at offset ti * len: a 1-row matmul per token.
                        body.push(Instr::Matmul {
                            a_at: Affine::default(),
                            a: x.clone(),
                            b: w.clone(),
                            out: part.clone(),
                            m: 1,
                            k: a1 - a0,
                            n,
                            accumulate: false,
                        });
                        body.push(Instr::Sfp(Sfp::Add {
                            acc: acc.clone(),
                            part: part.clone(),
                            elems: n,
                        }));
                    }
                    if h_split {
                        body.push(Instr::RingReduce {
                            buffer: acc.clone(),
                            dim: "H".into(),
                            elems: n,
                        });
                    }
                }
                body.push(Instr::Sfp(Sfp::act_mul(
                    k.activation,
                    g.clone(),
                    u.clone(),
                    a.clone(),
                    n,
                )));
                let start = vec![add(&t0, ti), add(&r0, ri), add(&f0, c0)];
                let region = Region {
                    tensor: out.into(),
                    start,
                    extent: vec![1, 1, n],
                };
                body.push(Instr::DmaOut {
                    from: a.clone(),
                    region,
                    owner: owner(&div, &["H"]),
                });
            }
        }
    }
    let mut stage = plan.finish("gate_up", div, body)?;
    let blocked = k.reduce_blocks(DimName::H).is_some() || k.column_blocks(DimName::F).is_some();
    stage.selected_copy = selected_copy(s, 2, blocked);
    Ok(stage)
}

/// Down over gathered routes with the K-axis combine: per route, per column tile (column blocks in
/// order), per F block an indexed load, a matmul and an add; F partials split across cores are
/// completed over the ring; each route's result is scaled by its weight into the token's
/// accumulator in route order, completed over the ring when routes are split across cores.
pub(super) fn down(k: &Kernel, s: &Sizes, phase: Phase, act: &str) -> Result<Stage, LowerError> {
    let div = Division::of(k, phase)?;
    let (tc, rc, hc) = (
        s.t / div.parts(DimName::T),
        s.r / div.parts(DimName::R),
        s.h / div.parts(DimName::H),
    );
    if tc > 1 {
        return Err(LowerError::NotYet(
            "down over gathered routes with more than one token per core".into(),
        ));
    }
    let fsegs = segments(
        k.reduce_blocks(DimName::F),
        s.f,
        div.parts(DimName::F),
        "reduction",
    )?;
    let cols = segments(
        k.column_blocks(DimName::H),
        s.h,
        div.parts(DimName::H),
        "column",
    )?;
    let widest = fsegs.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let (t0, r0, h0, f0) = (
        div.start(DimName::T, s.t),
        div.start(DimName::R, s.r),
        div.start(DimName::H, s.h),
        div.start(DimName::F, s.f),
    );
    let mut plan = Plan::new(s.lx);
    let w = plan.buf("weights", tc * s.r, false);
    let acc = plan.buf("acc", tc * hc, false);
    let a_bufs: Vec<String> = fsegs
        .iter()
        .enumerate()
        .map(|(i, &(a, b))| plan.buf(&format!("a{i}"), b - a, true))
        .collect();
    let fixed = plan.next + 4 * STICK_BYTES;
    let streamed = Streamed {
        phase,
        along: DimName::H,
        reduction: DimName::F,
        size: s.f,
        widest,
        blocks_shorten: true,
        per_reduction: DL16,
        per_column: 2 * F32,
    };
    let widest_cols = cols.iter().map(|(a, b)| b - a).max().unwrap_or(0);
    let tile = tile_for(k, s.lx, widest_cols, fixed, &streamed)?;
    let wt = plan.buf("w_down", widest * tile, true);
    let part = plan.buf("part", tile, false);
    let y = plan.buf("y", tile, false);
    let mut body = vec![
        Instr::DmaIn {
            region: Region {
                tensor: "weights".into(),
                start: vec![t0.clone(), Affine::constant(0)],
                extent: vec![tc, s.r],
            },
            to: w.clone(),
        },
        Instr::Sfp(Sfp::Zero {
            out: acc.clone(),
            elems: tc * hc,
        }),
    ];
    for ri in 0..rc {
        let slot = slot(&t0, &r0, 0, ri, s.r);
        let route = RouteRef {
            routes: "idx".into(),
            slot,
        };
        for (a, &(a0, a1)) in a_bufs.iter().zip(&fsegs) {
            let start = vec![t0.clone(), add(&r0, ri), add(&f0, a0)];
            body.push(Instr::DmaIn {
                region: Region {
                    tensor: act.into(),
                    start,
                    extent: vec![1, 1, a1 - a0],
                },
                to: a.clone(),
            });
        }
        for &(c0, c1) in &tiles(&cols, tile) {
            let n = c1 - c0;
            body.push(Instr::Sfp(Sfp::Zero {
                out: y.clone(),
                elems: n,
            }));
            for (a, &(a0, a1)) in a_bufs.iter().zip(&fsegs) {
                let start = vec![Affine::constant(0), add(&f0, a0), add(&h0, c0)];
                let region = Region {
                    tensor: "down".into(),
                    start,
                    extent: vec![1, a1 - a0, n],
                };
                body.push(Instr::IndexedLoad {
                    region,
                    route: route.clone(),
                    to: wt.clone(),
                });
                body.push(Instr::Matmul {
                    a_at: Affine::default(),
                    a: a.clone(),
                    b: wt.clone(),
                    out: part.clone(),
                    m: 1,
                    k: a1 - a0,
                    n,
                    accumulate: false,
                });
                body.push(Instr::Sfp(Sfp::Add {
                    acc: y.clone(),
                    part: part.clone(),
                    elems: n,
                }));
            }
            if div.parts(DimName::F) > 1 {
                body.push(Instr::RingReduce {
                    buffer: y.clone(),
                    dim: "F".into(),
                    elems: n,
                });
            }
            // The weights buffer holds this core's tokens' routes: index it locally.
            let w_at = self::slot(&Affine::constant(0), &r0, 0, ri, s.r);
            body.push(Instr::Sfp(Sfp::ScaleAcc {
                acc: acc.clone(),
                acc_at: c0,
                y: y.clone(),
                y_at: 0,
                w: w.clone(),
                w_at,
                elems: n,
            }));
        }
    }
    if div.parts(DimName::R) > 1 {
        body.push(Instr::RingReduce {
            buffer: acc.clone(),
            dim: "R".into(),
            elems: tc * hc,
        });
    }
    let region = Region {
        tensor: "out".into(),
        start: vec![t0, h0],
        extent: vec![tc, hc],
    };
    body.push(Instr::DmaOut {
        from: acc,
        region,
        owner: owner(&div, &["R", "F"]),
    });
    let mut stage = plan.finish("down", div, body)?;
    let blocked = k.reduce_blocks(DimName::F).is_some() || k.column_blocks(DimName::H).is_some();
    stage.selected_copy = selected_copy(s, 1, blocked);
    Ok(stage)
}

/// Bytes the device's compiler copies for a gathered phase reading `banks` expert banks: every
/// selected entry's whole matrix (the selected-entry dim outermost), unless the phase's matrices
/// are blocked, whose blocks of the unchanged bank are read by route in place.
fn selected_copy(s: &Sizes, banks: usize, blocked: bool) -> u64 {
    if blocked {
        0
    } else {
        (banks * s.t * s.r * s.h * s.f * DL16) as u64
    }
}
