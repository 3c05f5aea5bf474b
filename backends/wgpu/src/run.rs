//! Compiled programs (cached by key) and their execution.

use crate::adapter::{Gpu, GpuError};
use crate::tensor::GpuTensor;
use moek_ir::plan::{BufferRole, DevicePlan, Step};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Programs by key (kernel, dtype, sizes, f16 mode): each is compiled once per process.
pub(crate) type Cache = Mutex<HashMap<String, Arc<Program>>>;

/// A compiled program: its plan, one bind group layout over every binding, a pipeline per entry.
#[derive(Debug)]
pub struct Program {
    pub plan: DevicePlan,
    layout: wgpu::BindGroupLayout,
    pipelines: HashMap<String, wgpu::ComputePipeline>,
}

impl Gpu {
    /// The program cached under `key`, compiled from `make()` on first use. Shader and pipeline
    /// errors come back as [`GpuError::Validation`], never as a panic.
    pub fn program<E>(
        &self,
        key: &str,
        make: impl FnOnce() -> Result<DevicePlan, E>,
    ) -> Result<Result<Arc<Program>, GpuError>, E> {
        if let Some(p) = self.cache.lock().expect("cache lock").get(key) {
            return Ok(Ok(p.clone()));
        }
        let plan = make()?;
        Ok(self.compile(key, plan).map(|p| {
            let p = Arc::new(p);
            self.cache
                .lock()
                .expect("cache lock")
                .insert(key.to_string(), p.clone());
            p
        }))
    }

