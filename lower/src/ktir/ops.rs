//! One phase's instructions as KTIR ops: the core's slice coordinates, each LX buffer as the SSA
//! value it holds now, and the rendering of each instruction.

use super::text::{access_tile, boxed, identity, rows_then_last, tensor};
use super::{KtirError, Renderer, elem, matmul_lefts};
use moek_ir::spyre::{Advance, Affine, Instr, Region, RouteRef, Sfp, Stage};
use std::collections::{HashMap, HashSet};

/// An LX buffer's current value: its SSA name, its 2-D shape and element type.
#[derive(Clone, Debug)]
struct Val {
    ssa: String,
    shape: Vec<usize>,
    dt: &'static str,
}

/// One step of a body: an instruction, or a run of per-row weighted adds fused into one op.
enum Step<'a> {
    One(&'a Instr),
    /// `acc[r, :] += w[r * lanes] * y[r, :]` for `r < rows`: the same per-element sums as the
    /// run of `ScaleAcc`s it stands for, in one op, so the interpreter's LX holds one value where
    /// a chain of slices would hold many.
    ScaleRows {
        acc: &'a str,
        y: &'a str,
        w: &'a str,
        rows: usize,
        lanes: usize,
    },
}

pub(super) struct Phase<'r, 'p> {
    r: &'r mut Renderer<'p>,
    stage: &'p Stage,
    coord: HashMap<String, String>,
    vals: HashMap<String, Val>,
    lefts: HashSet<String>,
    /// Row width of a buffer that no instruction shapes on arrival (a zeroed accumulator).
    widths: HashMap<String, usize>,
}

impl<'r, 'p> Phase<'r, 'p> {
    /// The phase's slice coordinates, each `(core / a) % b`.
    pub(super) fn new(r: &'r mut Renderer<'p>, stage: &'p Stage) -> Result<Self, KtirError> {
        let cores = stage.core_slice.len();
        r.t.line(format!(
            "// phase {}: {cores} cores, slices {:?}",
            stage.name, stage.slices
        ));
        let mut coord = HashMap::new();
        for (i, (dim, parts)) in stage.slices.iter().enumerate() {
            let fits = |a: usize| (0..cores).all(|c| stage.core_slice[c][i] == (c / a) % parts);
            let a = (1..=cores)
                .find(|&a| fits(a))
                .ok_or_else(|| KtirError::CoreMap {
                    phase: stage.name.clone(),
                    dim: dim.clone(),
                })?;
            let (ca, cb) = (r.t.index(a), r.t.index(*parts));
            let q = r.t.def("q", format!("arith.divui %core, {ca} : index"));
            let s =
                r.t.def(&format!("{dim}_"), format!("arith.remui {q}, {cb} : index"));
            coord.insert(dim.clone(), s);
        }
        Ok(Phase {
            r,
            stage,
            coord,
            vals: HashMap::new(),
            lefts: matmul_lefts(&stage.body),
            widths: widths_of(&stage.body),
        })
    }

    pub(super) fn render(&mut self, body: &'p [Instr]) -> Result<(), KtirError> {
        for step in steps(body) {
            self.step(step, &HashMap::new())?;
        }
        Ok(())
    }

    fn val(&self, buffer: &str) -> Result<Val, KtirError> {
        self.vals
            .get(buffer)
            .cloned()
            .ok_or_else(|| KtirError::Unwritten(buffer.to_string()))
    }

    fn dl16(&self, buffer: &str) -> bool {
        self.stage
            .buffers
            .iter()
            .any(|b| b.name == buffer && b.dl16)
    }

    /// `a` for this core (plus `extra`, a trip's offset).
    fn affine(&mut self, a: &Affine, extra: Option<&String>) -> String {
        let mut acc: Option<String> = extra.cloned();
        for (dim, coeff) in &a.terms {
            let Some(s) = self.coord.get(dim).cloned() else {
                continue;
            };
            let c = self.r.t.index(*coeff);
            let m = self.r.t.def("a", format!("arith.muli {s}, {c} : index"));
            acc = Some(match acc {
                None => m,
                Some(p) => self.r.t.def("a", format!("arith.addi {p}, {m} : index")),
            });
        }
        match (acc, a.constant) {
            (None, c) => self.r.t.index(c),
            (Some(v), 0) => v,
            (Some(v), c) => {
                let c = self.r.t.index(c);
                self.r.t.def("a", format!("arith.addi {v}, {c} : index"))
            }
        }
    }

    /// A zeroed `shape` of f32 (`tensor.empty` is undefined in MLIR, so always filled).
    fn zeros(&mut self, shape: &[usize]) -> String {
        let ty = tensor(shape, "f32");
        let e = self.r.t.def("e", format!("tensor.empty() : {ty}"));
        self.r.t.def(
            "z",
            format!("linalg.fill ins(%zf : f32) outs({e} : {ty}) -> {ty}"),
        )
    }

