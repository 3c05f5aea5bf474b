//! The backends as dispatch and the test harness both see them: one object-safe [`Runtime`] per
//! target (its target, whether this build has it, its capabilities, the tolerance its results
//! are held to, and how it runs a variant on inputs of any storage), [`runtime`], the one place a
//! target finds its runtime, and [`run`], the one run path for plain and quantized weights.

use crate::dispatch::Backend;
use crate::inputs::AnyInputs;
use crate::registry::KernelEntry;
use moek_ir::Element;
use moek_ir::reference::Shape;
use moek_ir::tolerance::{Tolerance, tolerance, tolerance_dl16};
use moek_ir::{Capability, DType, Kernel, Target};

/// What a run gave besides its output.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ran {
    /// The LM head's argmax, where the backend computes it.
    pub argmax: Option<u32>,
    /// The cost model's figures, for a simulated backend.
    pub modeled: Option<Modeled>,
    /// What the run sent from the host to a device, for a device backend.
    pub uploaded: Option<Uploaded>,
}

/// Bytes sent from the host to a device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uploaded {
    /// Weight tensors (none once they are resident).
    pub weights: u64,
    /// Everything else: activations, routes and the outputs' initial contents.
    pub other: u64,
}

impl std::ops::Sub for Uploaded {
    type Output = Uploaded;
    fn sub(self, before: Uploaded) -> Uploaded {
        Uploaded {
            weights: self.weights - before.weights,
            other: self.other - before.other,
        }
    }
}

impl std::ops::AddAssign for Uploaded {
    fn add_assign(&mut self, o: Uploaded) {
        self.weights += o.weights;
        self.other += o.other;
    }
}

/// Weights kept on the device across runs, shared by every clone of the [`Backend`] that holds
/// it (see [`Backend::with_resident_weights`]). The wgpu session is opened on first use.
#[derive(Clone, Default)]
pub struct Resident {
    #[cfg(feature = "wgpu")]
    session: std::sync::Arc<std::sync::Mutex<Option<crate::wgpu::Session<'static>>>>,
}

impl Resident {
    /// Whether `self` and `other` are the same kept weights.
    pub fn same(&self, other: &Resident) -> bool {
        #[cfg(feature = "wgpu")]
        return std::sync::Arc::ptr_eq(&self.session, &other.session);
        #[cfg(not(feature = "wgpu"))]
        {
            let _ = other;
            true
        }
    }

    /// Bytes uploaded through it so far.
    pub fn uploaded(&self) -> Uploaded {
        #[cfg(feature = "wgpu")]
        if let Some(s) = &*self.session.lock().unwrap_or_else(|e| e.into_inner()) {
            return s.uploaded();
        }
        Uploaded::default()
    }
}

impl std::fmt::Debug for Resident {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Resident({:?})", self.uploaded())
    }
}

/// The Spyre cost model's figures for one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Modeled {
    pub seconds: f64,
    /// What bounds the slowest phase.
    pub dominant: String,
    /// Bytes between device memory and LX, and over the ring.
    pub dev_bytes: u64,
    pub ring_bytes: u64,
    /// Of `dev_bytes`, the selected-weight copies' (the device compiler's, where a gathered bank
    /// is not blocked).
    pub copy_bytes: u64,
    pub lx_peak: usize,
}

#[cfg(feature = "spyre")]
impl Modeled {
    pub fn of(c: &moek_spyre::Cost) -> Self {
        let dominant = c
            .phases
            .iter()
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map_or(String::new(), |p| p.2.to_string());
        Modeled {
            seconds: c.seconds,
            dominant,
            dev_bytes: c.dev_bytes,
            ring_bytes: c.ring_bytes,
            copy_bytes: c.copy_bytes,
            lx_peak: c.lx_peak,
        }
    }
}

