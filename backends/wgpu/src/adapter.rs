//! Adapter and device: chosen once per process and shared.

use std::sync::OnceLock;
use thiserror::Error;

/// Why no device is available, or a run failed.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum GpuError {
    #[error(
        "no wgpu adapter{filter}: install a Vulkan driver (Debian/Ubuntu: `apt-get install \
         mesa-vulkan-drivers` gives the lavapipe CPU driver), or select another backend with \
         WGPU_BACKEND (vulkan, gl, metal, dx12)"
    )]
    NoAdapter { filter: String },
    #[error("the {adapter} adapter refused a device: {why}")]
    Device { adapter: String, why: String },
    #[error("`{0}` must be `on`, `off` or `auto`")]
    F16Switch(String),
    #[error("f16 loads were forced on (MOEK_WGPU_F16=on) but the {0} adapter lacks SHADER_F16")]
    NoF16(String),
    #[error(
        "`{program}` binds {needed} storage buffers, and the {adapter} adapter allows {limit} per \
         shader stage (GL drivers allow 16; Vulkan drivers, lavapipe included, allow more: \
         `apt-get install mesa-vulkan-drivers`, or WGPU_BACKEND=vulkan)"
    )]
    Bindings {
        program: String,
        adapter: String,
        needed: u32,
        limit: u32,
    },
    #[error("the device rejected `{what}`: {why}")]
    Validation { what: String, why: String },
    #[error("reading back `{what}` failed: {why}")]
    Readback { what: String, why: String },
}

/// How f16 tensors are read: `MOEK_WGPU_F16=on|off|auto` (default auto: native where the adapter
/// has SHADER_F16). `off` forces the packed path, so CI tests both on one adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Mode {
    Native,
    Packed,
}

/// The shared device.
#[derive(Debug)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub f16: F16Mode,
    pub(crate) cache: crate::run::Cache,
}

impl Gpu {
    /// The process's device, created on first use; the same error every time if there is none.
    pub fn shared() -> Result<&'static Gpu, GpuError> {
        static GPU: OnceLock<Result<Gpu, GpuError>> = OnceLock::new();
        GPU.get_or_init(Gpu::new).as_ref().map_err(Clone::clone)
    }

    /// A new device on the preferred adapter (see [`choose`]).
    pub fn new() -> Result<Gpu, GpuError> {
        let name = std::env::var("WGPU_ADAPTER_NAME").ok();
        // WGPU_BACKEND decides when set; otherwise the primary backends (Vulkan, Metal, DX12)
        // first, and GL only when they offer no adapter (GL probing is slow and noisy).
        let tiers = match wgpu::Backends::from_env() {
            Some(b) => vec![b],
            None => vec![wgpu::Backends::PRIMARY, wgpu::Backends::SECONDARY],
        };
        let mut adapter = None;
        for backends in tiers {
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
            desc.backends = backends;
            let instance = wgpu::Instance::new(desc);
            let adapters = pollster::block_on(instance.enumerate_adapters(backends));
            adapter = choose(adapters, name.as_deref());
            if adapter.is_some() {
                break;
            }
        }
        let adapter = adapter.ok_or_else(|| GpuError::NoAdapter {
            filter: name.map_or(String::new(), |n| format!(" named like `{n}`")),
        })?;
        let info = adapter.get_info();
        let f16 = f16_mode(&adapter, &info)?;
        let mut features = wgpu::Features::empty();
        if f16 == F16Mode::Native {
            features |= wgpu::Features::SHADER_F16;
        }
        // The adapter's real limits: storage buffers per stage and binding sizes decide chunking.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("moek"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::Device {
            adapter: info.name.clone(),
            why: e.to_string(),
        })?;
        Ok(Gpu {
            device,
            queue,
            info,
            limits,
            f16,
            cache: Default::default(),
        })
    }

    /// `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
    pub fn name(&self) -> String {
        format!("{} ({:?})", self.info.name, self.info.backend)
    }

    /// Whether the adapter is a CPU driver (Mesa's lavapipe or llvmpipe): correct, but
    /// thousands of times slower than a GPU on a 26B-A4B prefill.
    pub fn is_cpu(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Whether wgpu fell back to a CPU driver through GL (Mesa's llvmpipe): several times
    /// slower than the same driver through Vulkan (lavapipe), which one package gives.
    pub fn is_gl_cpu(&self) -> bool {
        self.is_cpu() && self.info.backend == wgpu::Backend::Gl
    }

    /// The largest storage buffer binding, bytes.
    pub fn binding_limit(&self) -> u64 {
        self.limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size)
    }

    /// What the emitter needs to know of this device.
    pub fn emit_device(&self) -> moek_ir::plan::DeviceCaps {
        moek_ir::plan::DeviceCaps {
            binding_limit: self.binding_limit(),
            f16: self.f16 == F16Mode::Native,
        }
    }
}

/// The preferred adapter: those whose name contains `name` (case-insensitive) if given; then
/// Vulkan with SHADER_F16, Vulkan, Metal/DX12, GL; discrete GPUs before integrated before CPU.
pub fn choose(adapters: Vec<wgpu::Adapter>, name: Option<&str>) -> Option<wgpu::Adapter> {
    let wanted = name.map(str::to_lowercase);
    adapters
        .into_iter()
        .filter(|a| {
            wanted
                .as_ref()
                .is_none_or(|n| a.get_info().name.to_lowercase().contains(n))
        })
        .max_by_key(|a| {
            let info = a.get_info();
            let backend = match info.backend {
                wgpu::Backend::Vulkan => 3,
                wgpu::Backend::Metal | wgpu::Backend::Dx12 => 2,
                wgpu::Backend::Gl => 1,
                _ => 0,
            };
            let kind = match info.device_type {
                wgpu::DeviceType::DiscreteGpu => 3,
                wgpu::DeviceType::IntegratedGpu | wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Cpu => 1,
                _ => 0,
            };
            let f16 = a.features().contains(wgpu::Features::SHADER_F16);
            (backend, f16, kind)
        })
}

fn f16_mode(adapter: &wgpu::Adapter, info: &wgpu::AdapterInfo) -> Result<F16Mode, GpuError> {
    let has = adapter.features().contains(wgpu::Features::SHADER_F16);
    match std::env::var("MOEK_WGPU_F16").as_deref() {
        Err(_) | Ok("auto") if has => Ok(F16Mode::Native),
        Err(_) | Ok("auto") | Ok("off") => Ok(F16Mode::Packed),
        Ok("on") if has => Ok(F16Mode::Native),
        Ok("on") => Err(GpuError::NoF16(info.name.clone())),
        Ok(other) => Err(GpuError::F16Switch(format!("MOEK_WGPU_F16={other}"))),
    }
}
