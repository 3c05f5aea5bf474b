//! The Spyre backend. Nobody here has the card, so this crate is honest twice: [`validate`]
//! refuses what the hardware would refuse, and [`simulate`] executes every core of a program in
//! DL16 ([`dl16`]) or exact f32, counting what it moves; [`cost`] turns the counts into modeled
//! time from public constants. The program format lives in `moek_ir::spyre`.

pub mod cost;
pub mod dl16;
pub mod matmul;
pub mod simulate;
pub mod validate;
pub mod walk;

pub use cost::{Cost, Term, model};
pub use simulate::{Counters, Data, Device, Mode, SimError, simulate, transpose};
pub use validate::{Invalid, LoadError, ValidationError, load, validate};