    fn compile(&self, key: &str, plan: DevicePlan) -> Result<Program, GpuError> {
        // Every binding but the params uniform is a storage buffer; an adapter with too few
        // slots is a clear error here rather than a validation failure deep in the driver.
        let storage: usize = plan
            .tensors
            .iter()
            .filter(|t| t.role != BufferRole::Params)
            .map(|t| t.chunks)
            .sum();
        let limit = self.limits.max_storage_buffers_per_shader_stage;
        if storage > limit as usize {
            return Err(GpuError::Bindings {
                program: key.to_string(),
                adapter: self.name(),
                needed: storage as u32,
                limit,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(plan.source.as_str().into()),
            });
        let mut entries = vec![];
        let mut binding = 0;
        for t in &plan.tensors {
            let ty = match t.role {
                BufferRole::Params => wgpu::BufferBindingType::Uniform,
                BufferRole::Input | BufferRole::Weight => {
                    wgpu::BufferBindingType::Storage { read_only: true }
                }
                BufferRole::Scratch | BufferRole::Output | BufferRole::Indirect => {
                    wgpu::BufferBindingType::Storage { read_only: false }
                }
            };
            for _ in 0..t.chunks {
                entries.push(wgpu::BindGroupLayoutEntry {
                    binding,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                });
                binding += 1;
            }
        }
        let layout = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some(key),
                entries: &entries,
            });
        let pipeline_layout = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some(key),
                bind_group_layouts: &[Some(&layout)],
                immediate_size: 0,
            });
        let mut pipelines = HashMap::new();
        for step in &plan.steps {
            let (Step::Rows { entry, .. }
            | Step::Elems { entry, .. }
            | Step::Indirect { entry, .. }) = step
            else {
                continue;
            };
            if pipelines.contains_key(entry) {
                continue;
            }
            let pipeline = self
                .device
                .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                    label: Some(entry),
                    layout: Some(&pipeline_layout),
                    module: &module,
                    entry_point: Some(entry),
                    compilation_options: Default::default(),
                    cache: None,
                });
            pipelines.insert(entry.clone(), pipeline);
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation {
                what: key.to_string(),
                why: e.to_string(),
            });
        }
        Ok(Program {
            plan,
            layout,
            pipelines,
        })
    }

    /// Runs `p` over `tensors` (one per plan tensor, in plan order, params excluded) and reads
    /// back the output tensor as f32.
    pub fn run(
        &self,
        p: &Program,
        tensors: &[&GpuTensor],
        softcap: f32,
    ) -> Result<Vec<f32>, GpuError> {
        let plans: Vec<_> = p
            .plan
            .tensors
            .iter()
            .filter(|t| t.role != BufferRole::Params)
            .collect();
        assert_eq!(plans.len(), tensors.len(), "one tensor per plan tensor");
        let params_plan = p
            .plan
            .tensors
            .iter()
            .find(|t| t.role == BufferRole::Params)
            .expect("every program has params");
        let params_bytes: Vec<u8> = [0u32, softcap.to_bits(), 0, 0]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        let params = GpuTensor::upload(self, params_plan, &params_bytes);
        let trips = p
            .plan
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Trip(e) => Some(*e),
                _ => None,
            })
            .max();
        // Trip numbers live in a buffer and are copied into `params.trip` between dispatches.
        let iota = trips.map(|n| {
            let words: Vec<u8> = (0..=n).flat_map(|e| e.to_le_bytes()).collect();
            let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("trips"),
                size: words.len() as u64,
                usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.queue.write_buffer(&b, 0, &words);
            b
        });
        let mut entries = vec![];
        let all = std::iter::once(&params).chain(tensors.iter().copied());
        for t in all {
            for b in &t.buffers {
                entries.push(wgpu::BindGroupEntry {
                    binding: entries.len() as u32,
                    resource: b.as_entire_binding(),
                });
            }
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &p.layout,
            entries: &entries,
        });
        let (out_i, _) = plans
            .iter()
            .enumerate()
            .find(|(_, t)| t.role == BufferRole::Output)
            .expect("every program has an output");
        let out = &tensors[out_i].buffers[0];
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: out.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
        let written = |name: &str| {
            plans
                .iter()
                .position(|t| t.name == name)
                .map(|i| &tensors[i].buffers[0])
                .expect("indirect dispatches name a planned tensor")
        };
        // Dispatch arguments: a copy of each indirect tensor, never bound in the bind group.
        let args: HashMap<&str, wgpu::Buffer> = plans
            .iter()
            .filter(|t| t.role == BufferRole::Indirect)
            .map(|t| {
                let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(&t.name),
                    size: written(&t.name).size(),
                    usage: wgpu::BufferUsages::INDIRECT | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                (t.name.as_str(), b)
            })
            .collect();
        let mut pass: Option<wgpu::ComputePass<'static>> = None;
        for step in &p.plan.steps {
            if let Step::Trip(e) = step {
                // Copies happen between passes.
                drop(pass.take());
                let iota = iota.as_ref().expect("made when there are trips");
                enc.copy_buffer_to_buffer(iota, u64::from(*e) * 4, &params.buffers[0], 0, 4);
                continue;
            }
            if let Step::IndirectArgs(name) = step {
                drop(pass.take());
                enc.copy_buffer_to_buffer(written(name), 0, &args[name.as_str()], 0, None);
                continue;
            }
            let pass = pass.get_or_insert_with(|| {
                let mut pass = enc
                    .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                    .forget_lifetime();
                pass.set_bind_group(0, &bind, &[]);
                pass
            });
            match step {
                Step::Rows { entry, .. } | Step::Elems { entry, .. } => {
                    let (x, y) = step.groups().expect("direct dispatch");
                    pass.set_pipeline(&p.pipelines[entry]);
                    pass.dispatch_workgroups(x, y, 1);
                }
                Step::Indirect {
                    entry,
                    tensor,
                    offset,
                } => {
                    pass.set_pipeline(&p.pipelines[entry]);
                    pass.dispatch_workgroups_indirect(&args[tensor.as_str()], *offset);
                }
                Step::Trip(_) | Step::IndirectArgs(_) => unreachable!("handled above"),
            }
        }
        drop(pass);
        enc.copy_buffer_to_buffer(out, 0, &staging, 0, out.size());
        self.queue.submit([enc.finish()]);
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation {
                what: "run".into(),
                why: e.to_string(),
            });
        }
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let readback = |why: String| GpuError::Readback {
            what: tensors[out_i].name.clone(),
            why,
        };
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| readback(e.to_string()))?
            .map_err(|e| readback(e.to_string()))?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|e| readback(e.to_string()))?;
        let n = plans[out_i].elems;
        Ok(view
            .chunks_exact(4)
            .take(n)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}
