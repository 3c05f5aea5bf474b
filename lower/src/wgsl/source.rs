//! The fixed WGSL every program carries: the params block, the activation, the softcap, workgroup sums.

use moek_ir::Activation;

/// A workgroup tree sum `NAME(v, lid)` of `ty` over workgroup buffer `buf`; every thread gets the
/// total.
pub(super) fn workgroup_sum(name: &str, buf: &str, ty: &str) -> String {
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
pub(super) const PARAMS: &str = "struct Params { trip: u32, softcap: f32, pad0: u32, pad1: u32 }

var<private> tok: array<u32, TILE>;

";

/// The activation's WGSL: `fn gated(g, u)`, the gated pair every op's epilogue calls.
pub(super) fn activation(act: Activation) -> String {
    match act {
        Activation::GeluTanh => "// tanh's argument is clamped: some drivers' tanh overflows to NaN for large inputs, and
// tanh(15) is 1 in f32.
fn gated(g: f32, u: f32) -> f32 {
    let c = 0.7978845608028654 * (g + 0.044715 * g * g * g);
    return 0.5 * g * (1.0 + tanh(clamp(c, -15.0, 15.0))) * u;
}

"
        .to_string(),
        // exp(-g) overflows to inf below -88, where g / inf is -0, the limit.
        Activation::Silu => "fn gated(g: f32, u: f32) -> f32 {
    return g / (1.0 + exp(-g)) * u;
}

"
        .to_string(),
        // `select` rather than `min`: WGSL's min may drop a NaN, and NaN must reach the output.
        // exp overflows to inf only for large negative gates, where the quotient is -0.
        Activation::SwigluClamped { limit, alpha } => format!(
            "fn gated(g: f32, u: f32) -> f32 {{
    let gc = select(g, {limit:?}, g > {limit:?});
    let uc = select(clamp(u, -{limit:?}, {limit:?}), u, u != u);
    return gc / (1.0 + exp(-{alpha:?} * gc)) * (uc + 1.0);
}}

"
        ),
    }
}

pub(super) const SOFTCAP: &str = "fn softcap(x: f32, cap: f32) -> f32 {
    if (cap <= 0.0) { return x; }
    return cap * tanh(clamp(x / cap, -15.0, 15.0));
}

";