    /// `value` with the buffer's DL16 rounding (through f16) when the buffer is a DL16 one.
    fn rounded(&mut self, v: String, shape: &[usize], buffer: &str) -> String {
        if !self.dl16(buffer) {
            return v;
        }
        let (f32t, f16t) = (tensor(shape, "f32"), tensor(shape, "f16"));
        let h = self
            .r
            .t
            .def("h", format!("arith.truncf {v} : {f32t} to {f16t}"));
        self.r
            .t
            .def("h", format!("arith.extf {h} : {f16t} to {f32t}"))
    }

    /// `elems` values of `buffer` from `offset` as a rectangle of its 2-D value.
    fn slice(
        &mut self,
        buffer: &str,
        offset: usize,
        elems: usize,
    ) -> Result<(String, Vec<usize>), KtirError> {
        let v = self.val(buffer)?;
        let w = v.shape[1];
        if offset == 0 && elems == v.shape[0] * w {
            return Ok((v.ssa, v.shape));
        }
        let (at, shape) = if offset.is_multiple_of(w) && elems.is_multiple_of(w) {
            ([offset / w, 0], vec![elems / w, w])
        } else if offset / w == (offset + elems - 1) / w {
            ([offset / w, offset % w], vec![1, elems])
        } else {
            return Err(KtirError::NotRectangular {
                buffer: buffer.to_string(),
                offset,
                elems,
                shape: v.shape,
            });
        };
        let s = self.r.t.def(
            "sl",
            format!(
                "tensor.extract_slice {}[{}, {}] [{}, {}] [1, 1] : {} to {}",
                v.ssa,
                at[0],
                at[1],
                shape[0],
                shape[1],
                tensor(&v.shape, v.dt),
                tensor(&shape, v.dt)
            ),
        );
        Ok((s, shape))
    }

    fn step(&mut self, step: Step<'p>, adv: &HashMap<String, String>) -> Result<(), KtirError> {
        let i = match step {
            Step::ScaleRows {
                acc,
                y,
                w,
                rows,
                lanes,
            } => return self.scale_rows(acc, y, w, rows, lanes),
            Step::One(i) => i,
        };
        match i {
            Instr::DmaIn { region, to } => self.load(region, to, adv, None),
            Instr::IndexedLoad { region, route, to } => self.load(region, to, adv, Some(route)),
            Instr::DmaOut {
                from,
                region,
                owner,
            } => self.store(from, region, owner),
            Instr::Matmul {
                a,
                a_at,
                b,
                out,
                m,
                k,
                n,
                accumulate,
            } => self.matmul(a, a_at, b, out, [*m, *k, *n], *accumulate),
            Instr::Sfp(s) => self.sfp(s),
            Instr::RingReduce { buffer, dim, .. } => self.ring(buffer, dim),
            Instr::Loop {
                trips,
                advancing,
                preheader,
                body,
                drain,
            } => self.looped(*trips, advancing, preheader, body, drain),
        }
    }

    /// A DMA into LX, or a gather by route (an indirect access tile: the bank read in place).
    fn load(
        &mut self,
        region: &Region,
        to: &str,
        adv: &HashMap<String, String>,
        route: Option<&RouteRef>,
    ) -> Result<(), KtirError> {
        let t = self.r.tensor(&region.tensor)?.clone();
        let (dt, ext) = (elem(&t), &region.extent);
        if ext.len() < 2 {
            return Err(KtirError::Unsupported(format!(
                "a load of rank {} from `{}`",
                ext.len(),
                t.name
            )));
        }
        let starts: Vec<String> = region
            .start
            .iter()
            .enumerate()
            .map(|(i, a)| self.affine(a, adv.get(&t.name).filter(|_| i == 0)))
            .collect();
        let view = self.r.views[&t.name].clone();
        let tile = match route {
            None => self.access_tile(&view, &starts, ext, &t.shape, dt),
            Some(route) => {
                let slot = self.affine(&route.slot, None);
                let vars: Vec<String> = (0..ext.len()).map(|i| format!("%d{i}")).collect();
                let mut subs = vec![format!("ind(%{}_flat[{slot} + %d0])", route.routes)];
                subs.extend((1..ext.len()).map(|i| format!("({} + %d{i})", starts[i])));
                let routes = self.r.tensor(&route.routes)?;
                let all: usize = routes.shape.iter().product();
                let at = self.r.t.def(
                    "at",
                    format!(
                        "ktdp.construct_indirect_access_tile intermediate_variables({}) {view}[{}] {{",
                        vars.join(", "),
                        subs.join(", ")
                    ),
                );
                let types = format!("{}, memref<{all}xi32>", super::text::memref(&t.shape, dt));
                self.tile_tail(ext, &types, "variables_space");
                at
            }
        };
        let mut v = self.r.t.def(
            "ld",
            format!(
                "ktdp.load {tile} : {} -> {}",
                access_tile(ext),
                tensor(ext, dt)
            ),
        );
        let rows: usize = ext[..ext.len() - 1].iter().product();
        let shape = vec![rows, ext[ext.len() - 1]];
        if ext.len() > 2 {
            v = self.r.t.def(
                "r",
                format!(
                    "tensor.collapse_shape {v} {} : {} into {}",
                    rows_then_last(ext.len()),
                    tensor(ext, dt),
                    tensor(&shape, dt)
                ),
            );
        }
        let mut dt = dt;
        // A matmul's left operand in f32: the interpreter rounds a product to its left
        // operand's type, and the device accumulates in f32.
        if self.lefts.contains(to) && dt == "f16" {
            v = self.r.t.def(
                "x",
                format!(
                    "arith.extf {v} : {} to {}",
                    tensor(&shape, "f16"),
                    tensor(&shape, "f32")
                ),
            );
            dt = "f32";
        }
        self.vals.insert(to.to_string(), Val { ssa: v, shape, dt });
        Ok(())
    }

