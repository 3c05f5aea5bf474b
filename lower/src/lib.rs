//! The validated IR lowered to device programs: the WGSL program with the plan that binds and
//! runs it ([`wgsl`]), the Spyre program with the resource model its checks use ([`spyre`]), and
//! that program rendered as torch-spyre's KTIR ([`ktir`]).
//!
//! Plain data in, plain data out: no parser. The DSL's checker calls these lowerings at macro
//! time (so a plan that cannot fit is a compile error), and run times (`moek-kernels`, the
//! `moek` command) call them for the problem's sizes without linking the compiler.

pub mod ktir;
pub mod spyre;
pub mod wgsl;
