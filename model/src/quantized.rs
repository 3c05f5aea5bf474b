//! Weight matrices stored in quantized blocks (Q8_0, Q4_0; docs/quantization.md): the flag that
//! names a format, a matrix as it is stored, and turning a plain matrix into blocks.
//!
//! Which matrices are quantized ([`quantized_tensor`]): the routed experts' banks
//! (`gate_up_proj`, `down_proj`, 93% of the 26B-A4B's weights) and the embedding with the LM
//! head it is tied to (the largest single matrix a decode step reads: 1.5 GB in bf16).
//! Attention, the dense MLP and the router stay in the model's element type; norms and scales
//! stay f32.

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
    quantize: Option<BlockFormat>,
    quantized: fn(&str) -> bool,
) -> usize {
    ck.sizes()
        .map(|(name, dtype, bytes)| match quantize {
            Some(q) if quantized(name) && dtype != safetensors::Dtype::U8 => {
                let stored = q.block_bytes(BLOCK) as f64;
                let per_value = stored / BLOCK as f64;
                (bytes as f64 / dtype.bitsize() as f64 * 8.0 * per_value) as usize
            }
            _ => bytes,
        })
        .sum()
}

/// Whether the checkpoint tensor `name` is one `--quantize` quantizes (the build table reads
/// these through `Source::bank`).
pub fn quantized_tensor(name: &str) -> bool {
    name.contains(".experts.") || name.ends_with("embed_tokens.weight") || name == "lm_head.weight"
}

/// `ck` written to `path` as one safetensors file: every tensor `quantized(name)` picks (a
/// family's choice, `open::FamilyRow::quantized`) in `quant`'s blocks, a `u8` tensor of
/// [`block_shape`]; every other tensor as it is stored; the format named in the metadata
/// ([`QUANTIZATION_KEY`]). One writer for every family: each family's loader reads its
/// quantized tensors by the names they had. Returns the names written in blocks.
pub fn write_quantized(
    ck: &Checkpoint,
    quantized: fn(&str) -> bool,
    quant: BlockFormat,
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
        tensors.push(if quantized(name) && plain && shape.len() >= 2 {
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
        });
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
    use half::bf16;
    use moek_kernels::ir::quant::dequantize;

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