    /// A direct access tile of `view` (a tensor of `shape`) at `starts`, of `ext`.
    fn access_tile(
        &mut self,
        view: &str,
        starts: &[String],
        ext: &[usize],
        shape: &[usize],
        dt: &str,
    ) -> String {
        let at = self.r.t.def(
            "at",
            format!(
                "ktdp.construct_access_tile {view}[{}] {{",
                starts.join(", ")
            ),
        );
        self.tile_tail(ext, &super::text::memref(shape, dt), "access_tile");
        at
    }

    /// The rest of an access tile's definition: its set, its order and its types.
    fn tile_tail(&mut self, ext: &[usize], types: &str, set: &str) {
        self.r.t.line(format!(
            "  {set}_set = {}, {set}_order = {}",
            boxed(ext),
            identity(ext.len())
        ));
        self.r
            .t
            .line(format!("}} : {types} -> {}", access_tile(ext)));
    }

    /// LX to the device: only cores matching every owner coordinate write.
    fn store(
        &mut self,
        from: &str,
        region: &Region,
        owner: &[(String, usize)],
    ) -> Result<(), KtirError> {
        let t = self.r.tensor(&region.tensor)?.clone();
        let (dt, ext) = (elem(&t), &region.extent);
        let (mut v, shape) = self.slice(from, 0, ext.iter().product())?;
        if dt == "f16" {
            v = self.r.t.def(
                "h",
                format!(
                    "arith.truncf {v} : {} to {}",
                    tensor(&shape, "f32"),
                    tensor(&shape, "f16")
                ),
            );
        }
        if shape != *ext {
            let dims: Vec<String> = ext.iter().map(ToString::to_string).collect();
            v = self.r.t.def(
                "r",
                format!(
                    "tensor.expand_shape {v} {} output_shape [{}] : {} into {}",
                    rows_then_last(ext.len()),
                    dims.join(", "),
                    tensor(&shape, dt),
                    tensor(ext, dt)
                ),
            );
        }
        let starts: Vec<String> = region.start.iter().map(|a| self.affine(a, None)).collect();
        let view = self.r.views[&t.name].clone();
        let at = self.access_tile(&view, &starts, ext, &t.shape, dt);
        let store = format!(
            "ktdp.store {v}, {at} : {}, {}",
            tensor(ext, dt),
            access_tile(ext)
        );
        let mut cond: Option<String> = None;
        for (dim, want) in owner {
            let Some(s) = self.coord.get(dim).cloned() else {
                continue;
            };
            let w = self.r.t.index(*want);
            let q = self
                .r
                .t
                .def("own", format!("arith.cmpi eq, {s}, {w} : index"));
            cond = Some(match cond {
                None => q,
                Some(c) => self.r.t.def("own", format!("arith.andi {c}, {q} : i1")),
            });
        }
        match cond {
            None => self.r.t.line(store),
            Some(c) => {
                self.r.t.line(format!("scf.if {c} {{"));
                self.r.t.line(format!("  {store}"));
                self.r.t.line("}");
            }
        }
        Ok(())
    }

