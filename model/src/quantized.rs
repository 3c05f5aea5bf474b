//! Weight matrices stored in quantized blocks (Q8_0, Q4_0; docs/quantization.md): the flag that
//! names a format and what it covers, a matrix as it is stored, a dense MLP in blocks, and
//! turning a plain matrix into blocks.
//!
//! Which matrices are quantized ([`Scope`]): by default every large one, as llama.cpp's types
//! do: the routed experts' banks, the embedding and LM head a family quantizes, attention's
//! projections and the dense MLPs ([`linear_tensor`]). `--quantize-experts-only` keeps
//! attention and the dense MLPs in the model's element type. The routers (a few hundred KB that
//! pick the experts) stay in the model's type and norms and scales in f32 either way.

use crate::checkpoint::{Checkpoint, LoadError, QUANTIZATION_KEY, Residence, block_shape};
use half::{bf16, f16};
use moek_kernels::Element;
use moek_kernels::blocks::quantize;
use moek_kernels::ir::quant::{BLOCK, BlockMxfp4, BlockQ4_0, BlockQ8_0};
use moek_kernels::ir::{BlockFormat, DType};
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use std::borrow::Cow;
use std::path::Path;

/// Which matrices `--quantize` puts in blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every large matrix: the experts' banks, the embedding and LM head the family quantizes,
    /// attention's projections and the dense MLPs.
    #[default]
    Whole,
    /// The experts' banks and the embedding and LM head only (`--quantize-experts-only`).
    Experts,
}

/// `--quantize`: a block format and the matrices it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quantize {
    pub format: BlockFormat,
    pub scope: Scope,
}

impl Quantize {
    /// Every large matrix in `format`'s blocks.
    pub fn whole(format: BlockFormat) -> Quantize {
        Quantize {
            format,
            scope: Scope::Whole,
        }
    }

    /// The format of the banks, embedding and LM head (`.0`) and of attention's projections
    /// and the dense MLPs (`.1`) under `quantize`.
    pub fn formats(quantize: Option<Quantize>) -> (Option<BlockFormat>, Option<BlockFormat>) {
        let banks = quantize.map(|q| q.format);
        let linears = quantize.and_then(|q| (q.scope == Scope::Whole).then_some(q.format));
        (banks, linears)
    }
}

/// `format` for a linear matrix of `shape` (`[out, in]`), or `None` where its rows are not whole
/// blocks: such a matrix stays in the model's type, as llama.cpp keeps its odd-width tensors in
/// a wider type, where an expert bank of that width is an error.
pub fn for_rows(format: Option<BlockFormat>, shape: &[usize]) -> Option<BlockFormat> {
    format.filter(|_| whole_blocks(&shape[shape.len() - 1..]))
}

/// Whether a dense MLP of `[f, h]` goes in blocks: both extents whole blocks, its three
/// matrices together or not at all (down's rows are gate's and up's outputs).
pub fn dense_in_blocks(f: usize, h: usize) -> bool {
    whole_blocks(&[f, h])
}

/// Whether every extent is whole blocks.
fn whole_blocks(extents: &[usize]) -> bool {
    extents.iter().all(|n| n % BLOCK == 0)
}

/// Whether checkpoint tensor `name` is one of attention's projections or a dense MLP's
/// matrices (never a router, an expert's matrix or a norm), in any family's naming.
pub fn linear_tensor(name: &str) -> bool {
    let attention = name.contains(".self_attn.") && name.ends_with("_proj.weight");
    attention || dense_tensor(name)
}

/// Whether checkpoint tensor `name` is a dense MLP's matrix.
fn dense_tensor(name: &str) -> bool {
    [
        ".mlp.gate_proj.weight",
        ".mlp.up_proj.weight",
        ".mlp.down_proj.weight",
    ]
    .iter()
    .any(|m| name.ends_with(m))
}

/// Whether the linear matrix `name` of `shape` can go in blocks: its rows whole blocks
/// ([`for_rows`]), a dense MLP's matrix both its extents ([`dense_in_blocks`]).
pub fn linear_in_blocks(name: &str, shape: &[usize]) -> bool {
    match dense_tensor(name) {
        true => whole_blocks(shape),
        false => whole_blocks(&shape[shape.len() - 1..]),
    }
}