/// One backend runtime, behind `dyn Runtime`: its target, whether this build has it, what it
/// provides, the tolerance its results are held to, and how it runs a variant on inputs of any
/// storage ([`AnyInputs`]). [`runtime`] is the one place a target finds its runtime.
pub trait Runtime: Send + Sync + std::fmt::Debug {
    fn target(&self) -> Target;
    /// Whether this build has the backend (its cargo feature).
    fn compiled(&self) -> bool;
    /// What it provides; a spec's `requires` is checked against this.
    fn capabilities(&self) -> Vec<Capability>;
    /// The tolerance `kernel`'s results in `dtype` are held to against the f64 reference.
    fn tolerance(&self, kernel: &Kernel, dtype: DType) -> Tolerance {
        let _ = kernel;
        tolerance(dtype)
    }
    /// Binds `inputs` and runs `entry`'s variant (with the weights `resident` keeps, if any),
    /// writing `out`. Shapes, inputs, the dtype and the optional tensors were checked.
    fn run(
        &self,
        resident: Option<&Resident>,
        entry: &KernelEntry,
        shape: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Result<Ran, String>;
}

/// The runtime of `target`: the one place a target is matched to its backend.
pub fn runtime(target: Target) -> std::sync::Arc<dyn Runtime> {
    match target {
        Target::Cpu => std::sync::Arc::new(Cpu),
        Target::Spyre => std::sync::Arc::new(Spyre),
        Target::Wgpu => std::sync::Arc::new(Wgpu),
    }
}

/// The CPU: the generated Rust function of the variant's storage.
#[derive(Debug)]
pub struct Cpu;

impl Runtime for Cpu {
    fn target(&self) -> Target {
        Target::Cpu
    }

    fn compiled(&self) -> bool {
        cfg!(feature = "cpu")
    }

    /// The CPU reads expert banks in place by route (the checkpoint layout is its
    /// indexed-selection layout, and no read copies the selected weights). It has no LX
    /// scratchpad, so it lacks `lx_completed_sum`: the persistent Spyre-shaped prefill is tested
    /// on the CPU but not dispatched there (the grouped prefill is the CPU's algorithm).
    fn capabilities(&self) -> Vec<Capability> {
        vec![
            Capability::IndexedSelectionLayout,
            Capability::ReadCopyElision,
        ]
    }

    /// The dtype's, except for quantized weights multiplied as GEMM operands (tokens grouped
    /// by expert), by what this process's GEMM over blocks rounds: where it dequantizes them
    /// exactly beside an activation that is never rounded, the limits of the type the gated
    /// activation is kept in (f32 beside Q8_0 and Q4_0, accumulation only, as on wgpu; the
    /// activation's own beside MXFP4); where it rounds both operands to bf16 (AMX or
    /// the `vdpbf16ps` tile), to bf16's limits, the rounding the plain bf16 variants carry;
    /// where it multiplies in integers, the dtype's own, as the row products.
    fn tolerance(&self, kernel: &Kernel, dtype: DType) -> Tolerance {
        #[cfg(feature = "cpu")]
        use moek_cpu::quant::{GemmRounding, gated_dtype, gemm_rounding};
        let gemm = !moek_ir::cpu::Skeleton::of(kernel).reads_weights_apart();
        match dtype.blocks().filter(|_| gemm) {
            None => tolerance(dtype),
            #[cfg(feature = "cpu")]
            Some(format) => match gemm_rounding(format) {
                // The gated activation between the two products (`moek_cpu::Weight::Gated`).
                GemmRounding::Nothing => tolerance(gated_dtype(format, dtype.activation())),
                GemmRounding::Bf16 => tolerance(DType::Bf16),
                GemmRounding::Activation8 => tolerance(dtype),
            },
            #[cfg(not(feature = "cpu"))]
            Some(_) => tolerance(DType::F32),
        }
    }

