//! IR -> the CPU variant: the spec's schedule tables as a constant ([`moek_ir::cpu::Tables`])
//! and a call that hands them, with the op's inputs, to moek-cpu's generic skeletons. No loop is
//! generated: the same skeletons run a schedule built at run time from the IR.

use moek_ir::cpu::{Parts, Ranges, Skeleton, Tables};
use moek_ir::{Activation, Kernel};
use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

/// The generated `TABLES` constant and `cpu` function of `k`.
pub fn function(k: &Kernel) -> TokenStream {
    let t = Tables::of(k);
    let tables = tables(&t);
    let doc = format!("The CPU variant of `{}`: {}", k.name, k.schedule_summary());
    let private = quote!(::moek_kernels::__private);
    let cpu = quote!(#private::cpu);
    // Stored weights (plain, or quantized blocks) beside activations: gathered products or
    // GEMM skeletons, as the schedule says.
    let run = match Skeleton::of(k).reads_weights_apart() {
        true => quote!(run_gathered),
        false => quote!(run_gemm),
    };
    quote! {
        /// This spec's schedule as the CPU skeletons read it.
        pub const TABLES: #private::ir::cpu::Tables<'static> = #tables;

        #[doc = #doc]
        pub fn cpu<W: #cpu::Weight, A: #cpu::Element>(
            s: &#private::Shape,
            inputs: &#private::Inputs<'_, W, A>,
            out: &mut [f32],
        ) -> ::core::option::Option<u32> {
            #private::#run(&TABLES, s, inputs, out)
        }
    }
}

/// `t` as a constant expression.
fn tables(t: &Tables) -> TokenStream {
    let ir = quote!(::moek_kernels::__private::ir);
    let name = t.name.as_ref();
    let skeleton = format_ident!("{}", format!("{:?}", t.skeleton));
    let fixed = t.fixed.iter().map(|&(d, n)| {
        let d = format_ident!("{}", format!("{d:?}"));
        let n = Literal::usize_suffixed(n);
        quote!((#ir::DimName::#d, #n))
    });
    let activation = match t.activation {
        Activation::GeluTanh => quote!(#ir::Activation::GeluTanh),
        Activation::Silu => quote!(#ir::Activation::Silu),
        Activation::SwigluClamped { limit, alpha } => {
            let (limit, alpha) = (Literal::f32_suffixed(limit), Literal::f32_suffixed(alpha));
            quote!(#ir::Activation::SwigluClamped { limit: #limit, alpha: #alpha })
        }
    };
    let optional = t.optional.iter().map(|o| {
        let o = format_ident!("{o:?}");
        quote!(#ir::tensors::Optional::#o)
    });
    let [reduce_h, reduce_f, columns_h, columns_f, columns_v] = [
        &t.reduce_h,
        &t.reduce_f,
        &t.columns_h,
        &t.columns_f,
        &t.columns_v,
    ]
    .map(ranges);
    let cores = t.cores.map(parts);
    let groups = Literal::usize_suffixed(t.groups);
    let cow = quote!(::std::borrow::Cow::Borrowed);
    quote! {
        #ir::cpu::Tables {
            name: #cow(#name),
            skeleton: #ir::cpu::Skeleton::#skeleton,
            fixed: #cow(&[#(#fixed),*]),
            activation: #activation,
            optional: #ir::tensors::Optionals::NONE #(.with(#optional))*,
            reduce_h: #reduce_h,
            reduce_f: #reduce_f,
            columns_h: #columns_h,
            columns_f: #columns_f,
            columns_v: #columns_v,
            cores: [#(#cores),*],
            groups: #groups,
        }
    }
}

fn ranges(r: &Ranges) -> TokenStream {
    match r {
        Some(b) => {
            let pairs = b.iter().map(|&(s, e)| {
                let (s, e) = (Literal::usize_suffixed(s), Literal::usize_suffixed(e));
                quote!((#s, #e))
            });
            quote!(::core::option::Option::Some(::std::borrow::Cow::Borrowed(&[#(#pairs),*])))
        }
        None => quote!(::core::option::Option::None),
    }
}

fn parts(p: Parts) -> TokenStream {
    let n = p.0.map(Literal::usize_suffixed);
    quote!(::moek_kernels::__private::ir::cpu::Parts([#(#n),*]))
}
