//! The DSL stages directly, without the proc macro: what `kernel!` expands to parses as Rust, every
//! mistake of a spec is collected, and the IR survives its JSON round trip (what `moek` reads).

use moek_dsl::{check, expand, parse};
use moek_ir::{DimName, Kernel, Op, Selection};
use quote::quote;

fn spec(tokens: proc_macro2::TokenStream) -> syn::Result<Kernel> {
    let specs = parse::parse_specs(tokens)?;
    check::check(&specs[0])
}

#[test]
fn a_valid_spec_expands_to_a_module_that_parses() {
    let out = expand(quote! {
        /// Doc.
        pub k = expert_ffn {
            dims: T = 1, R = 8, E = 128, H = 2816, F = 704;
            dtypes: bf16; targets: cpu, spyre;
            select: gather E by R; reduce: H = 704 x 4; columns: H = [1024, 1024, 768];
            cores(gate_up): R x H = 8 x 4; cores(down): R = 8;
        }
    });
    let file: syn::File = syn::parse2(out.clone()).expect("the expansion is Rust");
    assert!(matches!(&file.items[0], syn::Item::Mod(m) if m.ident == "k"));
    assert!(!out.to_string().contains("compile_error"));
}

#[test]
fn every_mistake_is_reported_and_the_module_still_exists() {
    let out = expand(quote! {
        pub k = gate_up {
            dims: T = 1, R = 8, E = 128, H = 2816, F = 704, Q = 3;
            dtypes: bf16, f8; targets: cpu;
            select: gather E by R;
            reduce: H = 700 x 4;
            cores: R = 9;
        }
    })
    .to_string();
    assert_eq!(out.matches("compile_error").count(), 4, "{out}");
    for msg in [
        "no dim `Q`",
        "unknown dtype `f8`",
        "sum to 2800, not 2816",
        "split 9 is more parts than `R` 8 has elements",
    ] {
        assert!(out.contains(msg), "missing {msg:?} in {out}");
    }
    assert!(
        out.contains("pub mod k"),
        "the stub keeps the user's item: {out}"
    );
}

#[test]
fn a_malformed_header_is_one_clear_error() {
    let out = expand(quote! { pub k gate_up { } }).to_string();
    assert!(
        out.contains("compile_error") && out.contains("expected `=`"),
        "{out}"
    );
}

#[test]
fn the_ir_round_trips_through_json() {
    let k = spec(quote! {
        pub k = down {
            dims: T = 1, R = 8, E = 128, H = 2816, F = 704;
            dtypes: f16, bf16; targets: cpu;
            select: gather E by R; columns: H = [1024, 1024, 768]; cores: R = 8;
        }
    })
    .unwrap();
    assert_eq!(k.op, Op::Down);
    assert_eq!(k.schedule.select, Selection::Gather);
    assert_eq!(
        k.column_blocks(DimName::H).unwrap().ranges(),
        vec![(0, 1024), (1024, 2048), (2048, 2816)]
    );
    let back: Kernel = serde_json::from_str(&serde_json::to_string(&k).unwrap()).unwrap();
    assert_eq!(back, k);
}

#[test]
fn the_cpu_source_of_a_spec_is_formatted_rust() {
    let k = spec(quote! {
        pub k = lm_head_row { dims: T, H, V; dtypes: f32; targets: cpu; cores: V = 32; }
    })
    .unwrap();
    let src = moek_dsl::emit::cpu_source(&k);
    syn::parse_file(&src).expect("formatted source parses");
    assert!(src.contains("Skeleton::LmHeadRow"), "{src}");
    assert!(src.contains("run_gathered(&TABLES"), "{src}");
}

#[test]
fn a_fixed_stream_tile_sets_the_spyre_weight_tiles() {
    use moek_ir::spyre::Instr as SOp;
    let tiles = |stream: proc_macro2::TokenStream| {
        let k = spec(quote! {
            pub k = gate_up {
                dims: T = 1, R = 8, E = 128, H = 2816, F = 704;
                dtypes: bf16; targets: spyre; select: gather E by R; cores: R = 8;
                #stream
            }
        })
        .unwrap();
        let p = moek_lower::spyre::lower::program(&k, moek_ir::DType::Bf16).unwrap();
        p.phases[0]
            .body
            .iter()
            .filter_map(|op| match op {
                SOp::IndexedLoad { region, .. } => Some(region.extent[2]),
                _ => None,
            })
            .max()
            .unwrap()
    };
    assert_eq!(tiles(quote!(stream: F = 64;)), 64);
    assert_eq!(
        tiles(quote!()),
        128,
        "without a stream tile the widest whole-stick tile that fits"
    );
}
