//! Each op's entry points, and the steps that dispatch them.

use super::sums::{SegCall, even};
use super::tensors::ld_store;
use super::{Emitter, Store, WgslError};
use moek_ir::plan::{BufferRole, Step, WORKGROUP};
use moek_ir::tensors::Optional;
use moek_ir::{DimName, Phase};
use std::fmt::Write;

impl Emitter<'_> {
    pub(super) fn entry(&mut self, name: &str, rows: usize, body: &str) {
        self.compute_fn(
            name,
            &format!("let row = wid.x + wid.y * nwg.x;\n    if (row >= {rows}u) {{ return; }}"),
            body,
        );
        self.steps.push(Step::Rows {
            entry: name.to_string(),
            rows: rows as u32,
        });
    }

    pub(super) fn elementwise(&mut self, name: &str, count: usize, body: &str) {
        self.compute_fn(
            name,
            &format!(
                "let i = (wid.x + wid.y * nwg.x) * WG + lid;\n    if (i >= {count}u) {{ return; }}"
            ),
            body,
        );
        self.steps.push(Step::Elems {
            entry: name.to_string(),
            count: count as u32,
        });
    }

    /// One entry point of `WG` threads over a 2-D grid of workgroups: `head` names the work item
    /// and returns past the last, `body` does the work.
    pub(super) fn compute_fn(&mut self, name: &str, head: &str, body: &str) {
        let _ = writeln!(
            self.entries,
            "@compute @workgroup_size(WG)\n\
             fn {name}(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(num_workgroups) nwg: vec3<u32>, \
             @builtin(local_invocation_index) lid: u32) {{\n    \
             {head}\n{body}}}\n"
        );
    }

    /// Gathered gate/up: one workgroup per (token, route, column) writes
    /// `gated(gate + bias, up + bias)` to `dst[t, r, j]` (biases where the spec has them).
    pub(super) fn gather_gate_up(&mut self, phase: Phase, dst: &str) {
        let s = self.s;
        let (f, h) = (s.f, s.h);
        let part = self.part("gate_up", "x");
        let segs = self.segments(phase, DimName::H, h);
        let red = self.reduce(
            &segs,
            &[
                SegCall::group(&part, [format!("e * {}u + j", 2 * f), format!("t * {h}u")]),
                SegCall::group(
                    &part,
                    [format!("e * {}u + {f}u + j", 2 * f), format!("t * {h}u")],
                ),
            ],
        );
        let cols = self.columns(DimName::F, f);
        let st = ld_store(dst);
        let (bg, bu) = match self.k.optional.has(Optional::GateUpBias) {
            true => (
                format!(" + ld_gate_up_bias_0(e * {}u + j)", 2 * f),
                format!(" + ld_gate_up_bias_0(e * {}u + {f}u + j)", 2 * f),
            ),
            false => (String::new(), String::new()),
        };
        for (b, &(j0, j1)) in cols.iter().enumerate() {
            let w = j1 - j0;
            let name = entry_name("gate_up", b, cols.len());
            let body = format!(
                "    // columns F [{j0}, {j1})\n    \
                 let j = {j0}u + row % {w}u;\n    \
                 let tr = row / {w}u;\n    \
                 let t = tr / {r}u;\n    \
                 let e = idx_0[tr];\n    \
                 var acc = vec2<f32>(0.0);\n{red}    \
                 if (lid == 0u) {{ {st}[tr * {f}u + j] = gated(acc.x{bg}, acc.y{bu}); }}\n",
                r = s.r,
            );
            self.entry(&name, s.t * s.r * w, &body);
        }
    }

    /// Gathered down with the K-axis combine: route owners write partial rows and a combine step
    /// adds them in route order; without owners each workgroup adds its routes in order.
    pub(super) fn gather_down(&mut self, phase: Phase) -> Result<(), WgslError> {
        let s = self.s;
        let (f, h, r) = (s.f, s.h, s.r);
        let part = self.part("down", "act");
        let segs = self.segments(phase, DimName::F, f);
        let cols = self.columns(DimName::H, h);
        let owners = self
            .k
            .cores_for(phase)
            .iter()
            .any(|sp| sp.dim == DimName::R);
        let term = SegCall::group(&part, [format!("e * {h}u + i"), format!("tr * {f}u")]);
        let red = self.reduce(&segs, &[term]);
        let bias = match self.k.optional.has(Optional::DownBias) {
            true => format!(" + ld_down_bias_0(e * {h}u + i)"),
            false => String::new(),
        };
        if owners {
            self.tensor("partial", BufferRole::Scratch, s.t * r * h, Store::F32, h)?;
            for (b, &(i0, i1)) in cols.iter().enumerate() {
                let w = i1 - i0;
                let name = entry_name("down_routes", b, cols.len());
                let body = format!(
                    "    // route owners; columns H [{i0}, {i1})\n    \
                     let i = {i0}u + row % {w}u;\n    \
                     let tr = row / {w}u;\n    \
                     let e = idx_0[tr];\n    \
                     var acc = 0.0;\n{red}    \
                     if (lid == 0u) {{ partial_0[tr * {h}u + i] = acc{bias}; }}\n"
                );
                self.entry(&name, s.t * r * w, &body);
            }
            let body = format!(
                "    // the K-axis combine, routes in order\n    \
                 let t = i / {h}u;\n    \
                 let c = i % {h}u;\n    \
                 var acc = 0.0;\n    \
                 for (var r = 0u; r < {r}u; r++) {{\n        \
                 acc += weights_0[t * {r}u + r] * partial_0[(t * {r}u + r) * {h}u + c];\n    \
                 }}\n    \
                 out_0[i] = acc;\n"
            );
            self.elementwise("combine", s.t * h, &body);
        } else {
            for (b, &(i0, i1)) in cols.iter().enumerate() {
                let w = i1 - i0;
                let name = entry_name("down", b, cols.len());
                let body = format!(
                    "    // columns H [{i0}, {i1}); routes added in order\n    \
                     let i = {i0}u + row % {w}u;\n    \
                     let t = row / {w}u;\n    \
                     var y = 0.0;\n    \
                     for (var r = 0u; r < {r}u; r++) {{\n    \
                     let tr = t * {r}u + r;\n    \
                     let e = idx_0[tr];\n    \
                     var acc = 0.0;\n{red}    \
                     y += weights_0[tr] * (acc{bias});\n    \
                     }}\n    \
                     if (lid == 0u) {{ out_0[t * {h}u + i] = y; }}\n"
                );
                self.entry(&name, s.t * w, &body);
            }
        }
        Ok(())
    }

    /// The persistent dense loop. The accumulator is filled once; a first step lists, per expert,
    /// the tokens whose route weight for it is not 0 (in token order, with the weight) and the
    /// workgroup counts of that expert's two steps. Each trip then dispatches those counts
    /// indirectly: gate/up and down for the expert's tokens only, one thread per output column
    /// (a sequential sum per segment), down adding `w[t, e] * y` to the accumulator. Tokens with
    /// weight 0 add exactly 0 and are skipped, as on the CPU.
    pub(super) fn dense_persistent(&mut self) -> Result<(), WgslError> {
        let s = self.s;
        let (t_n, f, h, r, e_n) = (s.t, s.f, s.h, s.r, s.e);
        self.tensor(
            "lists",
            BufferRole::Scratch,
            2 * e_n * t_n + e_n,
            Store::U32,
            t_n,
        )?;
        self.tensor("dispatch", BufferRole::Indirect, e_n * 6, Store::U32, 6)?;
        self.elementwise("fill", t_n * h, "    out_0[i] = 0.0;\n");
        let (gx, dx) = (
            f.div_ceil(WORKGROUP as usize),
            h.div_ceil(WORKGROUP as usize),
        );
        let lists = format!(
            "    // i is the expert: its tokens at lists[i * {t_n} + n], their weights after all lists\n    \
             var n = 0u;\n    \
             for (var t = 0u; t < {t_n}u; t++) {{\n        \
             var w = 0.0;\n        \
             for (var r = 0u; r < {r}u; r++) {{\n            \
             if (idx_0[t * {r}u + r] == i) {{ w += weights_0[t * {r}u + r]; }}\n        \
             }}\n        \
             if (w != 0.0) {{\n            \
             lists_0[i * {t_n}u + n] = t;\n            \
             lists_0[{et}u + i * {t_n}u + n] = bitcast<u32>(w);\n            \
             n += 1u;\n        \
             }}\n    \
             }}\n    \
             lists_0[{cnt}u + i] = n;\n    \
             let tiles = (n + TILE - 1u) / TILE;\n    \
             dispatch_0[i * 6u] = {gx}u; dispatch_0[i * 6u + 1u] = tiles; dispatch_0[i * 6u + 2u] = 1u;\n    \
             dispatch_0[i * 6u + 3u] = {dx}u; dispatch_0[i * 6u + 4u] = tiles; dispatch_0[i * 6u + 5u] = 1u;\n",
            et = e_n * t_n,
            cnt = 2 * e_n * t_n,
        );
        self.elementwise("route_lists", e_n, &lists);
        self.steps.push(Step::IndirectArgs("dispatch".to_string()));
        // A workgroup's tile: slots `wid.y * TILE ..` of the expert's list; slots past the end
        // repeat the last token and are not written.
        let tile = |row: usize| {
            format!(
                "    let e = params.trip;\n    \
             let n = lists_0[{cnt}u + e];\n    \
             let s0 = wid.y * TILE;\n    \
             for (var q = 0u; q < TILE; q++) {{\n        \
             tok[q] = lists_0[e * {t_n}u + min(s0 + q, n - 1u)] * {row}u;\n    \
             }}\n",
                cnt = 2 * e_n * t_n,
            )
        };
        let store = |what: &str| {
            format!(
                "    for (var q = 0u; q < TILE; q++) {{\n        \
                 if (s0 + q < n) {{\n            \
                 let t = lists_0[e * {t_n}u + s0 + q];\n            \
                 {what}\n        \
                 }}\n    \
                 }}\n"
            )
        };
        let segs = self.segments(Phase::GateUp, DimName::H, h);
        let dot = self.tile("gate_up", "x", even(&segs, h));
        let g = SegCall::tile(&dot, format!("e * {}u + j", 2 * f));
        let g = self.reduce_tile(&segs, &g, "g");
        let u = SegCall::tile(&dot, format!("e * {}u + {f}u + j", 2 * f));
        let u = self.reduce_tile(&segs, &u, "u");
        let gu = format!(
            "    let j = wid.x * WG + lid;\n    \
             if (j >= {f}u) {{ return; }}\n{}{g}{u}{}",
            tile(h),
            store(&format!("act_0[t * {f}u + j] = gated(g[q], u[q]);")),
        );
        let segs = self.segments(Phase::Down, DimName::F, f);
        let dot = self.tile("down", "act", even(&segs, f));
        let y = self.reduce_tile(&segs, &SegCall::tile(&dot, format!("e * {h}u + i")), "y");
        let dn = format!(
            "    let i = wid.x * WG + lid;\n    \
             if (i >= {h}u) {{ return; }}\n{}{y}{}",
            tile(f),
            store(&format!(
                "out_0[t * {h}u + i] += bitcast<f32>(lists_0[{et}u + e * {t_n}u + s0 + q]) * y[q];",
                et = e_n * t_n
            )),
        );
        self.indirect_entry("gate_up", &gu);
        self.indirect_entry("down", &dn);
        for e in 0..e_n as u64 {
            self.steps.push(Step::Trip(e as u32));
            for (entry, at) in [("gate_up", 0), ("down", 12)] {
                self.steps.push(Step::Indirect {
                    entry: entry.to_string(),
                    tensor: "dispatch".to_string(),
                    offset: e * 24 + at,
                });
            }
        }
        Ok(())
    }

    /// An entry point dispatched indirectly (its workgroup counts come from the device).
    pub(super) fn indirect_entry(&mut self, name: &str, body: &str) {
        let _ = writeln!(
            self.entries,
            "@compute @workgroup_size(WG)\n\
             fn {name}(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(local_invocation_index) lid: u32) {{\n{body}}}\n"
        );
    }

    /// The dense MLP: gate/up rows into `act`, then down rows.
    pub(super) fn dense_mlp(&mut self) -> Result<(), WgslError> {
        let s = self.s;
        let (f, h) = (s.f, s.h);
        let gate = self.part("gate", "x");
        let up = self.part("up", "x");
        let segs = self.segments(Phase::GateUp, DimName::H, h);
        let red = self.reduce(
            &segs,
            &[
                SegCall::group(&gate, ["j".to_string(), format!("t * {h}u")]),
                SegCall::group(&up, ["j".to_string(), format!("t * {h}u")]),
            ],
        );
        let body = format!(
            "    let j = row % {f}u;\n    \
             let t = row / {f}u;\n    \
             var acc = vec2<f32>(0.0);\n{red}    \
             if (lid == 0u) {{ act_0[t * {f}u + j] = gated(acc.x, acc.y); }}\n"
        );
        self.entry("gate_up", s.t * f, &body);
        let down = self.part("down", "act");
        let segs = self.segments(Phase::Down, DimName::F, f);
        let term = SegCall::group(&down, ["i".to_string(), format!("t * {f}u")]);
        let red = self.reduce(&segs, &[term]);
        let cols = self.columns(DimName::H, h);
        // The output gate: one thread per token adds x[t] . output_gate in order, then sigmoid.
        let scale = match self.k.optional.has(Optional::OutputGate) {
            true => {
                let gate = format!(
                    "    let t = i;\n    \
                     var z = 0.0;\n    \
                     for (var k = 0u; k < {h}u; k++) {{ z += ld_x_0(t * {h}u + k) * ld_output_gate_0(k); }}\n    \
                     scale_0[t] = 1.0 / (1.0 + exp(-z));\n"
                );
                self.tensor("scale", BufferRole::Scratch, s.t, Store::F32, 1)?;
                self.elementwise("output_gate", s.t, &gate);
                " * scale_0[t]"
            }
            false => "",
        };
        for (b, &(i0, i1)) in cols.iter().enumerate() {
            let w = i1 - i0;
            let body = format!(
                "    let i = {i0}u + row % {w}u;\n    \
                 let t = row / {w}u;\n    \
                 var acc = 0.0;\n{red}    \
                 if (lid == 0u) {{ out_0[t * {h}u + i] = acc{scale}; }}\n"
            );
            self.entry(&entry_name("down", b, cols.len()), s.t * w, &body);
        }
        Ok(())
    }

    /// The LM head on the final row: one workgroup per vocabulary row, then the softcap.
    pub(super) fn lm_head_row(&mut self) {
        let s = self.s;
        let h = s.h;
        let part = self.part("emb", "hidden");
        let segs = self.segments(Phase::All, DimName::H, h);
        let last = (s.t - 1) * h;
        let term = SegCall::group(&part, ["v".to_string(), format!("{last}u")]);
        let red = self.reduce(&segs, &[term]);
        let cols = self.columns(DimName::V, s.v);
        for (b, &(v0, v1)) in cols.iter().enumerate() {
            let body = format!(
                "    let v = {v0}u + row;\n    \
                 var acc = 0.0;\n{red}    \
                 if (lid == 0u) {{ out_0[v] = softcap(acc, params.softcap); }}\n"
            );
            self.entry(&entry_name("lm_head", b, cols.len()), v1 - v0, &body);
        }
    }
}

pub(super) fn entry_name(base: &str, block: usize, blocks: usize) -> String {
    if blocks == 1 {
        base.to_string()
    } else {
        format!("{base}_cols{block}")
    }
}
