//! IR -> the wgpu variant: one WGSL compute program per spec and problem size, with the plan the
//! runtime needs to bind and run it (tensors, their chunks, the ordered steps).
//!
//! The program follows the schedule:
//! - one workgroup computes one output row (a dot product per output element, or the gate and up
//!   pair); its threads stride over the reduction and a workgroup tree sum completes each
//!   **segment**: the reduction blocks of the phase, cut further where a core split divides the
//!   reduction dim. Segments are added in declared order, as on the CPU and on Spyre;
//! - column blocks are separate entry points, dispatched in order;
//! - route owners (a core split of `R` in a down phase) write one partial row each, and a combine
//!   step adds the routes on the device in route order (the K-axis combine); without route owners
//!   one workgroup adds its routes in route order itself;
//! - the persistent loop is one step pair per expert bank: the trip number is copied into a
//!   uniform before each trip; the accumulator is filled once before the first trip.
//!
//! Other core splits (of `T`, `R` in gate/up, output columns) and token groups only say how work
//! is cut; on a GPU every output row is already its own workgroup, so they change no sum.
//!
//! Every dim is baked into the source. Tensors larger than the device's binding limit are bound
//! as several buffers of whole rows (`gate_up_0`, `gate_up_1`, ...): a row never straddles two.
//! 16-bit tensors are read as packed `u32` pairs (`unpack2x16float`; bf16 by shifting), or as
//! `array<f16>` under `enable f16;` when the device has `SHADER_F16`. Arithmetic is f32.

use moek_ir::plan::{DeviceCaps, DevicePlan, Role, Step, TensorPlan, WORKGROUP};
use moek_ir::reference::Shape;
use moek_ir::{Activation, DType, DimName, Kernel, Op, Phase, Selection};
use std::fmt::Write;

/// Tokens per workgroup in the persistent loop: each weight is loaded once per tile.
pub const TILE: u32 = 8;

/// Why a spec has no wgpu program for a problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WgslError {
    #[error("one row of `{tensor}` is {bytes} bytes, over the device's binding limit of {limit}")]
    RowTooLarge {
        tensor: String,
        bytes: u64,
        limit: u64,
    },
    #[error("`{tensor}` ({bytes} bytes) is bound whole and exceeds the binding limit of {limit}")]
    Whole {
        tensor: String,
        bytes: u64,
        limit: u64,
    },
    #[error("{what} has {n} elements; WGSL indices are 32-bit")]
    TooLarge { what: String, n: usize },
}

/// The program of `k` for `dtype` at shape `s` on `dev`.
pub fn program(
    k: &Kernel,
    dtype: DType,
    s: &Shape,
    dev: &DeviceCaps,
) -> Result<DevicePlan, WgslError> {
    let mut e = Emitter::new(k, dtype, *s, *dev);
    e.build()?;
    Ok(e.finish())
}

struct Emitter<'k> {
    k: &'k Kernel,
    dtype: DType,
    s: Shape,
    dev: DeviceCaps,
    tensors: Vec<TensorPlan>,
    steps: Vec<Step>,
    /// Helper functions (loads, partial dots), then entry points.
    helpers: String,
    entries: String,
    /// Partial-dot helpers already emitted, by name.
    parts: Vec<String>,
}