    fn matmul(
        &mut self,
        a: &str,
        a_at: &Affine,
        b: &str,
        out: &str,
        [m, k, n]: [usize; 3],
        accumulate: bool,
    ) -> Result<(), KtirError> {
        let av = self.val(a)?;
        let mut lhs = av.ssa.clone();
        if m * k != av.shape[0] * av.shape[1] || *a_at != Affine::default() {
            if av.shape[1] != k {
                return Err(KtirError::Unsupported(format!(
                    "a matmul reading `{a}` ({:?}) at an offset with k = {k}",
                    av.shape
                )));
            }
            let off = self.affine(a_at, None);
            let w = self.r.t.index(av.shape[1]);
            let row = self
                .r
                .t
                .def("row", format!("arith.divui {off}, {w} : index"));
            lhs = self.r.t.def(
                "sl",
                format!(
                    "tensor.extract_slice {lhs}[{row}, 0] [{m}, {k}] [1, 1] : {} to {}",
                    tensor(&av.shape, av.dt),
                    tensor(&[m, k], av.dt)
                ),
            );
        }
        let bv = self.val(b)?;
        if bv.shape != [k, n] {
            return Err(KtirError::Unsupported(format!(
                "a matmul's right operand `{b}` is {:?}, not [{k}, {n}]",
                bv.shape
            )));
        }
        let shape = vec![m, n];
        let outs = match accumulate {
            true => self.val(out)?.ssa,
            false => self.zeros(&shape),
        };
        let ot = tensor(&shape, "f32");
        let mm = self.r.t.def(
            "mm",
            format!(
                "linalg.matmul ins({lhs}, {} : {}, {}) outs({outs} : {ot}) -> {ot}",
                bv.ssa,
                tensor(&[m, k], av.dt),
                tensor(&bv.shape, bv.dt)
            ),
        );
        self.vals.insert(
            out.to_string(),
            Val {
                ssa: mm,
                shape,
                dt: "f32",
            },
        );
        Ok(())
    }

    fn sfp(&mut self, s: &Sfp) -> Result<(), KtirError> {
        match s {
            Sfp::Zero { out, elems } => {
                let w = self.widths.get(out).copied().unwrap_or(*elems);
                let shape = match elems % w {
                    0 => vec![elems / w, w],
                    _ => vec![1, *elems],
                };
                let z = self.zeros(&shape);
                self.vals.insert(
                    out.clone(),
                    Val {
                        ssa: z,
                        shape,
                        dt: "f32",
                    },
                );
            }
            Sfp::Add { acc, part, elems } => {
                let (a, shape) = self.slice(acc, 0, *elems)?;
                let (p, _) = self.slice(part, 0, *elems)?;
                let sum = self.r.t.def(
                    "add",
                    format!("arith.addf {a}, {p} : {}", tensor(&shape, "f32")),
                );
                let sum = self.rounded(sum, &shape, acc);
                self.set(acc, sum, shape);
            }
            Sfp::GeluMul { g, u, out, elems } => self.gated(g, u, out, *elems, Gated::Gelu)?,
            Sfp::SiluMul { g, u, out, elems } => self.gated(g, u, out, *elems, Gated::Silu)?,
            Sfp::SwigluClampedMul {
                g,
                u,
                out,
                elems,
                limit,
                alpha,
            } => self.gated(g, u, out, *elems, Gated::Swiglu(*limit, *alpha))?,
            Sfp::ScaleAcc {
                acc,
                acc_at,
                y,
                y_at,
                w,
                w_at,
                elems,
            } => {
                let whole = self.val(acc)?;
                let (a, shape) = self.slice(acc, *acc_at, *elems)?;
                let (yv, _) = self.slice(y, *y_at, *elems)?;
                let wv = self.val(w)?;
                let off = self.affine(w_at, None);
                let lanes = self.r.t.index(wv.shape[1]);
                let row = self
                    .r
                    .t
                    .def("wr", format!("arith.divui {off}, {lanes} : index"));
                let col = self
                    .r
                    .t
                    .def("wc", format!("arith.remui {off}, {lanes} : index"));
                let scalar = self.r.t.def(
                    "w",
                    format!(
                        "tensor.extract {}[{row}, {col}] : {}",
                        wv.ssa,
                        tensor(&wv.shape, "f32")
                    ),
                );
                let ty = tensor(&shape, "f32");
                let e = self.r.t.def("e", format!("tensor.empty() : {ty}"));
                let wb = self.r.t.def(
                    "wb",
                    format!("linalg.fill ins({scalar} : f32) outs({e} : {ty}) -> {ty}"),
                );
                let m = self.r.t.def("sc", format!("arith.mulf {wb}, {yv} : {ty}"));
                let mut sum = self.r.t.def("acc", format!("arith.addf {a}, {m} : {ty}"));
                if shape != whole.shape {
                    let wd = whole.shape[1];
                    sum = self.r.t.def(
                        "ins",
                        format!(
                            "tensor.insert_slice {sum} into {}[{}, {}] [{}, {}] [1, 1] : {ty} into {}",
                            whole.ssa,
                            acc_at / wd,
                            acc_at % wd,
                            shape[0],
                            shape[1],
                            tensor(&whole.shape, "f32")
                        ),
                    );
                }
                self.set(acc, sum, whole.shape);
            }
        }
        Ok(())
    }

