//! A Spyre program rendered as KTIR, torch-spyre's kernel IR (MLIR dialect `ktdp` with `linalg`,
//! `scf`, `tensor`, `arith` and `math`), as the ktir-cpu interpreter reads it (docs/ktir.md).
//!
//! One rendering of one program, never a second tiling: each phase's cores are the function's
//! grid, each instruction becomes the ops that compute it (a DMA a memory view's access tile
//! and a load, a gather an indirect access tile that reads the bank by route in place, a matmul
//! `linalg.matmul`, a ring combine an inter-tile reduce, the persistent expert loop an `scf.for`
//! whose carried values stay in LX), and LX buffers become SSA values. What KTIR cannot state is
//! refused with a [`KtirError`], or named in docs/ktir.md (the stick layout, DL16, the order of a
//! ring's sum).

mod ops;
mod text;

use moek_ir::spyre::{DeviceRole, Program, Tensor};
use std::collections::{HashMap, HashSet};
use text::{Text, boxed, memref};
use thiserror::Error;

/// Why a program has no KTIR rendering.
#[derive(Debug, Error, PartialEq)]
pub enum KtirError {
    #[error(
        "the program is for {0}, and KTIR is rendered in f16 only (ktir-cpu has no bf16): emit the spec's f16 program"
    )]
    Dtype(String),
    #[error("phase `{phase}`: the coordinates of slice `{dim}` are no `(core / a) % b`")]
    CoreMap { phase: String, dim: String },
    #[error(
        "phase `{phase}`: the ring over `{dim}` groups cores {groups:?}, which are no contiguous runs"
    )]
    RingGroups {
        phase: String,
        dim: String,
        groups: Vec<Vec<usize>>,
    },
    #[error(
        "phase `{phase}` runs on {cores} of the grid's {grid} cores (a ring inside a guard would deadlock)"
    )]
    PartialGrid {
        phase: String,
        cores: usize,
        grid: usize,
    },
    #[error(
        "phase `{phase}` divides its cores otherwise than the phase before it, which KTIR would need a barrier for"
    )]
    NeedsBarrier { phase: String },
    #[error("buffer `{buffer}`: {elems} elements at {offset} are no rectangle of its {shape:?}")]
    NotRectangular {
        buffer: String,
        offset: usize,
        elems: usize,
        shape: Vec<usize>,
    },
    #[error("`{0}` is read before anything is written to it")]
    Unwritten(String),
    #[error("the program names no tensor `{0}`")]
    UnknownTensor(String),
    #[error("{0}")]
    Unsupported(String),
}

/// KTIR for `p`: a module with one function named after the kernel, whose arguments are
/// `<tensor>_ptr` for each device tensor in the program's order (the output among them).
pub fn render(p: &Program) -> Result<String, KtirError> {
    if p.dtype != "f16" {
        return Err(KtirError::Dtype(p.dtype.clone()));
    }
    let grid = p
        .phases
        .iter()
        .map(|ph| ph.core_slice.len())
        .max()
        .unwrap_or(1);
    for pair in p.phases.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.slices != b.slices || a.core_slice != b.core_slice {
            return Err(KtirError::NeedsBarrier {
                phase: b.name.clone(),
            });
        }
    }
    let mut r = Renderer {
        p,
        t: Text::at(2),
        views: HashMap::new(),
    };
    r.views(p);
    for ph in &p.phases {
        if ph.core_slice.len() != grid {
            return Err(KtirError::PartialGrid {
                phase: ph.name.clone(),
                cores: ph.core_slice.len(),
                grid,
            });
        }
        ops::Phase::new(&mut r, ph)?.render(&ph.body)?;
    }
    r.t.line("return");
    Ok(r.finish(grid))
}

/// The rendering under way: the program, its text, and each tensor's memory view.
struct Renderer<'p> {
    p: &'p Program,
    t: Text,
    views: HashMap<String, String>,
}

impl Renderer<'_> {
    fn tensor(&self, name: &str) -> Result<&Tensor, KtirError> {
        self.p
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| KtirError::UnknownTensor(name.to_string()))
    }

    /// A memory view per device tensor, logical and row-major (the stick layout is the device's,
    /// not KTIR's); route indices also flat, as indirect tiles index them.
    fn views(&mut self, p: &Program) {
        self.t.line("%core = ktdp.get_compute_tile_id : index");
        self.t.line("%zf = arith.constant 0.0 : f32");
        for t in &p.tensors {
            let view = format!("%{}_view", t.name);
            let strides: Vec<usize> = (0..t.shape.len())
                .map(|i| t.shape[i + 1..].iter().product())
                .collect();
            self.view(&view, &t.name, &t.shape, &strides, elem(t));
            self.views.insert(t.name.clone(), view);
            if t.role == DeviceRole::Routes {
                let all = t.shape.iter().product();
                self.view(&format!("%{}_flat", t.name), &t.name, &[all], &[1], "i32");
            }
        }
    }

    fn view(&mut self, view: &str, tensor: &str, shape: &[usize], strides: &[usize], dt: &str) {
        let list = |v: &[usize]| {
            v.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.t.line(format!(
            "{view} = ktdp.construct_memory_view %{tensor}_ptr, sizes: [{}], strides: [{}] {{",
            list(shape),
            list(strides)
        ));
        self.t.line(format!(
            "  coordinate_set = {}, memory_space = #ktdp.memory_space<global>",
            boxed(shape)
        ));
        self.t.line(format!("}} : {}", memref(shape, dt)));
    }

    fn finish(self, grid: usize) -> String {
        let args = self
            .p
            .tensors
            .iter()
            .map(|t| format!("%{}_ptr: index", t.name))
            .collect::<Vec<_>>()
            .join(", ");
        let mut out: Vec<String> = self
            .t
            .aliases
            .iter()
            .enumerate()
            .map(|(i, a)| format!("#ring{i} = {a}"))
            .collect();
        out.push("module {".into());
        out.push(format!(
            "  func.func @{}({args}) attributes {{grid = [{grid}]}} {{",
            self.p.kernel
        ));
        let mut body = self.t.lines.clone();
        // The index constants go straight after the core id, so every scope sees them.
        body.splice(1..1, self.t.constants(2));
        out.extend(body);
        out.push("  }".into());
        out.push("}".into());
        out.join("\n") + "\n"
    }
}

/// A device tensor's element type in KTIR: route indices i32, 2-byte elements f16 (DL16 on the
/// device), 4-byte ones f32.
fn elem(t: &Tensor) -> &'static str {
    match (t.role, t.elem_bytes) {
        (DeviceRole::Routes, _) => "i32",
        (_, 2) => "f16",
        _ => "f32",
    }
}

/// The buffers an instruction list (loops included) uses as a matmul's left operand.
fn matmul_lefts(body: &[moek_ir::spyre::Instr]) -> HashSet<String> {
    let mut lefts = HashSet::new();
    moek_ir::spyre::Instr::each(body, &mut |i| {
        if let moek_ir::spyre::Instr::Matmul { a, .. } = i {
            lefts.insert(a.clone());
        }
    });
    lefts
}
