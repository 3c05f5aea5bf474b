//! Reductions: partial dots over a segment of a row, and segments added in declared order.

use super::tensors::{chunk_var, chunked_fn};
use super::{Emitter, Segs};
use moek_ir::{DimName, Op, Phase};
use std::fmt::Write;

/// A partial-dot helper called over one reduction segment `[k0, k1)`: `func(args.., k0, k1)`,
/// with `lid` last for a workgroup helper.
pub(super) struct SegCall {
    func: String,
    args: Vec<String>,
    lid: bool,
}

impl SegCall {
    /// A workgroup partial: `func(row, base, k0, k1, lid)`.
    pub(super) fn group(func: &str, args: [String; 2]) -> Self {
        SegCall {
            func: func.to_string(),
            args: args.to_vec(),
            lid: true,
        }
    }

    /// A token-tile partial: `func(row, k0, k1)`.
    pub(super) fn tile(func: &str, row: String) -> Self {
        SegCall {
            func: func.to_string(),
            args: vec![row],
            lid: false,
        }
    }

    /// The call over `[k0, k1)`.
    pub(super) fn over(&self, k0: usize, k1: usize) -> String {
        let lid = if self.lid { ", lid" } else { "" };
        format!("{}({}, {k0}u, {k1}u{lid})", self.func, self.args.join(", "))
    }
}

impl Emitter<'_> {
    /// A thread's partial sum over `[k0, k1)` of row `row` of weight `w` against `a` (a tensor
    /// of one chunk) starting at element `ab`: `part_W_A(row, ab, k0, k1, lid)`. Emitted once.
    pub(super) fn part(&mut self, w: &str, a: &str) -> String {
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
            &[("ab", "u32"), ("k0", "u32"), ("k1", "u32"), ("lid", "u32")],
            |c| {
                let ld = c.ld();
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
    pub(super) fn tile(&mut self, w: &str, a: &str, pairs: bool) -> String {
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
            &[("k0", "u32"), ("k1", "u32")],
            |c| {
                let ld = c.ld();
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
                        ld2 = c.ld2()
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
    pub(super) fn segments(&self, phase: Phase, dim: DimName, n: usize) -> Segs {
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
    pub(super) fn columns(&self, dim: DimName, n: usize) -> Segs {
        self.k
            .column_blocks(dim)
            .map_or_else(|| vec![(0, n)], |b| b.ranges())
    }

    /// Statements adding each segment's workgroup sum of `terms` (one per component) to `acc`.
    pub(super) fn reduce(&self, segs: &Segs, terms: &[SegCall]) -> String {
        let mut out = segments_comment(segs);
        for &(k0, k1) in segs {
            let args: Vec<String> = terms.iter().map(|t| t.over(k0, k1)).collect();
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
    pub(super) fn reduce_tile(&self, segs: &Segs, term: &SegCall, name: &str) -> String {
        let mut out = segments_comment(segs);
        let _ = writeln!(out, "    var {name}: array<f32, TILE>;");
        for &(k0, k1) in segs {
            let t = term.over(k0, k1);
            let _ = writeln!(
                out,
                "    {{\n        let p = {t};\n        \
                 for (var q = 0u; q < TILE; q++) {{ {name}[q] += p[q]; }}\n    }}"
            );
        }
        out
    }
}

/// `// segments, added in order: [0, 704) [704, 1408) ...`
pub(super) fn segments_comment(segs: &Segs) -> String {
    let list: Vec<String> = segs.iter().map(|(a, b)| format!("[{a}, {b})")).collect();
    format!("    // segments, added in order: {}\n", list.join(" "))
}

/// Whether a reduction over `segs` of rows of length `len` can go two elements at a time.
pub(super) fn even(segs: &Segs, len: usize) -> bool {
    len.is_multiple_of(2)
        && segs
            .iter()
            .all(|&(a, b)| a.is_multiple_of(2) && b.is_multiple_of(2))
}

/// Whether reduction blocks declared on `dim` apply to `phase` of `op`.
pub(super) fn blocks_apply(op: Op, phase: Phase, dim: DimName) -> bool {
    !op.has_phases() || phase == Phase::All || op.reduction_dims(phase).contains(&dim)
}