    fn set(&mut self, buffer: &str, ssa: String, shape: Vec<usize>) {
        self.vals.insert(
            buffer.to_string(),
            Val {
                ssa,
                shape,
                dt: "f32",
            },
        );
    }

    /// `out = gated(g, u)` elementwise, one `linalg.generic` with the activation's scalar body
    /// (the f32 functions of `moek_ir::scalar`, written in `arith` and `math`).
    fn gated(
        &mut self,
        g: &str,
        u: &str,
        out: &str,
        elems: usize,
        act: Gated,
    ) -> Result<(), KtirError> {
        let (gv, shape) = self.slice(g, 0, elems)?;
        let (uv, _) = self.slice(u, 0, elems)?;
        let ty = tensor(&shape, "f32");
        let e = self.r.t.def("e", format!("tensor.empty() : {ty}"));
        let m = identity(2);
        let r = self.r.t.def(
            "act",
            format!(
                "linalg.generic {{indexing_maps = [{m}, {m}, {m}], iterator_types = [\"parallel\", \"parallel\"]}} ins({gv}, {uv} : {ty}, {ty}) outs({e} : {ty}) {{"
            ),
        );
        self.r.t.indent += 1;
        let (x, y, o) = (
            self.r.t.fresh("g"),
            self.r.t.fresh("u"),
            self.r.t.fresh("o"),
        );
        self.r
            .t
            .line(format!("^bb0({x}: f32, {y}: f32, {o}: f32):"));
        let res = act.body(&mut self.r.t, &x, &y);
        self.r.t.line(format!("linalg.yield {res} : f32"));
        self.r.t.indent -= 1;
        self.r.t.line(format!("}} -> {ty}"));
        let r = self.rounded(r, &shape, out);
        self.set(out, r, shape);
        Ok(())
    }

    fn scale_rows(
        &mut self,
        acc: &str,
        y: &str,
        w: &str,
        rows: usize,
        lanes: usize,
    ) -> Result<(), KtirError> {
        let (av, yv, wv) = (self.val(acc)?, self.val(y)?, self.val(w)?);
        if av.shape != yv.shape || av.shape[0] != rows || wv.shape[1] != lanes {
            return Err(KtirError::Unsupported(format!(
                "weighted rows of `{acc}` {:?} from `{y}` {:?} and `{w}` {:?}",
                av.shape, yv.shape, wv.shape
            )));
        }
        let col = self.r.t.def(
            "wcol",
            format!(
                "tensor.extract_slice {}[0, 0] [{rows}, 1] [1, 1] : {} to {}",
                wv.ssa,
                tensor(&wv.shape, "f32"),
                tensor(&[rows, 1], "f32")
            ),
        );
        let col = self.r.t.def(
            "wcol",
            format!(
                "tensor.collapse_shape {col} [[0, 1]] : {} into {}",
                tensor(&[rows, 1], "f32"),
                tensor(&[rows], "f32")
            ),
        );
        let ty = tensor(&av.shape, "f32");
        let e = self.r.t.def("e", format!("tensor.empty() : {ty}"));
        let (m2, m1) = (identity(2), "affine_map<(d0, d1) -> (d0)>");
        let r = self.r.t.def(
            "acc",
            format!(
                "linalg.generic {{indexing_maps = [{m2}, {m2}, {m1}, {m2}], iterator_types = [\"parallel\", \"parallel\"]}} ins({}, {}, {col} : {ty}, {ty}, {}) outs({e} : {ty}) {{",
                av.ssa,
                yv.ssa,
                tensor(&[rows], "f32")
            ),
        );
        self.r.t.indent += 1;
        let [a, yy, ww, o] = ["a", "y", "w", "o"].map(|s| self.r.t.fresh(s));
        self.r
            .t
            .line(format!("^bb0({a}: f32, {yy}: f32, {ww}: f32, {o}: f32):"));
        let p = self.r.t.def("t", format!("arith.mulf {ww}, {yy} : f32"));
        let q = self.r.t.def("t", format!("arith.addf {a}, {p} : f32"));
        self.r.t.line(format!("linalg.yield {q} : f32"));
        self.r.t.indent -= 1;
        self.r.t.line(format!("}} -> {ty}"));
        self.set(acc, r, av.shape);
        Ok(())
    }

