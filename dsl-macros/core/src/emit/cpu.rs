//! IR -> the CPU variant: a Rust function that follows the schedule literally.
//!
//! Work units are the declared core splits (a `cpu::Grid`, run with rayon); reduction blocks are
//! summed in declared order (`cpu::clip` keeps the order inside a unit's range); a reduction split
//! across units is completed by adding the units' partials in part order; route owners write one
//! slot each and the K-axis combine adds routes in route order. Sums therefore never depend on the
//! thread count. Arithmetic is f32; GEMM paths store the gate/up activation in the weight dtype.
//! A gathered expert FFN whose two phases are cut only by tokens and routes, the same way, runs
//! each unit's routes through both phases back to back (same terms, same order, no barrier).

use moek_ir::{Activation, Blocks, DimName, Kernel, Op, Phase, Selection};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

/// The generated `cpu` function of `k`.
pub fn function(k: &Kernel) -> TokenStream {
    let body = match (k.op, k.schedule.select) {
        (Op::GateUp, _) => {
            let phase = gather_gate_up(k, Phase::All, quote!(out));
            quote! { #phase None }
        }
        (Op::Down, _) => {
            let phase = gather_down(k, Phase::All, quote!(act));
            quote! { #phase None }
        }
        (Op::ExpertFfn, Selection::Gather) if route_owned(k) => gather_route_owned(k),
        (Op::ExpertFfn, Selection::Gather) => {
            let n = quote!(t_n * r_n * f_n);
            let gu = gather_gate_up(k, Phase::GateUp, quote!(&mut act));
            let dn = gather_down(k, Phase::Down, quote!(&act));
            quote! {
                let mut act = vec![0f32; #n];
                #gu
                #dn
                None
            }
        }
        (Op::ExpertFfn, Selection::Grouped) => grouped(k),
        (Op::ExpertFfn, _) => dense_persistent(k),
        (Op::DenseMlp, _) => dense_mlp(k),
        (Op::LmHeadRow, _) => lm_head_row(k),
    };
    let name = &k.name;
    let variant = format_ident!("{}", variant_of(k.op));
    let fields = input_fields(k.op);
    let dims = dim_bindings(k);
    let biases = bias_bindings(k);
    let doc = format!("The CPU variant of `{}`: {}", k.name, k.schedule_summary());
    let cpu = quote!(::moek_kernels::__private::cpu);
    let (generics, inputs) = match (reads_weights_apart(k), k.bias.is_none()) {
        // Stored weights (plain or quantized blocks) and activations of their own type.
        (true, true) => (quote!(<W: #cpu::Weight, A: #cpu::Element>), quote!(W, A)),
        // Biases are added as numbers: plain weights only (the checker keeps quantized apart).
        (true, false) => (quote!(<W: #cpu::Element, A: #cpu::Element>), quote!(W, A)),
        // GEMM paths multiply activations and weights of one element type.
        (false, _) => (quote!(<W: #cpu::Element>), quote!(W)),
    };
    quote! {
        #[doc = #doc]
        #[allow(unused_variables, unused_mut, clippy::all)]
        pub fn cpu #generics (
            s: &::moek_kernels::__private::Shape,
            inputs: &::moek_kernels::__private::Inputs<'_, #inputs>,
            out: &mut [f32],
        ) -> ::core::option::Option<u32> {
            use ::moek_kernels::__private::cpu;
            use ::moek_kernels::__private::rayon::prelude::*;
            let ::moek_kernels::__private::Inputs::#variant { #fields } = *inputs else {
                panic!("kernel `{}` runs {} and was given other inputs", #name, stringify!(#variant))
            };
            // The parallel loops are joined from a worker (see `moek_cpu::pool`).
            cpu::on_pool(move || {
                #dims
                #biases
                #body
            })
        }
    }
}

/// Whether `k`'s variant reads weight rows only through [`moek_cpu`]'s products (gathered
/// routes, matrix-vector), never as numbers: then it runs on any stored weight, quantized
/// blocks included, beside activations of another type.
pub fn reads_weights_apart(k: &Kernel) -> bool {
    match k.op {
        Op::GateUp | Op::Down => true,
        Op::ExpertFfn => k.schedule.select == Selection::Gather,
        Op::LmHeadRow => true,
        Op::DenseMlp => false,
    }
}

/// The `Inputs` variant an op takes.
pub fn variant_of(op: Op) -> &'static str {
    match op {
        Op::GateUp => "GateUp",
        Op::Down => "Down",
        Op::ExpertFfn => "ExpertFfn",
        Op::DenseMlp => "DenseMlp",
        Op::LmHeadRow => "LmHeadRow",
    }
}

fn input_fields(op: Op) -> TokenStream {
    match op {
        Op::GateUp => quote!(x, idx, gate_up),
        Op::Down => quote!(act, idx, weights, down),
        Op::ExpertFfn => quote!(x, idx, weights, gate_up, down, bias),
        Op::DenseMlp => quote!(x, gate, up, down, output_gate),
        Op::LmHeadRow => quote!(hidden, emb, softcap),
    }
}

fn var(d: DimName) -> proc_macro2::Ident {
    format_ident!("{}_n", d.name().to_lowercase())
}

fn lit(n: usize) -> Literal {
    Literal::usize_suffixed(n)
}

/// `let h_n = 2816usize;` for fixed dims (checked against the shape), `let h_n = s.h;` for free.
fn dim_bindings(k: &Kernel) -> TokenStream {
    k.dims
        .iter()
        .map(|d| {
            let v = var(d.name);
            let field = format_ident!("{}", d.name.name().to_lowercase());
            match d.size {
                Some(n) => {
                    let size = lit(n);
                    let msg = format!(
                        "kernel `{}` is fixed at {}={} but was given {{}}",
                        k.name, d.name, n
                    );
                    quote! {
                        let #v = #size;
                        assert!(s.#field == #v, #msg, s.#field);
                    }
                }
                None => quote! { let #v = s.#field; },
            }
        })
        .collect()
}

/// The declared blocks of `dim` as `&[(start, end)]`, or one block over the whole dim.
fn blocks(b: Option<&Blocks>, dim: DimName) -> TokenStream {
    match b {
        Some(b) => {
            let pairs = b.ranges().into_iter().map(|(s, e)| {
                let (s, e) = (lit(s), lit(e));
                quote!((#s, #e))
            });
            quote!(&[#(#pairs),*])
        }
        None => {
            let v = var(dim);
            quote!(&[(0usize, #v)])
        }
    }
}

/// Parts of `dim` in `phase`'s core split (1 when not split).
fn parts_of(k: &Kernel, phase: Phase, dim: DimName) -> usize {
    k.cores_for(phase)
        .iter()
        .find(|s| s.dim == dim)
        .map_or(1, |s| s.parts)
}

/// [`parts_of`] as a literal.
fn parts(k: &Kernel, phase: Phase, dim: DimName) -> Literal {
    lit(parts_of(k, phase, dim))
}

/// Gate/up over gathered routes: units T x R x F x H; writes `gated(g, u)` to `dst` `[T, R, F]`.
fn gather_gate_up(k: &Kernel, phase: Phase, dst: TokenStream) -> TokenStream {
    let pair = gated(k, quote!(g), quote!(u));
    let gu_bias = add_gate_up_bias(k, quote!(g), quote!(u));
    let (pt, pr, pf, ph) = (
        parts(k, phase, DimName::T),
        parts(k, phase, DimName::R),
        parts(k, phase, DimName::F),
        parts(k, phase, DimName::H),
    );
    let h_blocks = blocks(k.reduce_blocks(DimName::H), DimName::H);
    let f_cols = blocks(
        if k.op == Op::GateUp {
            k.column_blocks(DimName::F)
        } else {
            None
        },
        DimName::F,
    );
    quote! {
        // gate/up: route owners gather their expert's bank in place; H in declared blocks.
        let grid = cpu::Grid::new([(t_n, #pt), (r_n, #pr), (f_n, #pf), (h_n, #ph)]);
        let h_blocks: &[(usize, usize)] = #h_blocks;
        let f_cols: &[(usize, usize)] = #f_cols;
        let mut partials = vec![0f32; #ph * t_n * r_n * 2 * f_n];
        {
            let shared = cpu::SharedOut::new(&mut partials);
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [tr, rr, fr, hr] = grid.ranges(unit);
                let hp = grid.index(unit)[3];
                let segs = cpu::clip(h_blocks, hr);
                for t in tr {
                    let xt = &x[t * h_n..(t + 1) * h_n];
                    for r in rr.clone() {
                        let slot = t * r_n + r;
                        let e = idx[slot] as usize;
                        let bank = cpu::values(gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
                        let up = cpu::values(bank, f_n * h_n..2 * f_n * h_n);
                        let base = (hp * t_n * r_n + slot) * 2 * f_n;
                        for (c0, c1) in cpu::clip(f_cols, fr.clone()) {
                            // SAFETY: this unit owns (H part, slot, columns c0..c1) of gate and up.
                            let g = unsafe { shared.slice(base + c0, c1 - c0) };
                            cpu::matvec_segments(xt, bank, h_n, c0..c1, &segs, g);
                            let u = unsafe { shared.slice(base + f_n + c0, c1 - c0) };
                            cpu::matvec_segments(xt, up, h_n, c0..c1, &segs, u);
                        }
                    }
                }
            });
        }
        // Completed sum over the H parts in part order, then the epilogue gated(g, u).
        (#dst)[..t_n * r_n * f_n].par_chunks_mut(f_n).enumerate().for_each(|(slot, a)| {
            let e = idx[slot] as usize;
            for j in 0..f_n {
                let (mut g, mut u) = (0f32, 0f32);
                for p in 0..#ph {
                    let b = (p * t_n * r_n + slot) * 2 * f_n;
                    g += partials[b + j];
                    u += partials[b + f_n + j];
                }
                #gu_bias
                a[j] = #pair;
            }
        });
    }
}

/// Whether both phases of a gathered expert FFN are cut only by tokens and routes, identically:
/// then each unit owns whole routes in both phases, and a route's down needs nothing but its own
/// activation.
/// The spec's gated pair `gated(g, u)` as an expression over the `moek-cpu` function of the
/// activation's name (parameters, if any, as literals the compiler folds in).
fn gated(k: &Kernel, g: TokenStream, u: TokenStream) -> TokenStream {
    let f = format_ident!("{}", k.activation.name());
    match k.activation {
        Activation::GeluTanh | Activation::Silu => quote!(cpu::#f(#g) * #u),
        Activation::SwigluClamped { limit, alpha } => {
            let (limit, alpha) = (Literal::f32_suffixed(limit), Literal::f32_suffixed(alpha));
            quote!(cpu::#f(#g, #u, #limit, #alpha))
        }
    }
}

/// `gate_up_bias` / `down_bias`, the spec's biases as slices (the backend checked that the
/// inputs carry exactly the spec's biases before the variant runs).
fn bias_bindings(k: &Kernel) -> TokenStream {
    let gu = k.bias.gate_up.then(|| {
        quote!(let gate_up_bias = bias.gate_up.expect("the backend checks the spec's biases are given");)
    });
    let dn = k.bias.down.then(|| {
        quote!(let down_bias = bias.down.expect("the backend checks the spec's biases are given");)
    });
    quote!(#gu #dn)
}

/// Statements adding expert `e`'s gate/up bias for column `j` to `g` and `u`, if the spec has one.
fn add_gate_up_bias(k: &Kernel, g: TokenStream, u: TokenStream) -> TokenStream {
    if !k.bias.gate_up {
        return quote!();
    }
    quote! {
        #g += gate_up_bias[e * 2 * f_n + j].to_f32();
        #u += gate_up_bias[e * 2 * f_n + f_n + j].to_f32();
    }
}

/// Expert `e`'s down bias at output column `i` (a spec with a down bias).
fn down_bias_at(k: &Kernel) -> TokenStream {
    debug_assert!(k.bias.down);
    quote!(down_bias[e * h_n + i].to_f32())
}

fn route_owned(k: &Kernel) -> bool {
    let owned = |phase| {
        k.cores_for(phase)
            .iter()
            .all(|s| matches!(s.dim, DimName::T | DimName::R))
    };
    owned(Phase::GateUp)
        && owned(Phase::Down)
        && [DimName::T, DimName::R]
            .iter()
            .all(|&d| parts_of(k, Phase::GateUp, d) == parts_of(k, Phase::Down, d))
}

/// A gathered expert FFN whose units own whole routes in both phases: each unit runs gate/up,
/// the epilogue and down for its routes back to back (no barrier between the phases: a route's
/// down reads only its own activation), then the K-axis combine. The arithmetic is the two-phase
/// emission's, term for term.
fn gather_route_owned(k: &Kernel) -> TokenStream {
    let pair = gated(k, quote!(g[j]), quote!(u[j]));
    let gu_bias = add_gate_up_bias(k, quote!(g[j]), quote!(u[j]));
    let dn_bias = k.bias.down.then(|| {
        let b = down_bias_at(k);
        quote! {
            for (i, y) in (c0..c1).zip(yv.iter_mut()) {
                *y += #b;
            }
        }
    });
    let (pt, pr) = (
        parts(k, Phase::GateUp, DimName::T),
        parts(k, Phase::GateUp, DimName::R),
    );
    let h_blocks = blocks(k.reduce_blocks(DimName::H), DimName::H);
    let f_blocks = blocks(k.reduce_blocks(DimName::F), DimName::F);
    let h_cols = blocks(k.column_blocks(DimName::H), DimName::H);
    let combine = combine_routes(quote!(y));
    quote! {
        // Route owners: gate/up (H in declared blocks), gated(g, u), then down (H in
        // column blocks, F in declared blocks) for each of their routes, banks read in place.
        let grid = cpu::Grid::new([(t_n, #pt), (r_n, #pr)]);
        let h_blocks: &[(usize, usize)] = #h_blocks;
        let f_blocks: &[(usize, usize)] = #f_blocks;
        let h_cols: &[(usize, usize)] = #h_cols;
        let mut y = vec![0f32; t_n * r_n * h_n];
        {
            let shared = cpu::SharedOut::new(&mut y);
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [tr, rr] = grid.ranges(unit);
                let (mut g, mut u, mut a) = (vec![0f32; f_n], vec![0f32; f_n], vec![0f32; f_n]);
                for t in tr {
                    let xt = &x[t * h_n..(t + 1) * h_n];
                    for r in rr.clone() {
                        let slot = t * r_n + r;
                        let e = idx[slot] as usize;
                        let bank = cpu::values(gate_up, e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n);
                        let up = cpu::values(bank, f_n * h_n..2 * f_n * h_n);
                        cpu::matvec_segments(xt, bank, h_n, 0..f_n, h_blocks, &mut g);
                        cpu::matvec_segments(xt, up, h_n, 0..f_n, h_blocks, &mut u);
                        for j in 0..f_n {
                            #gu_bias
                            a[j] = #pair;
                        }
                        let bank = cpu::values(down, e * h_n * f_n..(e + 1) * h_n * f_n);
                        for &(c0, c1) in h_cols {
                            // SAFETY: this unit owns route slot `slot`.
                            let yv = unsafe { shared.slice(slot * h_n + c0, c1 - c0) };
                            cpu::matvec_segments(&a, bank, f_n, c0..c1, f_blocks, yv);
                            #dn_bias
                        }
                    }
                }
            });
        }
        #combine
        None
    }
}

/// The K-axis combine `out[t] = sum_r w[t,r] * rows[t * R + r]` over one `[H]` row per route
/// slot (`rows`, the buffer's name), routes added in route order.
fn combine_routes(rows: TokenStream) -> TokenStream {
    quote! {
        // K-axis combine: routes in route order.
        out[..t_n * h_n].par_chunks_mut(h_n).enumerate().for_each(|(t, o)| {
            o.fill(0.0);
            for r in 0..r_n {
                let slot = t * r_n + r;
                let w = weights[slot];
                for (o, y) in o.iter_mut().zip(&#rows[slot * h_n..(slot + 1) * h_n]) {
                    *o += w * y;
                }
            }
        });
    }
}

/// Down over gathered routes: units T x R x H x F, H in column blocks, F in reduction blocks,
/// then the K-axis combine `out[t] = sum_r w[t,r] * y[t,r]` in route order.
fn gather_down(k: &Kernel, phase: Phase, act: TokenStream) -> TokenStream {
    let dn_bias = k.bias.down.then(|| {
        let b = down_bias_at(k);
        quote!(v += #b;)
    });
    let (pt, pr, ph, pf) = (
        parts(k, phase, DimName::T),
        parts(k, phase, DimName::R),
        parts(k, phase, DimName::H),
        parts(k, phase, DimName::F),
    );
    let f_blocks = blocks(k.reduce_blocks(DimName::F), DimName::F);
    let h_cols = blocks(k.column_blocks(DimName::H), DimName::H);
    quote! {
        // down: route owners read column blocks of their expert's bank in place; F in blocks.
        let act: &[f32] = #act;
        let grid = cpu::Grid::new([(t_n, #pt), (r_n, #pr), (h_n, #ph), (f_n, #pf)]);
        let f_blocks: &[(usize, usize)] = #f_blocks;
        let h_cols: &[(usize, usize)] = #h_cols;
        let mut y = vec![0f32; #pf * t_n * r_n * h_n];
        {
            let shared = cpu::SharedOut::new(&mut y);
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [tr, rr, hr, fr] = grid.ranges(unit);
                let fp = grid.index(unit)[3];
                let segs = cpu::clip(f_blocks, fr);
                for t in tr {
                    for r in rr.clone() {
                        let slot = t * r_n + r;
                        let e = idx[slot] as usize;
                        let a = &act[slot * f_n..(slot + 1) * f_n];
                        let bank = cpu::values(down, e * h_n * f_n..(e + 1) * h_n * f_n);
                        let base = (fp * t_n * r_n + slot) * h_n;
                        for (c0, c1) in cpu::clip(h_cols, hr.clone()) {
                            // SAFETY: this unit owns (F part, slot, columns c0..c1).
                            let yv = unsafe { shared.slice(base + c0, c1 - c0) };
                            cpu::matvec_segments(a, bank, f_n, c0..c1, &segs, yv);
                        }
                    }
                }
            });
        }
        // K-axis combine on the device side of the schedule: routes in route order, each the
        // completed sum of its F parts in part order.
        out[..t_n * h_n].par_chunks_mut(h_n).enumerate().for_each(|(t, o)| {
            o.fill(0.0);
            for r in 0..r_n {
                let slot = t * r_n + r;
                let w = weights[slot];
                let e = idx[slot] as usize;
                for i in 0..h_n {
                    let mut v = 0f32;
                    for p in 0..#pf {
                        v += y[(p * t_n * r_n + slot) * h_n + i];
                    }
                    #dn_bias
                    o[i] += w * v;
                }
            }
        });
    }
}

/// GEMM gate/up phase over `n` token rows `xs` (`[n, H]`, in token order; `rows_of` maps a token
/// range to rows), writing the activation in the weight dtype to `aw` `[n, F]`.
fn gemm_gate_up(k: &Kernel, gate: TokenStream, up: TokenStream) -> TokenStream {
    let pair = gated(k, quote!(g), quote!(u));
    let phase = Phase::GateUp;
    let (pt, pf, ph) = (
        parts(k, phase, DimName::T),
        parts(k, phase, DimName::F),
        parts(k, phase, DimName::H),
    );
    let h_blocks = blocks(k.reduce_blocks(DimName::H), DimName::H);
    quote! {
        // gate/up phase: units T x F x H; H in declared blocks; H parts completed in order.
        let grid = cpu::Grid::new([(t_n, #pt), (f_n, #pf), (h_n, #ph)]);
        let h_blocks: &[(usize, usize)] = #h_blocks;
        let mut partials = vec![0f32; #ph * n * 2 * f_n];
        {
            let shared = cpu::SharedOut::new(&mut partials);
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [tr, fr, hr] = grid.ranges(unit);
                let hp = grid.index(unit)[2];
                let m = rows_of(tr);
                if m.is_empty() || fr.is_empty() {
                    return;
                }
                let segs = cpu::clip(h_blocks, hr);
                let xm = &xs[m.start * h_n..m.end * h_n];
                for (mat, off) in [(#gate, 0), (#up, f_n)] {
                    let mut c = vec![0f32; m.len() * fr.len()];
                    for &(s0, s1) in &segs {
                        cpu::gemm_nt(&xm[s0..], h_n, &mat[fr.start * h_n + s0..], h_n, &mut c, fr.len(), m.len(), fr.len(), s1 - s0);
                    }
                    // SAFETY: this unit owns rows m, columns fr of its H part.
                    unsafe { shared.write_tile((hp * n + m.start) * 2 * f_n + off + fr.start, 2 * f_n, &c, m.len(), fr.len()) };
                }
            });
        }
        let aw: Vec<W> = (0..n * f_n)
            .into_par_iter()
            .map(|i| {
                let (row, j) = (i / f_n, i % f_n);
                let (mut g, mut u) = (0f32, 0f32);
                for p in 0..#ph {
                    let b = (p * n + row) * 2 * f_n;
                    g += partials[b + j];
                    u += partials[b + f_n + j];
                }
                W::from_f32(#pair)
            })
            .collect();
    }
}

/// GEMM down phase: `y[fpart][row][H] = aw . down^T`, units T x H x F, H in column blocks.
fn gemm_down(k: &Kernel, down: TokenStream) -> TokenStream {
    let phase = Phase::Down;
    let (pt, ph, pf) = (
        parts(k, phase, DimName::T),
        parts(k, phase, DimName::H),
        parts(k, phase, DimName::F),
    );
    let f_blocks = blocks(k.reduce_blocks(DimName::F), DimName::F);
    let h_cols = blocks(k.column_blocks(DimName::H), DimName::H);
    quote! {
        // down phase: units T x H x F; H in column blocks, F in declared blocks.
        let grid = cpu::Grid::new([(t_n, #pt), (h_n, #ph), (f_n, #pf)]);
        let f_blocks: &[(usize, usize)] = #f_blocks;
        let h_cols: &[(usize, usize)] = #h_cols;
        let f_parts = #pf;
        let mut y = vec![0f32; f_parts * n * h_n];
        {
            let shared = cpu::SharedOut::new(&mut y);
            let mat = #down;
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [tr, hr, fr] = grid.ranges(unit);
                let fp = grid.index(unit)[2];
                let m = rows_of(tr);
                if m.is_empty() {
                    return;
                }
                let segs = cpu::clip(f_blocks, fr);
                let am = &aw[m.start * f_n..m.end * f_n];
                for (c0, c1) in cpu::clip(h_cols, hr) {
                    let mut c = vec![0f32; m.len() * (c1 - c0)];
                    for &(s0, s1) in &segs {
                        cpu::gemm_nt(&am[s0..], f_n, &mat[c0 * f_n + s0..], f_n, &mut c, c1 - c0, m.len(), c1 - c0, s1 - s0);
                    }
                    // SAFETY: this unit owns rows m, columns c0..c1 of its F part.
                    unsafe { shared.write_tile((fp * n + m.start) * h_n + c0, h_n, &c, m.len(), c1 - c0) };
                }
            });
        }
    }
}

/// Dense over experts, in a persistent loop: x and the accumulator (`out`) stay, one expert bank
/// per trip; token groups own their accumulator rows.
fn dense_persistent(k: &Kernel) -> TokenStream {
    let groups = lit(k.schedule.groups.map_or(1, |g| g.parts));
    let gu = gemm_gate_up(
        k,
        quote!(&bank_gu[..f_n * h_n]),
        quote!(&bank_gu[f_n * h_n..]),
    );
    let dn = gemm_down(k, quote!(bank_dn));
    quote! {
        // Routing materialised densely: one weight per (token, expert), 0 when unselected.
        let route = cpu::dense_routes(idx, weights, t_n, r_n, e_n);
        let groups = cpu::Grid::new([(t_n, #groups)]);
        // Accumulator fill.
        out[..t_n * h_n].fill(0.0);
        // The persistent loop: one trip per expert bank. A token whose route weight is 0 adds
        // exactly 0, so its rows are skipped (the loop still visits every expert).
        for e in 0..e_n {
            let active: Vec<usize> = (0..t_n).filter(|&t| route[t * e_n + e] != 0.0).collect();
            if active.is_empty() {
                continue;
            }
            let n = active.len();
            let rows_of = |tr: ::core::ops::Range<usize>| {
                active.partition_point(|&t| t < tr.start)..active.partition_point(|&t| t < tr.end)
            };
            let mut xs = cpu::Scratch::<W>::zeroed(n * h_n);
            cpu::gather_rows_into(&mut xs, x, h_n, active.iter().copied());
            let bank_gu = &gate_up[e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n];
            let bank_dn = &down[e * h_n * f_n..(e + 1) * h_n * f_n];
            #gu
            #dn
            // Token groups add their tokens' weighted results to the resident accumulator.
            let acc = cpu::SharedOut::new(&mut out[..t_n * h_n]);
            (0..groups.units()).into_par_iter().for_each(|g| {
                let [tr] = groups.ranges(g);
                for i in rows_of(tr) {
                    let t = active[i];
                    let w = route[t * e_n + e];
                    // SAFETY: token t belongs to this group only.
                    let o = unsafe { acc.slice(t * h_n, h_n) };
                    for j in 0..h_n {
                        let mut v = 0f32;
                        for p in 0..f_parts {
                            v += y[(p * n + i) * h_n + j];
                        }
                        o[j] += w * v;
                    }
                }
            });
        }
        None
    }
}

/// Tokens grouped by expert (data-dependent sizes): one GEMM pair per expert, experts as work
/// units, then the K-axis combine in route order.
fn grouped(k: &Kernel) -> TokenStream {
    let pair = gated(k, quote!(g[j]), quote!(g[f_n + j]));
    let combine = combine_routes(quote!(ys));
    let h_blocks = blocks(k.reduce_blocks(DimName::H), DimName::H);
    let f_blocks = blocks(k.reduce_blocks(DimName::F), DimName::F);
    let h_cols = blocks(k.column_blocks(DimName::H), DimName::H);
    quote! {
        let h_blocks: &[(usize, usize)] = #h_blocks;
        let f_blocks: &[(usize, usize)] = #f_blocks;
        let h_cols: &[(usize, usize)] = #h_cols;
        let lists = cpu::group_by_expert(&idx[..t_n * r_n], e_n);
        let mut ys = vec![0f32; t_n * r_n * h_n];
        {
            let shared = cpu::SharedOut::new(&mut ys);
            (0..e_n).into_par_iter().for_each(|e| {
                let slots = &lists[e];
                if slots.is_empty() {
                    return;
                }
                let n = slots.len();
                // This worker's scratch, reused from one expert to the next.
                let mut xs = cpu::Scratch::<W>::zeroed(n * h_n);
                cpu::gather_rows_into(&mut xs, x, h_n, slots.iter().map(|s| s / r_n));
                let bank_gu = &gate_up[e * 2 * f_n * h_n..(e + 1) * 2 * f_n * h_n];
                let bank_dn = &down[e * h_n * f_n..(e + 1) * h_n * f_n];
                let mut gu = cpu::Scratch::<f32>::zeroed(n * 2 * f_n);
                for &(s0, s1) in h_blocks {
                    cpu::gemm_nt(&xs[s0..], h_n, &bank_gu[s0..], h_n, &mut gu, 2 * f_n, n, 2 * f_n, s1 - s0);
                }
                let mut aw = cpu::Scratch::<W>::zeroed(n * f_n);
                for (row, a) in aw.chunks_exact_mut(f_n).enumerate() {
                    let g = &gu[row * 2 * f_n..][..2 * f_n];
                    for j in 0..f_n {
                        a[j] = W::from_f32(#pair);
                    }
                }
                let mut y = cpu::Scratch::<f32>::zeroed(n * h_n);
                for &(c0, c1) in h_cols {
                    for &(s0, s1) in f_blocks {
                        cpu::gemm_nt(&aw[s0..], f_n, &bank_dn[c0 * f_n + s0..], f_n, &mut y[c0..], h_n, n, c1 - c0, s1 - s0);
                    }
                }
                for (i, &slot) in slots.iter().enumerate() {
                    // SAFETY: each route slot chose exactly one expert.
                    unsafe { shared.slice(slot * h_n, h_n) }.copy_from_slice(&y[i * h_n..(i + 1) * h_n]);
                }
            });
        }
        #combine
        None
    }
}

/// The dense MLP: GEMM gate/up and down phases over all tokens.
fn dense_mlp(k: &Kernel) -> TokenStream {
    // The output gate: `sigmoid(x[t] . output_gate)` scales token t's row.
    let (scale, times) = match k.output_gate {
        true => (
            quote! {
                let gate_w = output_gate.expect("the backend checks the spec's output gate is given");
                let z = cpu::dot(&x[t * h_n..(t + 1) * h_n], gate_w);
                let scale = 1.0 / (1.0 + (-z).exp());
            },
            quote!(*scale),
        ),
        false => (quote!(), quote!()),
    };
    let gu = gemm_gate_up(k, quote!(gate), quote!(up));
    let dn = gemm_down(k, quote!(down));
    quote! {
        let n = t_n;
        let rows_of = |tr: ::core::ops::Range<usize>| tr;
        let xs = &x[..t_n * h_n];
        #gu
        #dn
        // Completed sum over the F parts, in part order.
        out[..t_n * h_n].par_chunks_mut(h_n).enumerate().for_each(|(t, o)| {
            #scale
            for j in 0..h_n {
                let mut v = 0f32;
                for p in 0..f_parts {
                    v += y[(p * n + t) * h_n + j];
                }
                o[j] = v #times;
            }
        });
        None
    }
}

/// The LM head on the final row only: vocabulary rows as units (column blocks of V), softcap,
/// then the argmax.
fn lm_head_row(k: &Kernel) -> TokenStream {
    let pv = parts(k, Phase::All, DimName::V);
    let h_blocks = blocks(k.reduce_blocks(DimName::H), DimName::H);
    let v_cols = blocks(k.column_blocks(DimName::V), DimName::V);
    quote! {
        let last = &hidden[(t_n - 1) * h_n..t_n * h_n];
        let grid = cpu::Grid::new([(v_n, #pv)]);
        let h_blocks: &[(usize, usize)] = #h_blocks;
        let v_cols: &[(usize, usize)] = #v_cols;
        {
            let shared = cpu::SharedOut::new(&mut out[..v_n]);
            (0..grid.units()).into_par_iter().for_each(|unit| {
                let [vr] = grid.ranges(unit);
                for (c0, c1) in cpu::clip(v_cols, vr) {
                    // SAFETY: this unit owns vocabulary rows c0..c1.
                    let o = unsafe { shared.slice(c0, c1 - c0) };
                    cpu::matvec_segments(last, emb, h_n, c0..c1, h_blocks, o);
                    if let Some(cap) = softcap {
                        cpu::softcap_slice(o, cap);
                    }
                }
            });
        }
        Some(::moek_kernels::__private::argmax(&out[..v_n]))
    }
}