/// A weight matrix as it is stored: in the model's element type `W`, or in blocks.
#[derive(Debug)]
pub enum Stored<'c, W: Clone> {
    Plain(Cow<'c, [W]>),
    Q8_0(Cow<'c, [BlockQ8_0]>),
    Q4_0(Cow<'c, [BlockQ4_0]>),
    Mxfp4(Cow<'c, [BlockMxfp4]>),
}

impl<W: Element> Stored<'_, W> {
    /// Bytes as stored (scales included).
    pub fn bytes(&self) -> usize {
        match self {
            Stored::Plain(m) => size_of_val(&m[..]),
            Stored::Q8_0(b) => size_of_val(&b[..]),
            Stored::Q4_0(b) => size_of_val(&b[..]),
            Stored::Mxfp4(b) => size_of_val(&b[..]),
        }
    }

    /// The kernel dtype the matrix is stored in.
    pub fn dtype(&self) -> DType {
        match self {
            Stored::Plain(_) => W::DTYPE,
            Stored::Q8_0(_) => DType::Q8_0,
            Stored::Q4_0(_) => DType::Q4_0,
            Stored::Mxfp4(_) => DType::Mxfp4,
        }
    }

    /// Row `i` (of `len` values) as f32: widened, or its blocks' exact values.
    pub fn row(&self, i: usize, len: usize) -> Vec<f32> {
        let blocks = (i * len / BLOCK)..((i + 1) * len / BLOCK);
        match self {
            Stored::Plain(m) => m[i * len..(i + 1) * len]
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            Stored::Q8_0(b) => moek_kernels::ir::quant::dequantize(&b[blocks.clone()]),
            Stored::Q4_0(b) => moek_kernels::ir::quant::dequantize(&b[blocks.clone()]),
            Stored::Mxfp4(b) => moek_kernels::ir::quant::dequantize(&b[blocks.clone()]),
        }
    }

    /// The same matrix, borrowed.
    pub fn borrowed(&self) -> Stored<'_, W> {
        match self {
            Stored::Plain(m) => Stored::Plain(Cow::Borrowed(m)),
            Stored::Q8_0(b) => Stored::Q8_0(Cow::Borrowed(b)),
            Stored::Q4_0(b) => Stored::Q4_0(Cow::Borrowed(b)),
            Stored::Mxfp4(b) => Stored::Mxfp4(Cow::Borrowed(b)),
        }
    }

    /// `values` in `quant`'s blocks (as they are, for `None`).
    pub fn quantize(values: Cow<'_, [W]>, quant: Option<BlockFormat>) -> Stored<'_, W> {
        match quant {
            None => Stored::Plain(values),
            Some(BlockFormat::Q8_0) => Stored::Q8_0(Cow::Owned(quantize(&values))),
            Some(BlockFormat::Q4_0) => Stored::Q4_0(Cow::Owned(quantize(&values))),
            Some(BlockFormat::Mxfp4) => Stored::Mxfp4(Cow::Owned(quantize(&values))),
        }
    }
}

/// A dense MLP's matrices: in `W` as the checkpoint stores them (read in place), or in blocks
/// as the bank of one expert that every token routes to with weight 1, the gate's rows then
/// the up's (`[1, 2F, H]`, joined at load), so that the quantized expert FFN variants serve it
/// (the product is the same: one route, weighted exactly 1).
#[derive(Debug)]
pub enum DenseMlp<'c, W: Clone> {
    Plain {
        gate_proj: Cow<'c, [W]>,
        up_proj: Cow<'c, [W]>,
        down_proj: Cow<'c, [W]>,
    },
    Blocks {
        gate_up_proj: Stored<'c, W>,
        down_proj: Stored<'c, W>,
    },
}

impl<'c, W: Element> DenseMlp<'c, W> {
    /// The MLP of `gate`, `up` and `down` (each with its checkpoint name): plain if all three
    /// are, in blocks if all three share a format; a mix is an error naming the odd tensor.
    pub fn new(
        [(gate_name, gate), (up_name, up), (down_name, down)]: [(String, Stored<'c, W>); 3],
    ) -> Result<DenseMlp<'c, W>, LoadError> {
        let mismatch = |name: String, found: DType| LoadError::DType {
            tensor: name,
            expected: format!("{} (as `{gate_name}` is stored)", gate.dtype()),
            found: found.to_string(),
        };
        if up.dtype() != gate.dtype() {
            return Err(mismatch(up_name, up.dtype()));
        }
        if down.dtype() != gate.dtype() {
            return Err(mismatch(down_name, down.dtype()));
        }
        fn joined<B: Clone>(a: &[B], b: &[B]) -> Cow<'static, [B]> {
            Cow::Owned([a, b].concat())
        }
        let gate_up_proj = match (gate, up) {
            (Stored::Plain(gate_proj), Stored::Plain(up_proj)) => {
                let Stored::Plain(down_proj) = down else {
                    unreachable!("dtypes compared above")
                };
                return Ok(DenseMlp::Plain {
                    gate_proj,
                    up_proj,
                    down_proj,
                });
            }
            (Stored::Q8_0(g), Stored::Q8_0(u)) => Stored::Q8_0(joined(&g, &u)),
            (Stored::Q4_0(g), Stored::Q4_0(u)) => Stored::Q4_0(joined(&g, &u)),
            (Stored::Mxfp4(g), Stored::Mxfp4(u)) => Stored::Mxfp4(joined(&g, &u)),
            _ => unreachable!("dtypes compared above"),
        };
        Ok(DenseMlp::Blocks {
            gate_up_proj,
            down_proj: down,
        })
    }

    /// Bytes as stored.
    pub fn bytes(&self) -> usize {
        match self {
            DenseMlp::Plain {
                gate_proj,
                up_proj,
                down_proj,
            } => {
                size_of_val(&gate_proj[..])
                    + size_of_val(&up_proj[..])
                    + size_of_val(&down_proj[..])
            }
            DenseMlp::Blocks {
                gate_up_proj,
                down_proj,
            } => gate_up_proj.bytes() + down_proj.bytes(),
        }
    }
}

/// Expert bank `names` (of `shape` values) from `ck`: its blocks if it is stored quantized,
/// else the matrix in `W`, quantized to `quantize` as it is read if that is set.
pub fn read_bank<'c, W: Element>(
    ck: &'c Checkpoint,
    names: &[String],
    shape: &[usize],
    residence: Residence,
    quantize: Option<BlockFormat>,
) -> Result<Stored<'c, W>, LoadError> {
    match (ck.quantized(names), quantize) {
        (Some(BlockFormat::Q8_0), _) => Ok(Stored::Q8_0(ck.blocks(names, shape, residence)?)),
        (Some(BlockFormat::Q4_0), _) => Ok(Stored::Q4_0(ck.blocks(names, shape, residence)?)),
        (Some(BlockFormat::Mxfp4), _) => Ok(Stored::Mxfp4(ck.blocks(names, shape, residence)?)),
        (None, None) => Ok(Stored::Plain(ck.matrix(names, shape, residence)?)),
        (None, Some(BlockFormat::Q8_0)) => {
            Ok(Stored::Q8_0(Cow::Owned(ck.quantize::<W, _>(names, shape)?)))
        }
        (None, Some(BlockFormat::Q4_0)) => {
            Ok(Stored::Q4_0(Cow::Owned(ck.quantize::<W, _>(names, shape)?)))
        }
        (None, Some(BlockFormat::Mxfp4)) => Ok(Stored::Mxfp4(Cow::Owned(
            ck.quantize::<W, _>(names, shape)?,
        ))),
    }
}