    /// The completed sum of `buffer` over the cores that differ only in slice `dim`: an
    /// inter-tile produce and reduce over groups of those cores, combined in f32.
    fn ring(&mut self, buffer: &str, dim: &str) -> Result<(), KtirError> {
        let v = self.val(buffer)?;
        let st = self.stage;
        let all: Vec<String> = st.slices.iter().map(|s| s.0.clone()).collect();
        let division = st
            .divisions
            .iter()
            .find(|d| d.iter().any(|x| x == dim))
            .unwrap_or(&all);
        let key: Vec<usize> = (0..st.slices.len())
            .filter(|&i| st.slices[i].0 != dim && division.contains(&st.slices[i].0))
            .collect();
        let mut groups: HashMap<Vec<usize>, Vec<usize>> = HashMap::new();
        for (c, row) in st.core_slice.iter().enumerate() {
            let k = key.iter().map(|&i| row[i]).collect();
            groups.entry(k).or_default().push(c);
        }
        let mut groups: Vec<Vec<usize>> = groups.into_values().collect();
        groups.sort();
        let size = groups[0].len();
        let contiguous = groups
            .iter()
            .enumerate()
            .all(|(g, cores)| *cores == (g * size..(g + 1) * size).collect::<Vec<_>>());
        if !contiguous {
            return Err(KtirError::RingGroups {
                phase: st.name.clone(),
                dim: dim.to_string(),
                groups,
            });
        }
        let set = self.r.t.alias(format!(
            "affine_set<(i)[g] : (i - {size}*g >= 0, -i + {size}*g + {} >= 0)>",
            size - 1
        ));
        let gset = format!("affine_set<(g) : (g >= 0, -g + {} >= 0)>", groups.len() - 1);
        let ty = tensor(&v.shape, v.dt);
        let future = format!("!ktdp.tile_future<{ty}, groups = {gset}>");
        let t = &mut self.r.t;
        let f = t.def(
            "fut",
            format!("ktdp.inter_tile_produce producer_tiles_per_group = {set}"),
        );
        t.line(format!("    : {ty} -> {future}"));
        t.line("{");
        let gid = t.fresh("gid");
        t.line(format!("  ^bb0({gid}: index):"));
        t.line(format!("    ktdp.yield_partial {} : {ty}", v.ssa));
        t.line("}");
        let id = self.zeros(&v.shape);
        let t = &mut self.r.t;
        let red = t.def(
            "red",
            format!(
                "ktdp.inter_tile_reduce({f}) consumer_tiles_per_group = {set}, identity({id} : {ty})"
            ),
        );
        t.line(format!("    : {future} -> {ty}"));
        t.line("{");
        let (l, r) = (t.fresh("lhs"), t.fresh("rhs"));
        t.line(format!("  ^bb0({l}: {ty}, {r}: {ty}):"));
        let (e, s) = (t.fresh("e"), t.fresh("s"));
        t.line(format!("    {e} = tensor.empty() : {ty}"));
        t.line(format!(
            "    {s} = linalg.add ins({l}, {r} : {ty}, {ty}) outs({e} : {ty}) -> {ty}"
        ));
        t.line(format!("    ktdp.yield_reduced {s} : {ty}"));
        t.line("}");
        let red = self.rounded(red, &v.shape, buffer);
        self.vals.insert(buffer.to_string(), Val { ssa: red, ..v });
        Ok(())
    }

