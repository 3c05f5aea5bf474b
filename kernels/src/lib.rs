//! Gemma-4 MoE kernels, declared as specs with [`kernel!`], and the dispatch that picks among their
//! generated variants.
//!
//! - [`specs`]: the built-in specs (the optimised decode and prefill variants, general fallbacks).
//! - [`dispatch`]: which variant is eligible on a backend, which is chosen and why.
//! - [`inputs`]: the tensors each op takes, checked before anything runs.
//! - [`cpu`] (feature `cpu`): a schedule's tables bound to an op's inputs, run by moek-cpu.
//! - [`testing`] (feature `testing`): the equivalence harness every spec's generated tests call.
//!
//! Backends are cargo features (`cpu`, `spyre`, `wgpu`); generated code reaches them through
//! [`__private`].

extern crate self as moek_kernels;

pub mod backend;
pub mod blocks;
#[cfg(feature = "cpu")]
pub mod cpu;
pub mod dispatch;
pub mod geometry;
pub mod inputs;
pub mod registry;
pub mod specs;
#[cfg(feature = "spyre")]
pub mod spyre;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(feature = "wgpu")]
pub mod wgpu;

pub use dispatch::{Backend, Choice, DispatchError, Ineligible};
pub use inputs::{InputError, Inputs};
pub use moek_dsl_macros::kernel;
pub use moek_ir as ir;
pub use moek_ir::Element;
pub use moek_ir::reference::Shape;
pub use registry::{BlockFns, CpuFn, CpuFns, KernelEntry, QuantFns, Rank, Registry, RegistryError};

/// What generated code names; not a public API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "cpu")]
    pub use crate::cpu::{run_gathered, run_gemm};
    #[cfg(feature = "cpu")]
    pub use moek_cpu as cpu;
    pub use rayon;

    pub use crate::inputs::Inputs;
    pub use crate::registry::{BlockFns, CpuFns, KernelEntry, QuantFns};
    #[cfg(any(test, feature = "testing"))]
    pub use crate::testing;
    pub use half;
    pub use moek_ir as ir;
    pub use moek_ir::reference::{Shape, argmax};

    /// Keeps its items when the `cpu` backend is compiled in, drops them otherwise.
    #[cfg(feature = "cpu")]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_cpu {
        ($($item:tt)*) => { $($item)* };
    }
    #[cfg(not(feature = "cpu"))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_cpu {
        ($($item:tt)*) => {};
    }

    /// The CPU function table when the `cpu` backend is compiled in, `CpuFns::NONE` otherwise.
    #[cfg(feature = "cpu")]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __cpu_fns {
        ($fns:expr) => {
            $fns
        };
    }
    #[cfg(not(feature = "cpu"))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __cpu_fns {
        ($fns:expr) => {
            $crate::__private::CpuFns::NONE
        };
    }

    /// Keeps its items when the `spyre` backend is compiled in, drops them otherwise.
    #[cfg(feature = "spyre")]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_spyre {
        ($($item:tt)*) => { $($item)* };
    }
    #[cfg(not(feature = "spyre"))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_spyre {
        ($($item:tt)*) => {};
    }

    pub use crate::__cpu_fns as cpu_fns;
    pub use crate::__if_cpu as if_cpu;
    /// Keeps its items when the `wgpu` backend is compiled in, drops them otherwise.
    #[cfg(feature = "wgpu")]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_wgpu {
        ($($item:tt)*) => { $($item)* };
    }
    #[cfg(not(feature = "wgpu"))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_wgpu {
        ($($item:tt)*) => {};
    }

    /// Keeps the generated tests when the `testing` harness is compiled in; without it they are
    /// a compile error that says how to enable it (a test is never silently absent).
    #[cfg(all(not(test), feature = "testing"))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_testing {
        ($($item:tt)*) => { $($item)* };
    }
    /// This crate's own unit tests leave out the built-in specs' generated tests: each backend
    /// crate's conformance suite (`testing::conformance`) runs exactly those checks, every
    /// built-in spec x dtype on its target, on weights shared across specs instead of drawn per
    /// test, and CI runs the CPU one again under every ISA level.
    #[cfg(test)]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_testing {
        ($($item:tt)*) => {};
    }
    #[cfg(not(any(test, feature = "testing")))]
    #[macro_export]
    #[doc(hidden)]
    macro_rules! __if_testing {
        ($($item:tt)*) => {
            ::core::compile_error!(
                "the generated equivalence tests need the harness: add `moek-kernels = { features = [\"testing\"] }` to [dev-dependencies]"
            );
        };
    }

    pub use crate::__if_spyre as if_spyre;
    pub use crate::__if_testing as if_testing;
    pub use crate::__if_wgpu as if_wgpu;
}
