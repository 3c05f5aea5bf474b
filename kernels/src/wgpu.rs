//! Running a spec's WGSL program: the program is emitted for the problem's sizes and the device
//! (`moek_lower::wgsl`), compiled once per key, bound to the op's tensors and run.
//!
//! A [`Session`] keeps weights on the device: slices registered with [`Session::keep`] are
//! uploaded on first use and shared by every later run (prefill and decode read the same banks).
//! They are borrowed for the session's lifetime, so they cannot change or be freed under it.
//! [`Session::resident`] keeps every weight it is given, for an owner whose weights outlive it
//! unchanged (a loaded model, through [`crate::Backend::with_resident_weights`]).

use crate::backend::Uploaded;
use crate::inputs::{AnyInputs, Inputs};
use moek_ir::Element;
use moek_ir::plan::BufferRole;

use moek_ir::reference::Shape;
use moek_ir::{DType, Kernel, Op};
use moek_lower::wgsl::{self, WgslError};
use moek_wgpu::{GpuError, GpuTensor};
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;
use thiserror::Error;

pub use moek_wgpu::Gpu;

#[derive(Debug, Error, PartialEq)]
pub enum WgpuError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("`{kernel}` has no wgpu program for these sizes: {why}")]
    NoProgram { kernel: String, why: WgslError },
    #[error("the program reads tensor `{0}`, which the op's inputs do not provide")]
    Unbound(String),
}

/// The program of `k` for weights in `dtype` at `s` on the shared device, compiled once.
pub fn program(
    gpu: &Gpu,
    k: &Kernel,
    dtype: DType,
    s: &Shape,
) -> Result<Arc<moek_wgpu::Program>, WgpuError> {
    let dev = gpu.emit_device();
    let key = format!("{}/{dtype}/{s:?}/{dev:?}", k.name);
    let made = gpu.program(&key, || wgsl::program(k, dtype, s, &dev));
    let compiled = made.map_err(|why| WgpuError::NoProgram {
        kernel: k.name.clone(),
        why,
    })?;
    Ok(compiled?)
}

/// Runs `k` once on the shared device, uploading every tensor (see [`Session`] to keep weights).
pub fn run<W: Element>(
    k: &Kernel,
    s: &Shape,
    inputs: &Inputs<'_, W>,
    out: &mut [f32],
) -> Result<Option<u32>, WgpuError> {
    Session::new()?.run(k, s, inputs, out)
}

/// Weights kept on the device across runs.
#[derive(Debug)]
pub struct Session<'w> {
    gpu: &'static Gpu,
    kept: HashSet<(usize, usize)>,
    /// Keep every weight, not only the `kept` ones.
    keep_all: bool,
    /// Uploaded kept weights by (address, bytes, chunk rows).
    resident: HashMap<(usize, usize, usize), Arc<GpuTensor>>,
    weight_uploads: usize,
    uploaded: Uploaded,
    _weights: PhantomData<&'w [u8]>,
}

impl<'w> Session<'w> {
    pub fn new() -> Result<Self, WgpuError> {
        Ok(Session {
            gpu: Gpu::shared()?,
            kept: HashSet::new(),
            keep_all: false,
            resident: HashMap::new(),
            weight_uploads: 0,
            uploaded: Uploaded::default(),
            _weights: PhantomData,
        })
    }

    /// A session that keeps every weight tensor it is given, recognised by address and length.
    /// Its owner promises what [`Session::keep`]'s borrow would enforce: each weight slice run
    /// through it stays allocated and unchanged for the session's life. (A slice freed and
    /// another allocated at the same address with the same length would read stale weights.)
    pub fn resident() -> Result<Session<'static>, WgpuError> {
        Ok(Session {
            keep_all: true,
            ..Session::new()?
        })
    }

    pub fn gpu(&self) -> &'static Gpu {
        self.gpu
    }

    /// Keeps `weights` on the device once first used, for every later run of this session.
    pub fn keep<W: Element>(&mut self, weights: &'w [W]) {
        self.kept.insert(key_of(bytemuck::cast_slice(weights)));
    }

    /// Weight tensors uploaded so far (kept ones count once).
    pub fn weight_uploads(&self) -> usize {
        self.weight_uploads
    }

    /// Bytes sent from the host to the device so far.
    pub fn uploaded(&self) -> Uploaded {
        self.uploaded
    }

    /// Runs `k`; `out` is uploaded as the output's initial contents (callers poison it), and
    /// holds the result after. Returns the argmax for the LM head (computed on the host from the
    /// read-back logits).
    pub fn run<W: Element>(
        &mut self,
        k: &Kernel,
        s: &Shape,
        inputs: &Inputs<'_, W>,
        out: &mut [f32],
    ) -> Result<Option<u32>, WgpuError> {
        self.run_any(k, s, &AnyInputs::new(inputs, W::DTYPE), out)
    }

    /// [`Session::run`] for inputs of any storage (plain, or blocks of a quantized format beside
    /// their activations): the tensors are bound as the bytes they are.
    pub fn run_any(
        &mut self,
        k: &Kernel,
        s: &Shape,
        inputs: &AnyInputs<'_, '_>,
        out: &mut [f32],
    ) -> Result<Option<u32>, WgpuError> {
        let p = program(self.gpu, k, inputs.storage.dtype, s)?;
        let host: Vec<(&str, &[u8])> = inputs
            .tensors()
            .iter()
            .map(|t| (t.def.name, t.bytes))
            .collect();
        // No softcap is 0: the program's softcap then passes logits through.
        let softcap = inputs.softcap.unwrap_or(0.0);
        let mut bound: Vec<Arc<GpuTensor>> = vec![];
        for plan in p
            .plan
            .tensors
            .iter()
            .filter(|t| t.role != BufferRole::Params)
        {
            let find = || {
                host.iter()
                    .find(|(n, _)| *n == plan.name)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| WgpuError::Unbound(plan.name.clone()))
            };
            let t = match plan.role {
                BufferRole::Weight => {
                    let bytes = find()?;
                    let (addr, len) = key_of(bytes);
                    let key = (addr, len, plan.chunk_rows);
                    match self.resident.get(&key) {
                        Some(t) => t.clone(),
                        None => {
                            self.weight_uploads += 1;
                            self.uploaded.weights += len as u64;
                            let t = Arc::new(GpuTensor::upload(self.gpu, plan, bytes));
                            if self.keep_all || self.kept.contains(&(addr, len)) {
                                self.resident.insert(key, t.clone());
                            }
                            t
                        }
                    }
                }
                BufferRole::Input => {
                    let bytes = find()?;
                    self.uploaded.other += bytes.len() as u64;
                    Arc::new(GpuTensor::upload(self.gpu, plan, bytes))
                }
                BufferRole::Output => {
                    let bytes: &[u8] = bytemuck::cast_slice(&out[..plan.elems]);
                    self.uploaded.other += bytes.len() as u64;
                    Arc::new(GpuTensor::upload(self.gpu, plan, bytes))
                }
                BufferRole::Scratch | BufferRole::Indirect | BufferRole::Params => {
                    Arc::new(GpuTensor::zeroed(self.gpu, plan))
                }
            };
            bound.push(t);
        }
        let refs: Vec<&GpuTensor> = bound.iter().map(|t| &**t).collect();
        let result = self.gpu.run(&p, &refs, softcap)?;
        out.copy_from_slice(&result[..out.len()]);
        Ok((inputs.op == Op::LmHeadRow).then(|| moek_ir::reference::argmax(out)))
    }
}

fn key_of(bytes: &[u8]) -> (usize, usize) {
    (bytes.as_ptr() as usize, bytes.len())
}
