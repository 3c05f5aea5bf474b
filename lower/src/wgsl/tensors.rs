//! Tensors: planned in whole-row chunks under the binding limit, declared, and read through one loader per chunk.

use super::{Emitter, Store, WgslError};
use moek_ir::plan::{BufferRole, TensorPlan};
use moek_ir::tensors::{ElemClass, TensorRole};
use moek_ir::{BlockFormat, DType};
use std::fmt::Write;

impl Emitter<'_> {
    /// The op's own tensors, from its table (with the spec's optional ones): weights chunked
    /// along their rows, activations and route tensors bound whole (route tensors read one
    /// element at a time).
    pub(super) fn op_tensors(&mut self) -> Result<(), WgslError> {
        for (_, t) in self.k.op.bound(self.k.optional) {
            let role = match t.role {
                TensorRole::Weight => BufferRole::Weight,
                TensorRole::Input | TensorRole::Route => BufferRole::Input,
            };
            let quantized = self.dtype.is_quantized();
            let store = match t.class {
                // Beside quantized weights, activations are f32 or bf16, as the dtype says.
                ElemClass::Activation if quantized => Store::Activation,
                ElemClass::Weight if quantized => Store::Blocks,
                ElemClass::Activation | ElemClass::Weight => Store::Dtype,
                ElemClass::F32 => Store::F32,
                ElemClass::Index => Store::U32,
            };
            let row = match t.role {
                TensorRole::Route => 1,
                _ => t.row_len(&self.s),
            };
            self.tensor(t.name, role, t.len(&self.s), store, row)?;
            // Optional tensors (biases, the output gate) are read through their one chunk's
            // loader (`ld_NAME_0`): a few rows.
            if t.when.is_some() && self.tensors.last().is_some_and(|p| p.chunks > 1) {
                return Err(WgslError::Whole {
                    tensor: t.name.to_string(),
                    bytes: (t.len(&self.s) * self.dtype.bytes()) as u64,
                    limit: self.dev.binding_limit,
                });
            }
        }
        Ok(())
    }

    /// Plans `name` in whole rows per chunk under the binding limit, and emits its bindings and
    /// element loader `ld_NAME(i)` (global element index).
    pub(super) fn tensor(
        &mut self,
        name: &str,
        role: BufferRole,
        elems: usize,
        store: Store,
        row_len: usize,
    ) -> Result<(), WgslError> {
        let (elem_bytes, values_per_elem) = match store {
            Store::Dtype => (self.dtype.bytes(), 1),
            Store::Activation => (self.dtype.activation().bytes(), 1),
            Store::F32 | Store::U32 => (4, 1),
            Store::Blocks => (
                self.dtype
                    .block_bytes(self.k.quant_block)
                    .expect("blocks of a quantized dtype"),
                self.k.quant_block,
            ),
        };
        if elems >= u32::MAX as usize {
            return Err(WgslError::TooLarge {
                what: format!("tensor `{name}`"),
                n: elems,
            });
        }
        let row_len = row_len.max(1);
        assert!(
            row_len.is_multiple_of(values_per_elem),
            "`{name}`: rows of {row_len} values are not whole blocks (the checker's and the input checks' job)"
        );
        let rows = elems.div_ceil(row_len).max(1);
        let row_bytes = (row_len / values_per_elem * elem_bytes) as u64;
        // Words must not straddle chunks: 16-bit chunks hold an even number of elements.
        // (Block chunks are whole rows of whole blocks, each its own buffer from its first byte.)
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
        if chunks > 1 && role != BufferRole::Weight {
            return Err(WgslError::Whole {
                tensor: name.to_string(),
                bytes: (elems / values_per_elem * elem_bytes) as u64,
                limit: self.dev.binding_limit,
            });
        }
        let plan = TensorPlan {
            name: name.to_string(),
            role,
            elems,
            elem_bytes,
            values_per_elem,
            integer: store == Store::U32,
            row_len,
            chunk_rows,
            chunks,
        };
        self.tensors.push(plan);
        Ok(())
    }

    pub(super) fn plan(&self, name: &str) -> &TensorPlan {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .expect("planned before use")
    }

    /// `var<...> NAME_c: array<...>;` per chunk and the loaders.
    pub(super) fn declarations(&self) -> String {
        let mut out = String::new();
        let mut binding = 0;
        for t in &self.tensors {
            let elem = self.storage_elem(t);
            let access = match t.role {
                BufferRole::Params => "uniform",
                BufferRole::Input | BufferRole::Weight => "storage, read",
                BufferRole::Scratch | BufferRole::Output | BufferRole::Indirect => {
                    "storage, read_write"
                }
            };
            for c in 0..t.chunks {
                let var = chunk_var(t, c);
                let ty = if t.role == BufferRole::Params {
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

    /// Whether this program's 16-bit tensors hold bf16 (the plain dtype, or the activations
    /// beside quantized weights), read by shifting into an f32's high half.
    fn bf16_halves(&self) -> bool {
        self.dtype.activation() == DType::Bf16
    }

    /// The WGSL element type a tensor is declared with.
    pub(super) fn storage_elem(&self, t: &TensorPlan) -> &'static str {
        match t.elem_bytes {
            _ if t.values_per_elem > 1 => "u32",
            2 if self.native_f16() => "f16",
            2 => "u32",
            _ if t.integer => "u32",
            _ => "f32",
        }
    }

    /// `ld_NAME_c(i) -> f32` for chunk-local element `i`.
    pub(super) fn loaders(&self) -> String {
        let mut out = String::new();
        for t in &self.tensors {
            if matches!(t.role, BufferRole::Params | BufferRole::Indirect) || t.integer {
                continue;
            }
            for c in 0..t.chunks {
                let var = chunk_var(t, c);
                if t.values_per_elem > 1 {
                    out.push_str(&self.block_loaders(&var, t));
                    continue;
                }
                let body = match (t.elem_bytes, self.storage_elem(t)) {
                    (2, "f16") => format!("return f32({var}[i]);"),
                    (2, _) if self.bf16_halves() => format!(
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
                    (2, _) if self.bf16_halves() => format!(
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
}

impl Emitter<'_> {
    /// The loaders of one chunk of quantized blocks of the spec's size, stored as
    /// `moek_ir::quant` lays them out (a scale, f16 or MXFP4's e8m0 byte, then the values group
    /// by group: Q8 as i8, Q4 and MXFP4 as 16 bytes of nibbles a group of 32, value `j` of a
    /// group in byte `j % 16`'s low nibble for `j < 16`, its high one after) and read as
    /// little-endian `u32` words: `byte_VAR(o)`, then `ld_VAR(i)` the exact value `i`
    /// (`d * q`, `d * (n - 8)`, `2^(e - 127) fp4(n)`; f32 subnormals, MXFP4 scales below
    /// 2^-126, are as the device keeps them) and `ld2_VAR(i)` values `i` and `i + 1`.
    fn block_loaders(&self, var: &str, t: &TensorPlan) -> String {
        let bytes = t.elem_bytes;
        let block = self.k.quant_block;
        const F16_SCALE: &str = "unpack2x16float(byte_VAR(o) | (byte_VAR(o + 1u) << 8u)).x";
        let (scale, value) = match self.dtype.blocks().expect("blocks of a quantized dtype") {
            BlockFormat::Q8_0 => (
                F16_SCALE,
                "let q = bitcast<i32>(byte_VAR(o + 2u + j) << 24u) >> 24u;\n    \
                 return d * f32(q);",
            ),
            BlockFormat::Q4_0 => (
                F16_SCALE,
                "let b = byte_VAR(o + 2u + (j >> 5u) * 16u + (j & 15u));\n    \
                 let n = select(b & 15u, b >> 4u, (j & 31u) >= 16u);\n    \
                 return d * (f32(n) - 8.0);",
            ),
            // e2m1 decoded in arithmetic (no table to index at run time): codes 0 and 1 are
            // 0 and 0.5, code m >= 2 is (1 + (m & 1) / 2) 2^((m >> 1) - 1); bit 3 the sign.
            BlockFormat::Mxfp4 => (
                "ldexp(1.0, i32(byte_VAR(o)) - 127)",
                "let b = byte_VAR(o + 1u + (j & 15u));\n    \
                 let n = select(b & 15u, b >> 4u, j >= 16u);\n    \
                 let m = n & 7u;\n    \
                 let v = select(ldexp(1.0 + 0.5 * f32(m & 1u), i32(m >> 1u) - 1), 0.5 * f32(m), m < 2u);\n    \
                 return d * select(v, -v, (n & 8u) != 0u);",
            ),
        };
        format!(
            "fn byte_VAR(o: u32) -> u32 {{\n    \
             return (VAR[o >> 2u] >> ((o & 3u) * 8u)) & 0xffu;\n}}\n\
             fn ld_VAR(i: u32) -> f32 {{\n    \
             let o = (i / {block}u) * {bytes}u;\n    \
             let j = i % {block}u;\n    \
             let d = {scale};\n    \
             {value}\n}}\n\
             fn ld2_VAR(i: u32) -> vec2<f32> {{\n    \
             return vec2<f32>(ld_VAR(i), ld_VAR(i + 1u));\n}}\n"
        )
        .replace("VAR", var)
    }
}

/// The loaders of one chunk of a tensor: `ld_VAR(i)` one element, `ld2_VAR(i)` a pair.
pub(super) struct ChunkLoad(String);

impl ChunkLoad {
    pub(super) fn ld(&self) -> String {
        format!("ld_{}", self.0)
    }

    pub(super) fn ld2(&self) -> String {
        format!("ld2_{}", self.0)
    }
}

/// `NAME_c(row, params..)` per chunk of `w`, with the body `body(that chunk's loaders)`, and
/// `NAME(row, params..)`, which picks the chunk holding `row`: rows never straddle chunks, so
/// inner loops have no switch. `params` are the `(name, type)` pairs after `row`.
pub(super) fn chunked_fn(
    name: &str,
    w: &TensorPlan,
    ret: &str,
    params: &[(&str, &str)],
    body: impl Fn(&ChunkLoad) -> String,
) -> String {
    let rest: Vec<&str> = params.iter().map(|p| p.0).collect();
    let call = |row: &str| [&[row][..], &rest].concat().join(", ");
    let decl: Vec<String> = params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
    let decl = [vec!["row: u32".to_string()], decl].concat().join(", ");
    let mut f = String::new();
    for c in 0..w.chunks {
        let ld = ChunkLoad(chunk_var(w, c));
        let _ = writeln!(f, "fn {name}_{c}({decl}) -> {ret} {{\n{}}}", body(&ld));
    }
    let _ = writeln!(f, "fn {name}({decl}) -> {ret} {{");
    if w.chunks == 1 {
        let _ = writeln!(f, "    return {name}_0({});\n}}", call("row"));
    } else {
        let per = w.chunk_rows;
        let _ = writeln!(f, "    let r = row % {per}u;\n    switch (row / {per}u) {{");
        for c in 0..w.chunks {
            let label = if c + 1 == w.chunks {
                "default".to_string()
            } else {
                format!("case {c}u")
            };
            let _ = writeln!(
                f,
                "        {label}: {{ return {name}_{c}({}); }}",
                call("r")
            );
        }
        let _ = writeln!(f, "    }}\n}}");
    }
    f
}

pub(super) fn chunk_var(t: &TensorPlan, c: usize) -> String {
    if t.role == BufferRole::Params {
        t.name.clone()
    } else {
        format!("{}_{c}", t.name)
    }
}

/// The store target of a one-chunk f32 tensor.
pub(super) fn ld_store(name: &str) -> String {
    format!("{name}_0")
}
