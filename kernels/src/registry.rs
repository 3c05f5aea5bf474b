//! A spec's entry: its IR (parsed from the JSON the macro embedded) and its compiled variants.

use crate::inputs::Inputs;
use half::{bf16, f16};
use moek_ir::Kernel;
use moek_ir::reference::Shape;
use std::any::Any;
use std::fmt;

/// A compiled CPU variant for one dtype: weights stored as `W`, activations in `A`. Returns the
/// argmax for `lm_head_row`, `None` otherwise.
pub type CpuFn<W, A = W> = fn(&Shape, &Inputs<'_, W, A>, &mut [f32]) -> Option<u32>;

/// One CPU variant per dtype the spec declares (`None` for the others, or when `cpu` is off).
#[derive(Clone, Copy, Debug)]
pub struct CpuFns {
    pub f16: Option<CpuFn<f16>>,
    pub bf16: Option<CpuFn<bf16>>,
    pub f32: Option<CpuFn<f32>>,
    /// Q8_0 weights (at the spec's block size) beside f32 or bf16 activations.
    pub q8_0: BlockFns,
    /// Q4_0 weights (at the spec's block size) beside f32 or bf16 activations.
    pub q4_0: BlockFns,
}

/// One block format's variants ([`QuantFns`]) at the block size the spec declares. A block size
/// is a type (`BlockQ8<G>`), so the table holds them as `Any`, one table type for every size;
/// [`BlockFns::get`] reads them back at the block type a caller's weights are stored in, and
/// finds none for another size.
#[derive(Clone, Copy)]
pub struct BlockFns(Option<&'static (dyn Any + Send + Sync)>);

impl BlockFns {
    pub const NONE: BlockFns = BlockFns(None);

    pub const fn new<Q: 'static>(fns: &'static QuantFns<Q>) -> Self {
        BlockFns(Some(fns))
    }

    /// The variants for weights in blocks of `Q`, if the spec's block size is `Q`'s.
    pub fn get<Q: 'static>(&self) -> Option<&'static QuantFns<Q>> {
        self.0?.downcast_ref()
    }
}

impl fmt::Debug for BlockFns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(_) => f.write_str("BlockFns(..)"),
            None => f.write_str("BlockFns::NONE"),
        }
    }
}

/// The CPU variants for weights in blocks of `Q`, one per activation dtype.
#[derive(Clone, Copy, Debug)]
pub struct QuantFns<Q: 'static> {
    pub f32: Option<CpuFn<Q, f32>>,
    pub bf16: Option<CpuFn<Q, bf16>>,
}

impl<Q> QuantFns<Q> {
    pub const NONE: QuantFns<Q> = QuantFns {
        f32: None,
        bf16: None,
    };
}

impl CpuFns {
    pub const NONE: CpuFns = CpuFns {
        f16: None,
        bf16: None,
        f32: None,
        q8_0: BlockFns::NONE,
        q4_0: BlockFns::NONE,
    };
}

/// Everything dispatch and tools know of one spec.
#[derive(Clone, Debug)]
pub struct KernelEntry {
    ir: Kernel,
    pub cpu: CpuFns,
}

impl KernelEntry {
    /// Built by generated code from the IR the macro validated.
    pub fn new(ir_json: &str, cpu: CpuFns) -> Self {
        let ir = serde_json::from_str(ir_json).expect("the macro embeds valid IR JSON");
        KernelEntry { ir, cpu }
    }

    pub fn ir(&self) -> &Kernel {
        &self.ir
    }

    pub fn name(&self) -> &str {
        &self.ir.name
    }
}
