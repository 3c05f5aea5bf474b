//! IR -> the items a spec expands to: a module named for the spec holding its IR, its variants,
//! its dispatch entry and its generated equivalence tests.

pub mod cpu;

use crate::ast::Spec;
use moek_ir::{Kernel, Target};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

/// The module a valid spec expands to.
pub fn module(spec: &Spec, k: &Kernel) -> TokenStream {
    let (attrs, vis, name) = (&spec.attrs, &spec.vis, &spec.name);
    let json = serde_json::to_string(k).expect("the IR serialises");
    let cpu_fn = if k.targets.contains(&Target::Cpu) {
        cpu::function(k)
    } else {
        TokenStream::new()
    };
    let cpu_fns = cpu_fns(k);
    let cpu_src = if k.targets.contains(&Target::Cpu) {
        cpu_source(k)
    } else {
        String::new()
    };
    let tests = tests(k);
    quote! {
        #(#attrs)*
        #vis mod #name {
            /// The validated IR of this spec, as JSON (what `moek list` and `moek emit` read).
            pub const IR_JSON: &str = #json;

            /// The CPU variant's source as the macro generated it (`moek emit --backend cpu`
            /// prints it; empty when the spec does not target the CPU).
            pub const CPU_SOURCE: &str = #cpu_src;

            /// This spec's IR and variants, for dispatch.
            pub fn entry() -> ::moek_kernels::__private::KernelEntry {
                ::moek_kernels::__private::KernelEntry::new(IR_JSON, CPU_SOURCE, #cpu_fns)
            }

            ::moek_kernels::__private::if_cpu! { #cpu_fn }

            #tests
        }
    }
}

/// The block's `entries()`: every spec of one `kernel!` invocation, in declaration order, for
/// `moek_kernels::Registry::with`.
pub fn entries(specs: &[Spec]) -> TokenStream {
    let names = specs.iter().map(|s| &s.name);
    quote! {
        /// Every spec of this `kernel!` block, in declaration order (a registry ranks them so).
        pub fn entries() -> ::std::vec::Vec<::moek_kernels::__private::KernelEntry> {
            ::std::vec![#(#names::entry()),*]
        }
    }
}

/// What a spec that failed validation expands to (beside its errors): the module and its public
/// items, so uses of them do not add unresolved-name errors to the real ones.
pub fn stub(spec: &Spec) -> TokenStream {
    let (attrs, vis, name) = (&spec.attrs, &spec.vis, &spec.name);
    quote! {
        #(#attrs)*
        #vis mod #name {
            pub const IR_JSON: &str = "";
            pub const CPU_SOURCE: &str = "";
            pub fn entry() -> ::moek_kernels::__private::KernelEntry {
                unreachable!("this spec did not compile")
            }
        }
    }
}

/// The CPU function table: one instantiation per declared dtype, `None` for the others.
fn cpu_fns(k: &Kernel) -> TokenStream {
    if !k.targets.contains(&Target::Cpu) {
        return quote!(::moek_kernels::__private::CpuFns::NONE);
    }
    let slot = |d: moek_ir::DType, w: TokenStream, a: TokenStream| match k.dtypes.contains(&d) {
        false => quote!(None),
        true => quote!(Some(cpu::<#w, #a>)),
    };
    let half = quote!(::moek_kernels::__private::half);
    let q = quote!(::moek_kernels::__private::ir::quant);
    let plain = |d, ty: TokenStream| slot(d, ty.clone(), ty);
    let f16 = plain(moek_ir::DType::F16, quote!(#half::f16));
    let bf16 = plain(moek_ir::DType::Bf16, quote!(#half::bf16));
    let f32 = plain(moek_ir::DType::F32, quote!(f32));
    // One table per block format, at the spec's block size (`G` groups a block): its variants
    // beside f32 and beside bf16 activations, held by `BlockFns` as a `'static` constant.
    let groups = k.quant_block / moek_ir::quant::GROUP;
    let quant = |format: moek_ir::BlockFormat, ty: TokenStream| {
        let of = |act| moek_ir::DType::quantized(format, act).expect("a block format");
        if !k.dtypes.iter().any(|d| d.blocks() == Some(format)) {
            return quote!(::moek_kernels::__private::BlockFns::NONE);
        }
        // MXFP4 fixes its block (one scale per 32 values): its type has no group count.
        let ty = match format.fixed_block() {
            Some(_) => ty,
            None => quote!(#ty<#groups>),
        };
        let f32 = slot(of(moek_ir::DType::F32), ty.clone(), quote!(f32));
        let bf16 = slot(of(moek_ir::DType::Bf16), ty.clone(), quote!(#half::bf16));
        quote!(::moek_kernels::__private::BlockFns::new({
            const FNS: ::moek_kernels::__private::QuantFns<#ty> =
                ::moek_kernels::__private::QuantFns { f32: #f32, bf16: #bf16 };
            &FNS
        }))
    };
    let q8_0 = quant(moek_ir::BlockFormat::Q8_0, quote!(#q::BlockQ8));
    let q4_0 = quant(moek_ir::BlockFormat::Q4_0, quote!(#q::BlockQ4));
    let mxfp4 = quant(moek_ir::BlockFormat::Mxfp4, quote!(#q::BlockMxfp4));
    quote! {
        ::moek_kernels::__private::cpu_fns!(::moek_kernels::__private::CpuFns {
            f16: #f16, bf16: #bf16, f32: #f32, q8_0: #q8_0, q4_0: #q4_0, mxfp4: #mxfp4,
        })
    }
}

/// One test per (enabled backend the spec targets) x dtype, against the f64 reference.
fn tests(k: &Kernel) -> TokenStream {
    let cases = k.targets.iter().flat_map(|t| {
        k.dtypes.iter().map(move |d| {
            let test = format_ident!("{}_{}", t.name(), d.name());
            let dtype = format_ident!("{}", format!("{d:?}"));
            let (gate, target) = match t {
                Target::Spyre => (quote!(if_spyre), quote!(Spyre)),
                Target::Wgpu => (quote!(if_wgpu), quote!(Wgpu)),
                Target::Cpu => (quote!(if_cpu), quote!(Cpu)),
            };
            quote! {
                ::moek_kernels::__private::#gate! {
                    #[test]
                    fn #test() {
                        ::moek_kernels::__private::testing::check_spec(
                            &super::entry(),
                            ::moek_kernels::__private::ir::Target::#target,
                            ::moek_kernels::__private::ir::DType::#dtype,
                        );
                    }
                }
            }
        })
    });
    quote! {
        /// Generated: every variant of this spec against the f64 reference, fresh seeds each run.
        #[cfg(test)]
        mod equivalence {
            ::moek_kernels::__private::if_testing! {
                #(#cases)*
            }
        }
    }
}

/// The CPU variant of `k` as formatted Rust source, embedded in the spec's entry for `moek emit
/// NAME --backend cpu` (so the run time needs no parser to print it).
pub fn cpu_source(k: &Kernel) -> String {
    let tokens = cpu::function(k);
    match syn::parse2::<syn::File>(tokens.clone()) {
        Ok(file) => prettyplease::unparse(&file),
        Err(_) => tokens.to_string(),
    }
}
