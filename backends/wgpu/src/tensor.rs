//! Device tensors: one buffer per chunk of a [`TensorPlan`], each under the binding limit.

use crate::adapter::Gpu;
use moek_ir::plan::{BufferRole, TensorPlan};

/// A tensor on the device, bound as `buffers` in order.
#[derive(Debug)]
pub struct GpuTensor {
    pub name: String,
    pub buffers: Vec<wgpu::Buffer>,
}

impl GpuTensor {
    /// Uploads `bytes` (the tensor's elements, row-major) chunk by chunk, each straight into a
    /// buffer mapped at creation: no staging copy of the whole tensor.
    pub fn upload(gpu: &Gpu, plan: &TensorPlan, bytes: &[u8]) -> GpuTensor {
        assert_eq!(
            bytes.len(),
            plan.bytes(),
            "tensor `{}`: bytes do not match its plan",
            plan.name
        );
        let buffers = (0..plan.chunks)
            .map(|c| {
                let r = plan.chunk(c);
                let src = &bytes[plan.bytes_of(r.start)..plan.bytes_of(r.end)];
                let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("{}_{c}", plan.name)),
                    size: plan.chunk_bytes(c),
                    usage: usage(plan.role),
                    mapped_at_creation: true,
                });
                {
                    let mut view = buffer
                        .get_mapped_range_mut(..)
                        .expect("a buffer mapped at creation maps");
                    view.slice(..src.len()).copy_from_slice(src);
                }
                buffer.unmap();
                buffer
            })
            .collect();
        GpuTensor {
            name: plan.name.clone(),
            buffers,
        }
    }

    /// A tensor the device fills (zeroed by wgpu).
    pub fn zeroed(gpu: &Gpu, plan: &TensorPlan) -> GpuTensor {
        let buffers = (0..plan.chunks)
            .map(|c| {
                gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&format!("{}_{c}", plan.name)),
                    size: plan.chunk_bytes(c),
                    usage: usage(plan.role),
                    mapped_at_creation: false,
                })
            })
            .collect();
        GpuTensor {
            name: plan.name.clone(),
            buffers,
        }
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> u64 {
        self.buffers.iter().map(wgpu::Buffer::size).sum()
    }
}

fn usage(role: BufferRole) -> wgpu::BufferUsages {
    use wgpu::BufferUsages as U;
    match role {
        BufferRole::Params => U::UNIFORM | U::COPY_DST,
        BufferRole::Output => U::STORAGE | U::COPY_SRC | U::COPY_DST,
        BufferRole::Indirect => U::STORAGE | U::COPY_SRC,
        _ => U::STORAGE | U::COPY_DST,
    }
}