/// Reduction segments `(start, end)`, in order.
type Segs = Vec<(usize, usize)>;

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel, dtype: DType, s: Shape, dev: DeviceCaps) -> Self {
        Emitter {
            k,
            dtype,
            s,
            dev,
            tensors: vec![],
            steps: vec![],
            helpers: String::new(),
            entries: String::new(),
            parts: vec![],
        }
    }

    fn native_f16(&self) -> bool {
        self.dev.f16 && self.dtype == DType::F16
    }

    fn build(&mut self) -> Result<(), WgslError> {
        let (s, k) = (self.s, self.k);
        self.tensor("params", Role::Params, 4, 4, 4)?;
        match k.op {
            Op::GateUp => {
                self.inputs(&[("x", s.t * s.h, s.h, true), ("idx", s.t * s.r, 1, false)])?;
                self.weight("gate_up", s.e * 2 * s.f * s.h, s.h)?;
                self.tensor("out", Role::Output, s.t * s.r * s.f, 4, s.f)?;
                self.gather_gate_up(Phase::All, "out");
            }
            Op::Down => {
                self.tensor("act", Role::Input, s.t * s.r * s.f, 4, s.f)?;
                self.inputs(&[
                    ("idx", s.t * s.r, 1, false),
                    ("weights", s.t * s.r, 1, false),
                ])?;
                self.weight("down", s.e * s.h * s.f, s.f)?;
                self.tensor("out", Role::Output, s.t * s.h, 4, s.h)?;
                self.gather_down(Phase::All)?;
            }
            Op::ExpertFfn => {
                self.inputs(&[
                    ("x", s.t * s.h, s.h, true),
                    ("idx", s.t * s.r, 1, false),
                    ("weights", s.t * s.r, 1, false),
                ])?;
                self.weight("gate_up", s.e * 2 * s.f * s.h, s.h)?;
                self.weight("down", s.e * s.h * s.f, s.f)?;
                self.tensor("out", Role::Output, s.t * s.h, 4, s.h)?;
                if k.schedule.select == Selection::Dense {
                    self.tensor("act", Role::Scratch, s.t * s.f, 4, s.f)?;
                    self.dense_persistent()?;
                } else {
                    self.tensor("act", Role::Scratch, s.t * s.r * s.f, 4, s.f)?;
                    self.gather_gate_up(Phase::GateUp, "act");
                    self.gather_down(Phase::Down)?;
                }
            }
            Op::DenseMlp => {
                self.inputs(&[("x", s.t * s.h, s.h, true)])?;
                self.weight("gate", s.f * s.h, s.h)?;
                self.weight("up", s.f * s.h, s.h)?;
                self.weight("down", s.h * s.f, s.f)?;
                self.tensor("act", Role::Scratch, s.t * s.f, 4, s.f)?;
                self.tensor("out", Role::Output, s.t * s.h, 4, s.h)?;
                self.dense_mlp();
            }
            Op::LmHeadRow => {
                self.inputs(&[("hidden", s.t * s.h, s.h, true)])?;
                self.weight("emb", s.v * s.h, s.h)?;
                self.tensor("out", Role::Output, s.v, 4, 1)?;
                self.lm_head_row();
            }
        }
        Ok(())
    }

    /// Inputs: (name, elements, row length, in the weight dtype?) — else u32/f32 words.
    fn inputs(&mut self, list: &[(&str, usize, usize, bool)]) -> Result<(), WgslError> {
        for &(name, n, row, wdt) in list {
            let bytes = if wdt { self.dtype.bytes() } else { 4 };
            self.tensor(name, Role::Input, n, bytes, row)?;
        }
        Ok(())
    }

    fn weight(&mut self, name: &str, n: usize, row: usize) -> Result<(), WgslError> {
        self.tensor(name, Role::Weight, n, self.dtype.bytes(), row)
    }

    /// Plans `name` in whole rows per chunk under the binding limit, and emits its bindings and
    /// element loader `ld_NAME(i)` (global element index).
    fn tensor(
        &mut self,
        name: &str,
        role: Role,
        elems: usize,
        elem_bytes: usize,
        row_len: usize,
    ) -> Result<(), WgslError> {
        if elems >= u32::MAX as usize {
            return Err(WgslError::TooLarge {
                what: format!("tensor `{name}`"),
                n: elems,
            });
        }
        let row_len = row_len.max(1);
        let rows = elems.div_ceil(row_len).max(1);
        let row_bytes = (row_len * elem_bytes) as u64;
        // Words must not straddle chunks: 16-bit chunks hold an even number of elements.
        let step = if elem_bytes == 2 && row_len % 2 == 1 {
            2
        } else {
            1
        };
        let fit = (self.dev.binding_limit / row_bytes) as usize / step * step;
        if fit == 0 {
            return Err(WgslError::RowTooLarge {
                tensor: name.to_string(),
                bytes: row_bytes * step as u64,
                limit: self.dev.binding_limit,
            });
        }
        let chunk_rows = fit.min(rows);
        let chunks = rows.div_ceil(chunk_rows);
        // Only weights are read through chunk switches; the rest are bound whole.
        if chunks > 1 && role != Role::Weight {
            return Err(WgslError::Whole {
                tensor: name.to_string(),
                bytes: (elems * elem_bytes) as u64,
                limit: self.dev.binding_limit,
            });
        }
        let plan = TensorPlan {
            name: name.to_string(),
            role,
            elems,
            elem_bytes,
            row_len,
            chunk_rows,
            chunks,
        };
        self.tensors.push(plan);
        Ok(())
    }

    fn plan(&self, name: &str) -> &TensorPlan {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .expect("planned before use")
    }

    /// `var<...> NAME_c: array<...>;` per chunk and the loaders.
    fn declarations(&self) -> String {
        let mut out = String::new();
        let mut binding = 0;
        for t in &self.tensors {
            let elem = self.storage_elem(t);
            let access = match t.role {
                Role::Params => "uniform",
                Role::Input | Role::Weight => "storage, read",
                Role::Scratch | Role::Output | Role::Indirect => "storage, read_write",
            };
            for c in 0..t.chunks {
                let var = chunk_var(t, c);
                let ty = if t.role == Role::Params {
                    "Params".to_string()
                } else {
                    format!("array<{elem}>")
                };
                let _ = writeln!(
                    out,
                    "@group(0) @binding({binding}) var<{access}> {var}: {ty};"
                );
                binding += 1;
            }
        }
        out
    }

    /// The WGSL element type a tensor is declared with.
    fn storage_elem(&self, t: &TensorPlan) -> &'static str {
        match (t.elem_bytes, t.name.as_str()) {
            (2, _) if self.native_f16() => "f16",
            (2, _) => "u32",
            (_, "idx" | "lists" | "dispatch") => "u32",
            _ => "f32",
        }
    }

    /// `ld_NAME_c(i) -> f32` for chunk-local element `i`.
    fn loaders(&self) -> String {
        let mut out = String::new();
        for t in &self.tensors {
            if matches!(t.role, Role::Params | Role::Indirect)
                || matches!(t.name.as_str(), "idx" | "lists")
            {
                continue;
            }
            for c in 0..t.chunks {
                let var = chunk_var(t, c);
                let body = match (t.elem_bytes, self.storage_elem(t)) {
                    (2, "f16") => format!("return f32({var}[i]);"),
                    (2, _) if self.dtype == DType::Bf16 => format!(
                        "let w = {var}[i >> 1u];\n    \
                         return bitcast<f32>(select(w << 16u, w & 0xffff0000u, (i & 1u) == 1u));"
                    ),
                    (2, _) => format!("return unpack2x16float({var}[i >> 1u])[i & 1u];"),
                    _ => format!("return {var}[i];"),
                };
                let _ = writeln!(out, "fn ld_{var}(i: u32) -> f32 {{\n    {body}\n}}");
                // Elements i and i + 1, i even: one 32-bit load for 16-bit storage.
                let pair = match (t.elem_bytes, self.storage_elem(t)) {
                    (2, "f16") => format!("return vec2<f32>(f32({var}[i]), f32({var}[i + 1u]));"),
                    (2, _) if self.dtype == DType::Bf16 => format!(
                        "let w = {var}[i >> 1u];\n    \
                         return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));"
                    ),
                    (2, _) => format!("return unpack2x16float({var}[i >> 1u]);"),
                    _ => format!("return vec2<f32>({var}[i], {var}[i + 1u]);"),
                };
                let _ = writeln!(out, "fn ld2_{var}(i: u32) -> vec2<f32> {{\n    {pair}\n}}");
            }
        }
        out
    }

    /// A thread's partial sum over `[k0, k1)` of row `row` of weight `w` against `a` (a tensor
    /// of one chunk) starting at element `ab`: `part_W_A(row, ab, k0, k1, lid)`. Emitted once.
    fn part(&mut self, w: &str, a: &str) -> String {
        let name = format!("part_{w}_{a}");
        if self.parts.contains(&name) {
            return name;
        }
        self.parts.push(name.clone());
        let wp = self.plan(w).clone();
        let a_ld = format!("ld_{}", chunk_var(self.plan(a), 0));
        let len = wp.row_len;
        let f = chunked_fn(
            &name,
            &wp,
            "f32",
            "row: u32, ab: u32, k0: u32, k1: u32, lid: u32",
            "row, ab, k0, k1, lid",
            |ld| {
                format!(
                    "    var acc = 0.0;\n    \
                     let wb = row * {len}u;\n    \
                     for (var k = k0 + lid; k < k1; k += WG) {{\n        \
                     acc += {a_ld}(ab + k) * {ld}(wb + k);\n    \
                     }}\n    \
                     return acc;\n"
                )
            },
        );
        self.helpers.push_str(&f);
        name
    }

    /// One thread's sums over `[k0, k1)` of row `row` of weight `w` against the rows of `a` at
    /// the private `tok[q]` (a tile of [`TILE`] tokens), each in order: `tile_W_A(row, k0, k1)`.
    /// Each weight is loaded once for the tile. Emitted once.
    ///
    /// With `pairs` (every segment edge, row length and token row even) elements go two at a
    /// time, one 32-bit load each, still added one by one in order.
    fn tile(&mut self, w: &str, a: &str, pairs: bool) -> String {
        let name = format!("tile{}_{w}_{a}", if pairs { "2" } else { "" });
        if self.parts.contains(&name) {
            return name;
        }
        self.parts.push(name.clone());
        let wp = self.plan(w).clone();
        let a_var = chunk_var(self.plan(a), 0);
        let len = wp.row_len;
        let f = chunked_fn(
            &name,
            &wp,
            "array<f32, TILE>",
            "row: u32, k0: u32, k1: u32",
            "row, k0, k1",
            |ld| {
                let inner = if pairs {
                    format!(
                        "    for (var k = k0; k < k1; k += 2u) {{\n        \
                         let wk = {ld2}(wb + k);\n        \
                         for (var q = 0u; q < TILE; q++) {{\n            \
                         let xk = ld2_{a_var}(tok[q] + k);\n            \
                         acc[q] += xk.x * wk.x;\n            \
                         acc[q] += xk.y * wk.y;\n        \
                         }}\n    \
                         }}\n",
                        ld2 = ld.replacen("ld_", "ld2_", 1)
                    )
                } else {
                    format!(
                        "    for (var k = k0; k < k1; k++) {{\n        \
                         let wk = {ld}(wb + k);\n        \
                         for (var q = 0u; q < TILE; q++) {{ acc[q] += ld_{a_var}(tok[q] + k) * wk; }}\n    \
                         }}\n"
                    )
                };
                format!(
                    "    var acc: array<f32, TILE>;\n    \
                     let wb = row * {len}u;\n{inner}    \
                     return acc;\n"
                )
            },
        );
        self.helpers.push_str(&f);
        name
    }

    /// Ordered segments of reduction dim `dim` (size `n`) in `phase`: its reduction blocks, cut
    /// where a core split of `dim` divides it.
    fn segments(&self, phase: Phase, dim: DimName, n: usize) -> Segs {
        let mut cuts = vec![0, n];
        if let Some(b) = self.k.reduce_blocks(dim)
            && blocks_apply(self.k.op, phase, dim)
        {
            cuts.extend(b.ranges().into_iter().map(|r| r.0));
        }
        if let Some(sp) = self.k.cores_for(phase).iter().find(|sp| sp.dim == dim) {
            cuts.extend((0..sp.parts).map(|i| i * n / sp.parts));
        }
        cuts.sort_unstable();
        cuts.dedup();
        cuts.windows(2).map(|w| (w[0], w[1])).collect()
    }

    /// Column blocks `(start, end)` of output dim `dim` (size `n`), or one block.
    fn columns(&self, dim: DimName, n: usize) -> Segs {
        self.k
            .column_blocks(dim)
            .map_or_else(|| vec![(0, n)], |b| b.ranges())
    }

    /// Statements adding each segment's workgroup sum of `terms` (one per component) to `acc`.
    fn reduce(&self, segs: &Segs, terms: &[String]) -> String {
        let mut out = segments_comment(segs);
        for &(k0, k1) in segs {
            let args: Vec<String> = terms
                .iter()
                .map(|t| {
                    t.replace("K0", &format!("{k0}u"))
                        .replace("K1", &format!("{k1}u"))
                })
                .collect();
            if args.len() == 1 {
                let _ = writeln!(out, "    acc += wg_sum({}, lid);", args[0]);
            } else {
                let _ = writeln!(
                    out,
                    "    acc += wg_sum2(vec2<f32>({}, {}), lid);",
                    args[0], args[1]
                );
            }
        }
        out
    }

    /// `var NAME: array<f32, TILE>;` plus each segment's tile sums `term` added in order.
    fn reduce_tile(&self, segs: &Segs, term: &str, name: &str) -> String {
        let mut out = segments_comment(segs);
        let _ = writeln!(out, "    var {name}: array<f32, TILE>;");
        for &(k0, k1) in segs {
            let t = term
                .replace("K0", &format!("{k0}u"))
                .replace("K1", &format!("{k1}u"));
            let _ = writeln!(
                out,
                "    {{\n        let p = {t};\n        \
                 for (var q = 0u; q < TILE; q++) {{ {name}[q] += p[q]; }}\n    }}"
            );
        }
        out
    }

    fn entry(&mut self, name: &str, rows: usize, body: &str) {
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

    fn elementwise(&mut self, name: &str, count: usize, body: &str) {
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
    fn compute_fn(&mut self, name: &str, head: &str, body: &str) {
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
    /// `act(gate) * up` to `dst[t, r, j]`.
    fn gather_gate_up(&mut self, phase: Phase, dst: &str) {
        let s = self.s;
        let (f, h) = (s.f, s.h);
        let part = self.part("gate_up", "x");
        let segs = self.segments(phase, DimName::H, h);
        let red = self.reduce(
            &segs,
            &[
                format!("{part}(e * {}u + j, t * {h}u, K0, K1, lid)", 2 * f),
                format!("{part}(e * {}u + {f}u + j, t * {h}u, K0, K1, lid)", 2 * f),
            ],
        );
        let cols = self.columns(DimName::F, f);
        let st = ld_store(dst);
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
                 if (lid == 0u) {{ {st}[tr * {f}u + j] = {act}(acc.x) * acc.y; }}\n",
                r = s.r,
                act = self.k.activation,
            );
            self.entry(&name, s.t * s.r * w, &body);
        }
    }

    /// Gathered down with the K-axis combine: route owners write partial rows and a combine step
    /// adds them in route order; without owners each workgroup adds its routes in order.
    fn gather_down(&mut self, phase: Phase) -> Result<(), WgslError> {
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
        let term = format!("{part}(e * {h}u + i, tr * {f}u, K0, K1, lid)");
        let red = self.reduce(&segs, &[term]);
        if owners {
            self.tensor("partial", Role::Scratch, s.t * r * h, 4, h)?;
            for (b, &(i0, i1)) in cols.iter().enumerate() {
                let w = i1 - i0;
                let name = entry_name("down_routes", b, cols.len());
                let body = format!(
                    "    // route owners; columns H [{i0}, {i1})\n    \
                     let i = {i0}u + row % {w}u;\n    \
                     let tr = row / {w}u;\n    \
                     let e = idx_0[tr];\n    \
                     var acc = 0.0;\n{red}    \
                     if (lid == 0u) {{ partial_0[tr * {h}u + i] = acc; }}\n"
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
                     y += weights_0[tr] * acc;\n    \
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
    fn dense_persistent(&mut self) -> Result<(), WgslError> {
        let s = self.s;
        let (t_n, f, h, r, e_n) = (s.t, s.f, s.h, s.r, s.e);
        self.tensor("lists", Role::Scratch, 2 * e_n * t_n + e_n, 4, t_n)?;
        self.tensor("dispatch", Role::Indirect, e_n * 6, 4, 6)?;
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
        let tile = format!(
            "    let e = params.trip;\n    \
             let n = lists_0[{cnt}u + e];\n    \
             let s0 = wid.y * TILE;\n    \
             for (var q = 0u; q < TILE; q++) {{\n        \
             tok[q] = lists_0[e * {t_n}u + min(s0 + q, n - 1u)] * ROW;\n    \
             }}\n",
            cnt = 2 * e_n * t_n,
        );
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
        let g = self.reduce_tile(&segs, &format!("{dot}(e * {}u + j, K0, K1)", 2 * f), "g");
        let u = self.reduce_tile(
            &segs,
            &format!("{dot}(e * {}u + {f}u + j, K0, K1)", 2 * f),
            "u",
        );
        let gu = format!(
            "    let j = wid.x * WG + lid;\n    \
             if (j >= {f}u) {{ return; }}\n{}{g}{u}{}",
            tile.replace("ROW", &format!("{h}u")),
            store(&format!(
                "act_0[t * {f}u + j] = {}(g[q]) * u[q];",
                self.k.activation
            )),
        );
        let segs = self.segments(Phase::Down, DimName::F, f);
        let dot = self.tile("down", "act", even(&segs, f));
        let y = self.reduce_tile(&segs, &format!("{dot}(e * {h}u + i, K0, K1)"), "y");
        let dn = format!(
            "    let i = wid.x * WG + lid;\n    \
             if (i >= {h}u) {{ return; }}\n{}{y}{}",
            tile.replace("ROW", &format!("{f}u")),
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
    fn indirect_entry(&mut self, name: &str, body: &str) {
        let _ = writeln!(
            self.entries,
            "@compute @workgroup_size(WG)\n\
             fn {name}(@builtin(workgroup_id) wid: vec3<u32>, \
             @builtin(local_invocation_index) lid: u32) {{\n{body}}}\n"
        );
    }

    /// The dense MLP: gate/up rows into `act`, then down rows.
    fn dense_mlp(&mut self) {
        let s = self.s;
        let (f, h) = (s.f, s.h);
        let gate = self.part("gate", "x");
        let up = self.part("up", "x");
        let segs = self.segments(Phase::GateUp, DimName::H, h);
        let red = self.reduce(
            &segs,
            &[
                format!("{gate}(j, t * {h}u, K0, K1, lid)"),
                format!("{up}(j, t * {h}u, K0, K1, lid)"),
            ],
        );
        let act = self.k.activation;
        let body = format!(
            "    let j = row % {f}u;\n    \
             let t = row / {f}u;\n    \
             var acc = vec2<f32>(0.0);\n{red}    \
             if (lid == 0u) {{ act_0[t * {f}u + j] = {act}(acc.x) * acc.y; }}\n"
        );
        self.entry("gate_up", s.t * f, &body);
        let down = self.part("down", "act");
        let segs = self.segments(Phase::Down, DimName::F, f);
        let red = self.reduce(&segs, &[format!("{down}(i, t * {f}u, K0, K1, lid)")]);
        let cols = self.columns(DimName::H, h);
        for (b, &(i0, i1)) in cols.iter().enumerate() {
            let w = i1 - i0;
            let body = format!(
                "    let i = {i0}u + row % {w}u;\n    \
                 let t = row / {w}u;\n    \
                 var acc = 0.0;\n{red}    \
                 if (lid == 0u) {{ out_0[t * {h}u + i] = acc; }}\n"
            );
            self.entry(&entry_name("down", b, cols.len()), s.t * w, &body);
        }
    }

    /// The LM head on the final row: one workgroup per vocabulary row, then the softcap.
    fn lm_head_row(&mut self) {
        let s = self.s;
        let h = s.h;
        let part = self.part("emb", "hidden");
        let segs = self.segments(Phase::All, DimName::H, h);
        let last = (s.t - 1) * h;
        let red = self.reduce(&segs, &[format!("{part}(v, {last}u, K0, K1, lid)")]);
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

    fn finish(self) -> DevicePlan {
        let k = self.k;
        let s = self.s;
        let dims: Vec<String> =
            k.op.dims()
                .iter()
                .map(|d| format!("{d}={}", s.dim(*d)))
                .collect();
        let mode = match (self.dtype, self.native_f16()) {
            (DType::F32, _) => "f32 loads",
            (_, true) => "f16 loads (enable f16)",
            (DType::Bf16, _) => "bf16 from packed u32 pairs",
            (DType::F16, _) => "f16 from packed u32 pairs (unpack2x16float)",
        };
        let mut src = String::new();
        let _ = writeln!(
            src,
            "// moek: `{}` ({}, {}), {}; f32 arithmetic.\n// schedule: {}",
            k.name,
            k.op,
            self.dtype,
            mode,
            k.schedule_summary()
        );
        let _ = writeln!(src, "// sizes: {}", dims.join(" "));
        if self.native_f16() {
            src.push_str("enable f16;\n");
        }
        let _ = writeln!(
            src,
            "\nconst WG: u32 = {WORKGROUP}u;\nconst TILE: u32 = {TILE}u;\n"
        );
        src.push_str(PARAMS);
        src.push_str(activation(self.k.activation));
        src.push_str(SOFTCAP);
        src.push_str(&workgroup_sum("wg_sum", "red1", "f32"));
        src.push_str(&workgroup_sum("wg_sum2", "red2", "vec2<f32>"));
        src.push_str(&self.declarations());
        src.push('\n');
        src.push_str(&self.loaders());
        src.push_str(&self.helpers);
        src.push('\n');
        src.push_str(&self.entries);
        DevicePlan {
            source: src,
            tensors: self.tensors,
            steps: self.steps,
        }
    }
}

/// `NAME_c` per chunk of `w`, with the body `body(loader of that chunk)`, and `NAME`, which picks
/// the chunk holding `row`: rows never straddle chunks, so inner loops have no switch.
fn chunked_fn(
    name: &str,
    w: &TensorPlan,
    ret: &str,
    params: &str,
    args: &str,
    body: impl Fn(&str) -> String,
) -> String {
    let mut f = String::new();
    for c in 0..w.chunks {
        let ld = format!("ld_{}", chunk_var(w, c));
        let _ = writeln!(f, "fn {name}_{c}({params}) -> {ret} {{\n{}}}", body(&ld));
    }
    let _ = writeln!(f, "fn {name}({params}) -> {ret} {{");
    if w.chunks == 1 {
        let _ = writeln!(f, "    return {name}_0({args});\n}}");
    } else {
        let per = w.chunk_rows;
        let local = args.replacen("row", "r", 1);
        let _ = writeln!(f, "    let r = row % {per}u;\n    switch (row / {per}u) {{");
        for c in 0..w.chunks {
            let label = if c + 1 == w.chunks {
                "default".to_string()
            } else {
                format!("case {c}u")
            };
            let _ = writeln!(f, "        {label}: {{ return {name}_{c}({local}); }}");
        }
        let _ = writeln!(f, "    }}\n}}");
    }
    f
}

/// A workgroup tree sum `NAME(v, lid)` of `ty` over workgroup buffer `buf`; every thread gets the
/// total.
fn workgroup_sum(name: &str, buf: &str, ty: &str) -> String {
    format!(
        "var<workgroup> {buf}: array<{ty}, WG>;\n\n\
         fn {name}(v: {ty}, lid: u32) -> {ty} {{\n    \
         {buf}[lid] = v;\n    \
         workgroupBarrier();\n    \
         for (var s = WG / 2u; s > 0u; s >>= 1u) {{\n        \
         if (lid < s) {{ {buf}[lid] += {buf}[lid + s]; }}\n        \
         workgroupBarrier();\n    \
         }}\n    \
         let total = {buf}[0];\n    \
         workgroupBarrier();\n    \
         return total;\n\
         }}\n\n"
    )
}

/// Shared by every program: the params block and the token tile.
const PARAMS: &str = "struct Params { trip: u32, softcap: f32, pad0: u32, pad1: u32 }

var<private> tok: array<u32, TILE>;

";

/// The activation's WGSL function, named as in specs.
fn activation(act: Activation) -> &'static str {
    match act {
        Activation::GeluTanh => "// tanh's argument is clamped: some drivers' tanh overflows to NaN for large inputs, and
// tanh(15) is 1 in f32.
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(clamp(u, -15.0, 15.0)));
}

",
        // exp(-x) overflows to inf below -88, where x / inf is -0, the limit.
        Activation::Silu => "fn silu(x: f32) -> f32 {
    return x / (1.0 + exp(-x));
}

",
    }
}

const SOFTCAP: &str = "fn softcap(x: f32, cap: f32) -> f32 {
    return cap * tanh(clamp(x / cap, -15.0, 15.0));
}

";

/// `// segments, added in order: [0, 704) [704, 1408) ...`
fn segments_comment(segs: &Segs) -> String {
    let list: Vec<String> = segs.iter().map(|(a, b)| format!("[{a}, {b})")).collect();
    format!("    // segments, added in order: {}\n", list.join(" "))
}

/// Whether a reduction over `segs` of rows of length `len` can go two elements at a time.
fn even(segs: &Segs, len: usize) -> bool {
    len.is_multiple_of(2)
        && segs
            .iter()
            .all(|&(a, b)| a.is_multiple_of(2) && b.is_multiple_of(2))
}

/// Whether reduction blocks declared on `dim` apply to `phase` of `op`.
fn blocks_apply(op: Op, phase: Phase, dim: DimName) -> bool {
    !op.has_phases() || phase == Phase::All || op.reduction_dims(phase).contains(&dim)
}

fn chunk_var(t: &TensorPlan, c: usize) -> String {
    if t.role == Role::Params {
        t.name.clone()
    } else {
        format!("{}_{c}", t.name)
    }
}

/// The store target of a one-chunk f32 tensor.
fn ld_store(name: &str) -> String {
    format!("{name}_0")
}

fn entry_name(base: &str, block: usize, blocks: usize) -> String {
    if blocks == 1 {
        base.to_string()
    } else {
        format!("{base}_cols{block}")
    }
}