    fn run(
        &self,
        _: Option<&Resident>,
        entry: &KernelEntry,
        shape: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Result<Ran, String> {
        /// The plain variant for `W`, if the spec has one.
        fn plain<W: Element>(
            entry: &KernelEntry,
            shape: &Shape,
            inputs: &AnyInputs<'_, '_>,
            out: &mut [f32],
        ) -> Option<Option<u32>> {
            Some(entry.cpu.get::<W, W>()?(
                shape,
                inputs.typed::<W, W>()?,
                out,
            ))
        }
        /// The variant for weights in blocks of `Q` beside activations in `A`, if any.
        fn blocks<Q: Element, A: Element>(
            entry: &KernelEntry,
            shape: &Shape,
            inputs: &AnyInputs<'_, '_>,
            out: &mut [f32],
        ) -> Option<Option<u32>> {
            let f = entry.cpu.get::<Q, A>()?;
            Some(f(shape, inputs.typed::<Q, A>()?, out))
        }
        let (e, s) = (entry, shape);
        #[cfg(feature = "cpu")]
        if let Some(tables) = entry.run_time_tables() {
            return crate::cpu::run_tables(tables, s, inputs, out)
                .map(|argmax| Ran {
                    argmax,
                    ..Ran::default()
                })
                .ok_or_else(|| {
                    format!(
                        "`{}` runs the {:?} skeleton, which has no CPU instantiation for {}",
                        entry.name(),
                        tables.skeleton,
                        inputs.storage.dtype
                    )
                });
        }
        let argmax = match inputs.storage.dtype {
            DType::F16 => plain::<half::f16>(e, s, inputs, out),
            DType::Bf16 => plain::<half::bf16>(e, s, inputs, out),
            DType::F32 => plain::<f32>(e, s, inputs, out),
            d => crate::with_block!(d, inputs.storage.values, |Q| match d.activation() {
                DType::Bf16 => blocks::<Q, half::bf16>(e, s, inputs, out),
                _ => blocks::<Q, f32>(e, s, inputs, out),
            }),
        };
        let argmax = argmax.ok_or_else(|| {
            format!(
                "`{}` has no CPU variant for {} in this build",
                entry.name(),
                inputs.storage.dtype
            )
        })?;
        Ok(Ran {
            argmax,
            ..Ran::default()
        })
    }
}

/// The Spyre simulator, in DL16.
#[derive(Debug)]
pub struct Spyre;

impl Runtime for Spyre {
    fn target(&self) -> Target {
        Target::Spyre
    }

    fn compiled(&self) -> bool {
        cfg!(feature = "spyre")
    }

    /// Programs read expert banks by route in their stick layouts, complete split sums over the
    /// ring in LX, and read selected weights without copying them first.
    fn capabilities(&self) -> Vec<Capability> {
        vec![
            Capability::IndexedSelectionLayout,
            Capability::LxCompletedSum,
            Capability::ReadCopyElision,
        ]
    }

    fn tolerance(&self, _: &Kernel, dtype: DType) -> Tolerance {
        tolerance_dl16(dtype)
    }

    #[allow(unused_variables)]
    fn run(
        &self,
        _: Option<&Resident>,
        entry: &KernelEntry,
        shape: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Result<Ran, String> {
        #[cfg(feature = "spyre")]
        {
            fn plain<W: Element>(
                k: &moek_ir::Kernel,
                shape: &Shape,
                inputs: &AnyInputs<'_, '_>,
                out: &mut [f32],
            ) -> Option<Result<crate::spyre::SpyreRun, crate::spyre::SpyreError>> {
                let inputs = inputs.typed::<W, W>()?;
                Some(crate::spyre::run(
                    k,
                    shape,
                    inputs,
                    out,
                    moek_spyre::Mode::Dl16,
                ))
            }
            let k = entry.ir();
            let run = match inputs.storage.dtype {
                DType::F16 => plain::<half::f16>(k, shape, inputs, out),
                DType::Bf16 => plain::<half::bf16>(k, shape, inputs, out),
                DType::F32 => plain::<f32>(k, shape, inputs, out),
                // The checker refuses quantized dtypes on Spyre.
                _ => None,
            }
            .ok_or_else(|| {
                format!(
                    "`{}` has no spyre program for {}",
                    k.name, inputs.storage.dtype
                )
            })?
            .map_err(|e| format!("`{}` on spyre: {e}", k.name))?;
            Ok(Ran {
                modeled: Some(Modeled::of(&run.cost)),
                ..Ran::default()
            })
        }
        #[cfg(not(feature = "spyre"))]
        Err(not_compiled(Target::Spyre))
    }
}

/// wgpu on the shared adapter.
#[derive(Debug)]
pub struct Wgpu;

impl Runtime for Wgpu {
    fn target(&self) -> Target {
        Target::Wgpu
    }

    fn compiled(&self) -> bool {
        cfg!(feature = "wgpu")
    }

    /// Quantized weights are dequantized exactly and multiplied by f32 activations that are
    /// never rounded (no 8-bit activation as on the CPU): what remains is f32 accumulation, the
    /// f32 variants' tolerance.
    fn tolerance(&self, _: &Kernel, dtype: DType) -> Tolerance {
        match dtype.is_quantized() {
            true => tolerance(DType::F32),
            false => tolerance(dtype),
        }
    }