/// Bytes `ck`'s tensors take once loaded: the checkpoint's own, the plain ones its family
/// quantizes (`quantized`, the family row's choice) at `quantize`'s size when that is set.
pub fn resident_bytes(
    ck: &Checkpoint,
    quantize: Option<Quantize>,
    quantized: fn(&str, Scope) -> bool,
) -> usize {
    ck.sizes()
        .map(|(name, dtype, bytes)| match quantize {
            Some(q) if quantized(name, q.scope) && dtype != safetensors::Dtype::U8 => {
                let stored = q.format.block_bytes(BLOCK) as f64;
                let per_value = stored / BLOCK as f64;
                (bytes as f64 / dtype.bitsize() as f64 * 8.0 * per_value) as usize
            }
            _ => bytes,
        })
        .sum()
}

/// Whether the Gemma-4 checkpoint tensor `name` is one `--quantize` of `scope` quantizes (the
/// build table reads these through `Source::bank` and `Source::linear`).
pub fn quantized_tensor(name: &str, scope: Scope) -> bool {
    name.contains(".experts.")
        || name.ends_with("embed_tokens.weight")
        || name == "lm_head.weight"
        || (scope == Scope::Whole && linear_tensor(name))
}

/// `ck` written to `path` as one safetensors file: every tensor `quantized(name, scope)` picks
/// (a family's choice, `open::FamilyRow::quantized`) in `quant`'s blocks, a `u8` tensor of
/// [`block_shape`]; every other tensor as it is stored; the format named in the metadata
/// ([`QUANTIZATION_KEY`]). One writer for every family: each family's loader reads its
/// quantized tensors by the names they had. Returns the names written in blocks.
pub fn write_quantized(
    ck: &Checkpoint,
    quantized: fn(&str, Scope) -> bool,
    Quantize {
        format: quant,
        scope,
    }: Quantize,
    path: &Path,
) -> Result<Vec<String>, LoadError> {
    fn blocks_of<Q: Element>(
        ck: &Checkpoint,
        name: &str,
        dtype: Dtype,
        shape: &[usize],
    ) -> Result<Vec<u8>, LoadError> {
        let key = [name.to_string()];
        let blocks: Vec<Q> = match dtype {
            Dtype::BF16 => ck.quantize::<bf16, Q>(&key, shape)?,
            Dtype::F16 => ck.quantize::<f16, Q>(&key, shape)?,
            _ => ck.quantize::<f32, Q>(&key, shape)?,
        };
        Ok(bytemuck::cast_slice(&blocks).to_vec())
    }
    // Every tensor as it will be written: its blocks (owned), or its stored bytes (mapped).
    let mut tensors = vec![];
    for (name, _, _) in ck.sizes() {
        let (dtype, shape, bytes) = ck.raw(name).expect("a listed tensor");
        let plain = matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32);
        let whole_rows = !linear_tensor(name) || linear_in_blocks(name, shape);
        tensors.push(
            if quantized(name, scope) && plain && shape.len() >= 2 && whole_rows {
                match quant {
                    BlockFormat::Q8_0 => (
                        name,
                        Dtype::U8,
                        block_shape::<BlockQ8_0>(shape),
                        Cow::Owned(blocks_of::<BlockQ8_0>(ck, name, dtype, shape)?),
                    ),
                    BlockFormat::Q4_0 => (
                        name,
                        Dtype::U8,
                        block_shape::<BlockQ4_0>(shape),
                        Cow::Owned(blocks_of::<BlockQ4_0>(ck, name, dtype, shape)?),
                    ),
                    BlockFormat::Mxfp4 => (
                        name,
                        Dtype::U8,
                        block_shape::<BlockMxfp4>(shape),
                        Cow::Owned(blocks_of::<BlockMxfp4>(ck, name, dtype, shape)?),
                    ),
                }
            } else {
                (name, dtype, shape.to_vec(), Cow::Borrowed(bytes))
            },
        );
    }
    let format = |why: String| LoadError::Format {
        path: path.to_path_buf(),
        why,
    };
    let views = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(*dtype, shape.clone(), bytes)
                .map(|view| (*name, view))
                .map_err(|e| format(format!("`{name}` cannot be written: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata =
        std::collections::HashMap::from([(QUANTIZATION_KEY.to_string(), quant.name().to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| format(e.to_string()))?;
    Ok(tensors
        .iter()
        .filter(|(_, _, _, bytes)| matches!(bytes, Cow::Owned(_)))
        .map(|(name, ..)| name.to_string())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::{Kernels, dense_mlp};
    use half::bf16;
    use moek_kernels::ir::Activation;
    use moek_kernels::ir::quant::dequantize;
    use moek_kernels::testing::uniform;

    /// A dense MLP in MXFP4 blocks (the activation unrounded) runs as one expert routed with
    /// weight 1 and computes what the dense kernel computes on the blocks' exact values, f32
    /// sums apart.
    #[test]
    fn a_dense_mlp_in_blocks_computes_the_dense_mlp_of_its_values() {
        let (h, f) = (64, 96);
        let shapes = [("gate", f, h), ("up", f, h), ("down", h, f)];
        let blocks: Vec<Vec<BlockMxfp4>> = (0..3)
            .map(|i| quantize(&uniform::<f32>(f * h, 7 + i, 0.3)))
            .collect();
        let mlp = |plain: bool| {
            let parts = std::array::from_fn(|i| {
                let m = match plain {
                    true => Stored::Plain(Cow::Owned(dequantize(&blocks[i]))),
                    false => Stored::Mxfp4(Cow::Borrowed(&blocks[i][..])),
                };
                (format!("mlp.{}_proj.weight", shapes[i].0), m)
            });
            DenseMlp::<f32>::new(parts).unwrap()
        };
        let kernels = Kernels::new(moek_kernels::Backend::cpu());
        // A few rows take the row products, a prompt the GEMMs over the blocks.
        for (t, kernel) in [
            (3, "dense_mlp_quantized_silu"),
            (5, "dense_mlp_quantized_prefill_silu"),
        ] {
            let x = uniform::<f32>(t * h, 3, 1.0);
            let run = |m: &DenseMlp<'_, f32>| {
                let mut trace = vec![];
                let y =
                    dense_mlp(&kernels, 0, &x, (h, f), m, Activation::Silu, &mut trace).unwrap();
                (y, trace.pop().unwrap())
            };
            let ((got, ran), (want, _)) = (run(&mlp(false)), run(&mlp(true)));
            assert_eq!(ran.choice.kernel, kernel, "{ran:?}");
            let err = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(err <= 1e-5 * scale, "{t} rows: max error {err} of {scale}");
        }
    }

    #[test]
    fn a_quantized_matrix_dequantizes_near_its_values() {
        let values: Vec<bf16> = (0..4 * BLOCK)
            .map(|i| bf16::from_f32((i as f32 * 0.37).sin()))
            .collect();
        let Stored::Q8_0(b) = Stored::quantize(Cow::Borrowed(&values[..]), Some(BlockFormat::Q8_0))
        else {
            panic!("asked for Q8_0");
        };
        assert_eq!(b.len(), 4);
        for (got, want) in dequantize(&b).iter().zip(&values) {
            assert!(
                (got - want.to_f32()).abs() <= 1.0 / 254.0 + 1e-3,
                "{got} vs {want}"
            );
        }
    }
}
