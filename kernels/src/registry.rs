//! A spec's entry: its IR (parsed from the JSON the macro embedded) and its compiled variants.

use crate::inputs::Inputs;
use half::{bf16, f16};
use moek_ir::cpu::Tables;
use moek_ir::reference::Shape;
use moek_ir::{BlockFormat, Element, Kernel, Kind};
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
    /// MXFP4 weights (32 values a block) beside f32 or bf16 activations.
    pub mxfp4: BlockFns,
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
    /// The variant for weights stored as `W` beside activations in `A` (plain: `A` is `W`),
    /// if the spec declares that dtype (and block size) and `cpu` is on.
    pub fn get<W: Element, A: Element>(&self) -> Option<CpuFn<W, A>> {
        /// `f` if it is the variant asked for (its type names the element types).
        fn exactly<F: Copy + 'static, G: Copy + 'static>(f: Option<F>) -> Option<G> {
            (&f as &dyn Any)
                .downcast_ref::<Option<G>>()
                .copied()
                .flatten()
        }
        fn of_block<Q: Element, A: Element>(
            fns: Option<&'static QuantFns<Q>>,
        ) -> Option<CpuFn<Q, A>> {
            let fns = fns?;
            exactly(fns.f32).or_else(|| exactly(fns.bf16))
        }
        match W::KIND {
            Kind::Plain(_) => exactly(self.f16)
                .or_else(|| exactly(self.bf16))
                .or_else(|| exactly(self.f32)),
            Kind::Blocks(BlockFormat::Q8_0) => of_block(self.q8_0.get::<W>()),
            Kind::Blocks(BlockFormat::Q4_0) => of_block(self.q4_0.get::<W>()),
            Kind::Blocks(BlockFormat::Mxfp4) => of_block(self.mxfp4.get::<W>()),
        }
    }

    pub const NONE: CpuFns = CpuFns {
        f16: None,
        bf16: None,
        f32: None,
        q8_0: BlockFns::NONE,
        q4_0: BlockFns::NONE,
        mxfp4: BlockFns::NONE,
    };
}

/// Everything dispatch and tools know of one spec.
#[derive(Clone, Debug)]
pub struct KernelEntry {
    ir: Kernel,
    cpu_source: &'static str,
    pub cpu: CpuFns,
    /// The CPU schedule built at run time, for an entry without compiled CPU functions.
    tables: Option<Tables<'static>>,
}

impl KernelEntry {
    /// Built by generated code from the IR the macro validated.
    pub fn new(ir_json: &str, cpu_source: &'static str, cpu: CpuFns) -> Self {
        let ir = serde_json::from_str(ir_json).expect("the macro embeds valid IR JSON");
        KernelEntry {
            ir,
            cpu_source,
            cpu,
            tables: None,
        }
    }

    /// An entry for a schedule given at run time (a candidate `moek tune` times, say): its CPU
    /// variant is the schedule's tables run by the same skeletons a compiled variant calls, so
    /// it needs no rebuild; the other backends lower the IR as they do for every entry. The IR
    /// must be one the checker accepted (a compiled spec's, or a candidate that passed
    /// `moek_dsl`'s checks): nothing here re-validates it.
    pub fn scheduled(ir: Kernel) -> Self {
        KernelEntry {
            tables: Some(Tables::of(&ir)),
            ir,
            cpu_source: "",
            cpu: CpuFns::NONE,
        }
    }

    /// The schedule tables of an entry built by [`KernelEntry::scheduled`].
    pub fn run_time_tables(&self) -> Option<&Tables<'static>> {
        self.tables.as_ref()
    }

    /// The CPU variant's Rust source, as the macro generated it (empty without a CPU target).
    pub fn cpu_source(&self) -> &'static str {
        self.cpu_source
    }

    pub fn ir(&self) -> &Kernel {
        &self.ir
    }

    pub fn name(&self) -> &str {
        &self.ir.name
    }
}

/// Where an entry stands among entries that serve a request equally specifically: dispatch
/// prefers the more specific spec first (dims, bounds, schedule decisions), then the lower rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rank(pub i64);

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.0)
    }
}

/// Why entries cannot join a registry.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("two entries are named `{name}`: a variant is requested by name, so names are unique")]
    Duplicate { name: String },
}

/// The specs dispatch chooses from, each with its [`Rank`], held in rank order. Nothing reads a
/// global list: dispatch, the commands and the model each take a registry, so a user's specs
/// (`kernel!` gives each block an `entries()` function) serve the model beside the built-ins.
#[derive(Clone, Debug, Default)]
pub struct Registry {
    entries: Vec<(Rank, KernelEntry)>,
}

impl Registry {
    /// No entries (dispatch then finds none eligible).
    pub fn empty() -> Registry {
        Registry::default()
    }

    /// The built-in specs (`crate::specs`), ranked 0, 1, ... in declaration order.
    pub fn builtin() -> Registry {
        static BUILTIN: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
        BUILTIN
            .get_or_init(|| {
                Registry::empty()
                    .with_ranked(crate::specs::entries(), Rank(0))
                    .expect("built-in spec names are unique")
            })
            .clone()
    }

    /// This registry with `entries` ranked ahead of every entry it holds, in their order.
    pub fn with(
        self,
        entries: impl IntoIterator<Item = KernelEntry>,
    ) -> Result<Registry, RegistryError> {
        let entries: Vec<KernelEntry> = entries.into_iter().collect();
        let first = self.entries.first().map_or(0, |(r, _)| r.0) - entries.len() as i64;
        self.with_ranked(entries, Rank(first))
    }

    /// This registry with `entries` at ranks `first`, `first + 1`, ... (a rank already held
    /// keeps its entry ahead of the newcomer).
    pub fn with_ranked(
        mut self,
        entries: impl IntoIterator<Item = KernelEntry>,
        first: Rank,
    ) -> Result<Registry, RegistryError> {
        for (i, entry) in entries.into_iter().enumerate() {
            if self.get(entry.name()).is_some() {
                return Err(RegistryError::Duplicate {
                    name: entry.name().to_string(),
                });
            }
            let rank = Rank(first.0 + i as i64);
            let at = self.entries.partition_point(|(r, _)| *r <= rank);
            self.entries.insert(at, (rank, entry));
        }
        Ok(self)
    }

    /// Every entry, in rank order.
    pub fn entries(&self) -> impl Iterator<Item = &KernelEntry> {
        self.entries.iter().map(|(_, e)| e)
    }

    /// Every entry with its rank, in rank order.
    pub fn ranked(&self) -> impl Iterator<Item = (Rank, &KernelEntry)> {
        self.entries.iter().map(|(r, e)| (*r, e))
    }

    /// The entry named `name`.
    pub fn get(&self, name: &str) -> Option<&KernelEntry> {
        self.entries().find(|e| e.name() == name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