    /// Banks are bound in the checkpoint layout and read by route in place, without a copy. A
    /// GPU has no LX scratchpad (no `lx_completed_sum`). `shader_f16` only where the shared
    /// device reads f16 natively (see `moek_wgpu::F16Mode`).
    fn capabilities(&self) -> Vec<Capability> {
        #[cfg(feature = "wgpu")]
        let f16 = crate::wgpu::Gpu::shared().is_ok_and(|g| g.f16 == moek_wgpu::F16Mode::Native);
        #[cfg(not(feature = "wgpu"))]
        let f16 = false;
        let mut capabilities = vec![
            Capability::IndexedSelectionLayout,
            Capability::ReadCopyElision,
        ];
        if f16 {
            capabilities.push(Capability::ShaderF16);
        }
        capabilities
    }

    /// A backend with resident weights runs in its one session (uploading each weight once);
    /// otherwise every run opens a session of its own and uploads every tensor.
    #[allow(unused_variables)]
    fn run(
        &self,
        resident: Option<&Resident>,
        entry: &KernelEntry,
        shape: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Result<Ran, String> {
        #[cfg(feature = "wgpu")]
        {
            use crate::wgpu::{Session, WgpuError};
            let k = entry.ir();
            let run = |s: &mut Session<'_>, out: &mut [f32]| {
                let before = s.uploaded();
                let argmax = s.run_any(k, shape, inputs, out)?;
                Ok::<_, WgpuError>(Ran {
                    argmax,
                    uploaded: Some(s.uploaded() - before),
                    ..Ran::default()
                })
            };
            let ran = match resident {
                Some(r) => {
                    // A poisoned lock only means another thread's run panicked; the session's
                    // kept tensors are whole (each is inserted after its upload completes).
                    let mut held = r.session.lock().unwrap_or_else(|e| e.into_inner());
                    let session = match &mut *held {
                        Some(s) => s,
                        None => held.insert(Session::resident().map_err(|e| e.to_string())?),
                    };
                    run(session, out)
                }
                None => Session::new().and_then(|mut s| run(&mut s, out)),
            };
            ran.map_err(|e| format!("`{}` on wgpu: {e}", k.name))
        }
        #[cfg(not(feature = "wgpu"))]
        Err(not_compiled(Target::Wgpu))
    }
}

#[cfg_attr(all(feature = "spyre", feature = "wgpu"), allow(dead_code))]
fn not_compiled(target: Target) -> String {
    format!("the {target} backend is not part of this build (cargo feature `{target}`)")
}

/// Runs `entry`'s variant on `backend`'s runtime, for inputs of any storage: the one run path
/// of dispatch and the test harness. Refuses, before anything runs, inputs whose optional
/// tensors, storage dtype or block size the spec does not have.
pub fn run(
    backend: &Backend,
    entry: &KernelEntry,
    shape: &Shape,
    inputs: &AnyInputs<'_, '_>,
    out: &mut [f32],
) -> Result<Ran, String> {
    same_optional_tensors(entry, inputs)?;
    let (k, dtype) = (entry.ir(), inputs.storage.dtype);
    if !k.dtypes.contains(&dtype) || !k.targets.contains(&backend.target) {
        return Err(format!(
            "`{}` has no {} variant for {dtype} in this build",
            entry.name(),
            backend.target,
        ));
    }
    if dtype.is_quantized() && k.quant_block != inputs.storage.values {
        return Err(format!(
            "`{}` reads {dtype} weights in blocks of {} values, these are in blocks of {}",
            entry.name(),
            k.quant_block,
            inputs.storage.values
        ));
    }
    backend
        .runtime
        .run(backend.resident.as_ref(), entry, shape, inputs, out)
}

/// A spec reads its optional tensors (biases, output gate) and no others: inputs with others
/// ask for another function.
fn same_optional_tensors(entry: &KernelEntry, inputs: &AnyInputs<'_, '_>) -> Result<(), String> {
    let (spec, given) = (entry.ir().optional, inputs.optional);
    match spec == given {
        true => Ok(()),
        false => Err(format!(
            "`{}` reads {spec}, but the inputs carry {given}",
            entry.name()
        )),
    }
}