    /// The persistent loop: the preheader, an `scf.for` whose carried values (what the body
    /// reads before it writes them in a trip, or the drain reads) stay in LX across trips while
    /// the advancing operands move on by a bank a trip, then the drain.
    fn looped(
        &mut self,
        trips: usize,
        advancing: &[Advance],
        preheader: &'p [Instr],
        body: &'p [Instr],
        drain: &'p [Instr],
    ) -> Result<(), KtirError> {
        let none = HashMap::new();
        for s in steps(preheader) {
            self.step(s, &none)?;
        }
        let body_writes: HashSet<&str> = body.iter().flat_map(writes).collect();
        let mut written = HashSet::new();
        let mut carried: Vec<String> = vec![];
        for i in body {
            for r in reads(i) {
                let before = !written.contains(r) && self.vals.contains_key(r);
                if before && body_writes.contains(r) && !carried.iter().any(|c| c == r) {
                    carried.push(r.to_string());
                }
            }
            written.extend(writes(i));
        }
        for i in drain {
            for r in reads(i) {
                if written.contains(r) && !carried.iter().any(|c| c == r) {
                    carried.push(r.to_string());
                }
            }
        }
        let outer: Vec<Val> = carried
            .iter()
            .map(|b| self.val(b))
            .collect::<Result<_, _>>()?;
        let results: Vec<String> = carried.iter().map(|_| self.r.t.fresh("res")).collect();
        let iters: Vec<String> = carried.iter().map(|_| self.r.t.fresh("it")).collect();
        let sig = outer
            .iter()
            .map(|v| tensor(&v.shape, v.dt))
            .collect::<Vec<_>>()
            .join(", ");
        let args = iters
            .iter()
            .zip(&outer)
            .map(|(i, v)| format!("{i} = {}", v.ssa))
            .collect::<Vec<_>>()
            .join(", ");
        let (c0, ct, c1) = (self.r.t.index(0), self.r.t.index(trips), self.r.t.index(1));
        let trip = self.r.t.fresh("trip");
        self.r.t.line(format!(
            "// the persistent loop: {trips} trips, carried in LX: {}",
            carried.join(", ")
        ));
        self.r.t.line(format!(
            "{} = scf.for {trip} = {c0} to {ct} step {c1} iter_args({args}) -> ({sig}) {{",
            results.join(", ")
        ));
        self.r.t.indent += 1;
        for ((b, i), v) in carried.iter().zip(&iters).zip(&outer) {
            self.vals.insert(
                b.clone(),
                Val {
                    ssa: i.clone(),
                    ..v.clone()
                },
            );
        }
        let mut adv = HashMap::new();
        for a in advancing {
            let off = match a.per_trip {
                1 => trip.clone(),
                n => {
                    let n = self.r.t.index(n);
                    self.r
                        .t
                        .def("adv", format!("arith.muli {trip}, {n} : index"))
                }
            };
            adv.insert(a.tensor.clone(), off);
        }
        for s in steps(body) {
            self.step(s, &adv)?;
        }
        let yields = carried
            .iter()
            .map(|b| self.val(b).map(|v| v.ssa))
            .collect::<Result<Vec<_>, _>>()?;
        self.r
            .t
            .line(format!("scf.yield {} : {sig}", yields.join(", ")));
        self.r.t.indent -= 1;
        self.r.t.line("}");
        for ((b, r), v) in carried.iter().zip(results).zip(outer) {
            self.vals.insert(b.clone(), Val { ssa: r, ..v });
        }
        for s in steps(drain) {
            self.step(s, &none)?;
        }
        Ok(())
    }
}

/// The gated activations, as scalar bodies.
#[derive(Clone, Copy)]
enum Gated {
    Gelu,
    Silu,
    Swiglu(f32, f32),
}

impl Gated {
    /// The body's ops on `g` and `u`; returns the result's name.
    fn body(self, t: &mut super::text::Text, g: &str, u: &str) -> String {
        let k = |t: &mut super::text::Text, v: f32| {
            t.def("k", format!("arith.constant {} : f32", float(v)))
        };
        let op = |t: &mut super::text::Text, op: &str, args: &[&str]| {
            t.def("t", format!("{op} {} : f32", args.join(", ")))
        };
        match self {
            Gated::Gelu => {
                let g2 = op(t, "arith.mulf", &[g, g]);
                let g3 = op(t, "arith.mulf", &[&g2, g]);
                let c = k(t, 0.044_715);
                let cg3 = op(t, "arith.mulf", &[&c, &g3]);
                let inner = op(t, "arith.addf", &[g, &cg3]);
                let s = k(t, (2.0 / std::f32::consts::PI).sqrt());
                let z = op(t, "arith.mulf", &[&s, &inner]);
                let th = op(t, "math.tanh", &[&z]);
                let one = k(t, 1.0);
                let p = op(t, "arith.addf", &[&one, &th]);
                let half = k(t, 0.5);
                let hg = op(t, "arith.mulf", &[&half, g]);
                let a = op(t, "arith.mulf", &[&hg, &p]);
                op(t, "arith.mulf", &[&a, u])
            }
            Gated::Silu => {
                let n = op(t, "arith.negf", &[g]);
                let e = op(t, "math.exp", &[&n]);
                let one = k(t, 1.0);
                let d = op(t, "arith.addf", &[&one, &e]);
                let s = op(t, "arith.divf", &[g, &d]);
                op(t, "arith.mulf", &[&s, u])
            }
            Gated::Swiglu(limit, alpha) => {
                let (l, nl) = (k(t, limit), k(t, -limit));
                // The clamps as compare-and-select, unordered so a NaN stays (the interpreter
                // runs `arith.minimumf` on tensors only, not in a scalar body).
                let pick = |t: &mut super::text::Text, pred: &str, a: &str, b: &str| {
                    let c = t.def("c", format!("arith.cmpf {pred}, {a}, {b} : f32"));
                    t.def("t", format!("arith.select {c}, {a}, {b} : f32"))
                };
                let gc = pick(t, "ult", g, &l);
                let um = pick(t, "ult", u, &l);
                let uc = pick(t, "ugt", &um, &nl);
                let na = k(t, -alpha);
                let z = op(t, "arith.mulf", &[&na, &gc]);
                let e = op(t, "math.exp", &[&z]);
                let one = k(t, 1.0);
                let d = op(t, "arith.addf", &[&one, &e]);
                let s = op(t, "arith.divf", &[&gc, &d]);
                let u1 = op(t, "arith.addf", &[&uc, &one]);
                op(t, "arith.mulf", &[&s, &u1])
            }
        }
    }
}

