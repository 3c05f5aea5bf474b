//! The persistent expert loop over a dense route matrix (the prefill).

use super::*;
use moek_ir::spyre::*;
use moek_ir::{DimName, Kernel, Phase};

/// The persistent expert loop (docs/spyre-program.md, "The persistent expert loop"): x staged once (preheader), the accumulator
/// filled once, a counted loop over experts whose body stays in LX with exactly four advancing
/// operands (gate, up, down, routing), one drain.
///
/// Every core is in three divisions at once: gate/up `T x H` (its x slice; the H partials are
/// completed over the ring), down `T x H` (its accumulator: tokens by output columns) and the token
/// groups. The down tokens of a core must lie inside its gate/up tokens, so the activation never
/// changes owner (no LX transfers are lowered yet). Per trip and F tile: gate and up tiles, two
/// matmuls, the ring, `gelu(g) * u`, the down tile and a matmul accumulating over F in order; then
/// each token's row is scaled by its routing stick into the accumulator.
pub(super) fn persistent(k: &Kernel, s: &Sizes) -> Result<Stage, LowerError> {
    let part = |phase, d: DimName| {
        k.cores_for(phase)
            .iter()
            .find(|x| x.dim == d)
            .map_or(1, |x| x.parts)
    };
    let (pt, ph) = (
        part(Phase::GateUp, DimName::T),
        part(Phase::GateUp, DimName::H),
    );
    let (pdt, pdh) = (part(Phase::Down, DimName::T), part(Phase::Down, DimName::H));
    let cores = pt * ph;
    let groups = k.schedule.groups.map_or(cores, |g| g.parts);
    let other = k
        .cores_for(Phase::GateUp)
        .iter()
        .chain(k.cores_for(Phase::Down))
        .any(|x| !matches!(x.dim, DimName::T | DimName::H) && x.parts > 1);
    if other || !k.schedule.reduce.is_empty() || !k.schedule.columns.is_empty() {
        return Err(LowerError::NotYet(
            "a persistent loop with splits other than T and H, or with blocks".into(),
        ));
    }
    if k.schedule.persistent.is_none() {
        return Err(LowerError::NotYet(
            "`select: dense E` without `loop: E persistent`".into(),
        ));
    }
    if pdt * pdh != cores || groups != cores || cores > CORES {
        return Err(LowerError::Refused(format!(
            "gate/up uses {pt} x {ph} cores, down {pdt} x {pdh}, groups {groups}: one persistent loop needs the same cores (at most {CORES}) in all three"
        )));
    }
    let (tg, hg, td, hd) = (s.t / pt, s.h / ph, s.t / pdt, s.h / pdh);
    // Core c: gate/up slice (c / ph, c % ph), down slice (c / pdh, c % pdh), group c; its down
    // tokens are sub-slice `sub` of its gate/up tokens.
    let per = td.max(1);
    let subs = (tg / per).max(1);
    let fits = (0..cores).all(|c| {
        let (g0, d0) = ((c / ph) * tg, (c / pdh) * td);
        d0 >= g0 && d0 + td <= g0 + tg
    });
    if !fits || tg % per != 0 {
        return Err(LowerError::NotYet(format!(
            "down token slices ({td} tokens) that are not inside the same core's gate/up token slice ({tg}): LX ownership transfers"
        )));
    }
    let slices: Vec<(String, usize)> = vec![
        ("T".into(), pt),
        ("H".into(), ph),
        ("Td".into(), pdt),
        ("Hd".into(), pdh),
        ("G".into(), groups),
        ("Tsub".into(), subs),
    ];
    let core_slice = (0..cores)
        .map(|c| {
            let (g0, d0) = ((c / ph) * tg, (c / pdh) * td);
            vec![c / ph, c % ph, c / pdh, c % pdh, c, (d0 - g0) / per]
        })
        .collect();
    let divisions = vec![
        vec!["T".to_string(), "H".to_string()],
        vec!["Td".to_string(), "Hd".to_string()],
        vec!["G".to_string()],
    ];
    let div = Division {
        slices,
        core_slice,
        divisions,
    };
    let lanes = STICK_BYTES / F32;
    let mut plan = Plan::new(s.lx);
    let x = plan.buf("x", tg * hg, true);
    let acc = plan.buf("acc", td * hd, false);
    let y = plan.buf("y", td * hd, false);
    let rw = plan.buf("routing", td * lanes, false);
    let fixed = plan.next + 8 * STICK_BYTES;
    let streamed = Streamed {
        phase: Phase::GateUp,
        along: DimName::F,
        reduction: DimName::H,
        size: s.h,
        widest: hg,
        blocks_shorten: false,
        per_reduction: 2 * DL16,
        per_column: 2 * tg * F32 + tg * DL16 + hd * DL16,
    };
    let tile = tile_for(k, s.lx, s.f, fixed, &streamed)?;
    let (wg, wu) = (
        plan.buf("w_gate", hg * tile, true),
        plan.buf("w_up", hg * tile, true),
    );
    let (g, u) = (
        plan.buf("g", tg * tile, false),
        plan.buf("u", tg * tile, false),
    );
    let a = plan.buf("a", tg * tile, true);
    let wd = plan.buf("w_down", tile * hd, true);
    let (t0, h0) = (Affine::of("T", tg), Affine::of("H", hg));
    let (d0, e0) = (Affine::of("Td", td), Affine::of("Hd", hd));
    let preheader = vec![
        Instr::DmaIn {
            region: Region {
                tensor: "x".into(),
                start: vec![t0, h0.clone()],
                extent: vec![tg, hg],
            },
            to: x.clone(),
        },
        Instr::Sfp(Sfp::Zero {
            out: acc.clone(),
            elems: td * hd,
        }),
    ];
    let zero = Affine::constant(0);
    let mut body = vec![
        Instr::Sfp(Sfp::Zero {
            out: y.clone(),
            elems: td * hd,
        }),
        Instr::DmaIn {
            region: Region {
                tensor: "routes".into(),
                start: vec![zero.clone(), d0.clone(), zero.clone()],
                extent: vec![1, td, lanes],
            },
            to: rw.clone(),
        },
    ];
    for (c0, c1) in tiles(&[(0, s.f)], tile) {
        let n = c1 - c0;
        for (bank, w, out) in [("gate", &wg, &g), ("up", &wu, &u)] {
            let region = Region {
                tensor: bank.into(),
                start: vec![zero.clone(), h0.clone(), Affine::constant(c0)],
                extent: vec![1, hg, n],
            };
            body.push(Instr::DmaIn {
                region,
                to: w.clone(),
            });
            body.push(Instr::Matmul {
                a: x.clone(),
                a_at: Affine::default(),
                b: w.clone(),
                out: out.clone(),
                m: tg,
                k: hg,
                n,
                accumulate: false,
            });
            if ph > 1 {
                body.push(Instr::RingReduce {
                    buffer: out.clone(),
                    dim: "H".into(),
                    elems: tg * n,
                });
            }
        }
        body.push(Instr::Sfp(Sfp::act_mul(
            k.activation,
            g.clone(),
            u.clone(),
            a.clone(),
            tg * n,
        )));
        let region = Region {
            tensor: "down".into(),
            start: vec![zero.clone(), Affine::constant(c0), e0.clone()],
            extent: vec![1, n, hd],
        };
        body.push(Instr::DmaIn {
            region,
            to: wd.clone(),
        });
        // This core's down tokens are rows `sub * td ..` of its gate/up activation tile.
        body.push(Instr::Matmul {
            a: a.clone(),
            a_at: Affine::of("Tsub", td * n),
            b: wd.clone(),
            out: y.clone(),
            m: td,
            k: n,
            n: hd,
            accumulate: true,
        });
    }
    for row in 0..td {
        body.push(Instr::Sfp(Sfp::ScaleAcc {
            acc: acc.clone(),
            acc_at: row * hd,
            y: y.clone(),
            y_at: row * hd,
            w: rw.clone(),
            w_at: Affine::constant(row * lanes),
            elems: hd,
        }));
    }
    let advancing = ["gate", "up", "down", "routes"]
        .map(|t| Advance {
            tensor: t.into(),
            per_trip: 1,
        })
        .to_vec();
    let drain = vec![Instr::DmaOut {
        from: acc,
        region: Region {
            tensor: "out".into(),
            start: vec![d0, e0],
            extent: vec![td, hd],
        },
        owner: vec![],
    }];
    let looped = Instr::Loop {
        trips: s.e,
        advancing,
        preheader,
        body,
        drain,
    };
    plan.finish("expert_loop", div, vec![looped])
}