/// An f32 literal as MLIR reads it (always with a point or an exponent).
fn float(v: f32) -> String {
    let s = format!("{v:?}");
    if s.contains(['.', 'e']) {
        s
    } else {
        format!("{s}.0")
    }
}

/// A weighted add's operands: (acc, acc_at, y, y_at, w, w_at, elems).
type ScaleAcc<'a> = (&'a str, usize, &'a str, usize, &'a str, &'a Affine, usize);

fn scale(i: &Instr) -> Option<ScaleAcc<'_>> {
    match i {
        Instr::Sfp(Sfp::ScaleAcc {
            acc,
            acc_at,
            y,
            y_at,
            w,
            w_at,
            elems,
        }) => Some((acc, *acc_at, y, *y_at, w, w_at, *elems)),
        _ => None,
    }
}

/// A body as steps: runs of per-row weighted adds of one accumulator (rows in order, the route
/// weight of row `r` at `r * lanes`) fused.
fn steps(body: &[Instr]) -> Vec<Step<'_>> {
    let mut out = vec![];
    let mut i = 0;
    while i < body.len() {
        if let Some((acc, _, y, _, w, _, elems)) = scale(&body[i]) {
            let mut j = i;
            while let Some((a1, acc_at, y1, y_at, w1, w_at, e1)) = body.get(j).and_then(scale) {
                let r = j - i;
                let row = (a1, y1, w1, e1) == (acc, y, w, elems)
                    && acc_at == r * elems
                    && y_at == r * elems
                    && w_at.terms.is_empty();
                if !row {
                    break;
                }
                j += 1;
            }
            let rows = j - i;
            let lanes = match rows > 1 {
                true => scale(&body[i + 1]).map_or(0, |s| s.5.constant),
                false => 0,
            };
            let evenly =
                (0..rows).all(|r| scale(&body[i + r]).is_some_and(|s| s.5.constant == r * lanes));
            if rows > 1 && evenly {
                out.push(Step::ScaleRows {
                    acc,
                    y,
                    w,
                    rows,
                    lanes,
                });
                i = j;
                continue;
            }
        }
        out.push(Step::One(&body[i]));
        i += 1;
    }
    out
}

/// Row widths that shape a buffer before anything is loaded into it: a matmul's `n`, a
/// store's last extent.
fn widths_of(body: &[Instr]) -> HashMap<String, usize> {
    let mut widths = HashMap::new();
    Instr::each(body, &mut |i| match i {
        Instr::Matmul { out, n, .. } => {
            widths.entry(out.clone()).or_insert(*n);
        }
        Instr::DmaOut { from, region, .. } => {
            let w = region.extent.last().copied().unwrap_or(1);
            widths.entry(from.clone()).or_insert(w);
        }
        _ => {}
    });
    widths
}

/// The buffers an instruction writes.
fn writes(i: &Instr) -> Vec<&str> {
    match i {
        Instr::DmaIn { to, .. } | Instr::IndexedLoad { to, .. } => vec![to],
        Instr::Matmul { out, .. } => vec![out],
        Instr::RingReduce { buffer, .. } => vec![buffer],
        Instr::Sfp(s) => vec![match s {
            Sfp::Zero { out, .. }
            | Sfp::GeluMul { out, .. }
            | Sfp::SiluMul { out, .. }
            | Sfp::SwigluClampedMul { out, .. } => out,
            Sfp::Add { acc, .. } | Sfp::ScaleAcc { acc, .. } => acc,
        }],
        Instr::DmaOut { .. } | Instr::Loop { .. } => vec![],
    }
}

/// The buffers an instruction reads.
fn reads(i: &Instr) -> Vec<&str> {
    match i {
        Instr::Matmul {
            a,
            b,
            out,
            accumulate,
            ..
        } => {
            let mut r = vec![a.as_str(), b.as_str()];
            if *accumulate {
                r.push(out);
            }
            r
        }
        Instr::RingReduce { buffer, .. } => vec![buffer],
        Instr::DmaOut { from, .. } => vec![from],
        Instr::Sfp(s) => match s {
            Sfp::Zero { .. } => vec![],
            Sfp::Add { acc, part, .. } => vec![acc, part],
            Sfp::ScaleAcc { acc, y, w, .. } => vec![acc, y, w],
            Sfp::GeluMul { g, u, .. }
            | Sfp::SiluMul { g, u, .. }
            | Sfp::SwigluClampedMul { g, u, .. } => vec![g, u],
        },
        Instr::DmaIn { .. } | Instr::IndexedLoad { .. } | Instr::Loop { .. } => vec![],
    }
}
