//! The tensors each op takes, and the checks that run before any variant touches them.

use moek_ir::Op;
use moek_ir::reference::Shape;
use thiserror::Error;

/// An op's inputs, row-major, in the checkpoint's own layouts.
#[derive(Clone, Copy, Debug)]
pub enum Inputs<'a, W> {
    /// `x [T, H]`, `idx [T, R]`, `gate_up [E, 2F, H]` (gate rows first).
    GateUp {
        x: &'a [W],
        idx: &'a [u32],
        gate_up: &'a [W],
    },
    /// `act [T, R, F]` (f32), `idx [T, R]`, `weights [T, R]`, `down [E, H, F]`.
    Down {
        act: &'a [f32],
        idx: &'a [u32],
        weights: &'a [f32],
        down: &'a [W],
    },
    /// `x [T, H]`, `idx [T, R]`, `weights [T, R]`, `gate_up [E, 2F, H]`, `down [E, H, F]`.
    ExpertFfn {
        x: &'a [W],
        idx: &'a [u32],
        weights: &'a [f32],
        gate_up: &'a [W],
        down: &'a [W],
    },
    /// `x [T, H]`, `gate [F, H]`, `up [F, H]`, `down [H, F]`.
    DenseMlp {
        x: &'a [W],
        gate: &'a [W],
        up: &'a [W],
        down: &'a [W],
    },
    /// `hidden [T, H]` (only row T-1 is read), `emb [V, H]`, and the final softcap.
    LmHeadRow {
        hidden: &'a [W],
        emb: &'a [W],
        softcap: f32,
    },
}

/// A tensor that does not fit the shape it was given with.
#[derive(Debug, Error, PartialEq)]
pub enum InputError {
    #[error("tensor `{tensor}` has {got} elements; expected {expected} for {shape}")]
    Length {
        tensor: &'static str,
        expected: usize,
        got: usize,
        shape: String,
    },
    #[error("route index {index} at slot {slot} of `idx` is out of range for E = {experts}")]
    Route {
        slot: usize,
        index: u32,
        experts: usize,
    },
    #[error("the output has {got} elements; expected {expected}")]
    Output { expected: usize, got: usize },
    #[error("`{op}` needs T >= 1")]
    Empty { op: Op },
}

impl<W> Inputs<'_, W> {
    pub fn op(&self) -> Op {
        match self {
            Inputs::GateUp { .. } => Op::GateUp,
            Inputs::Down { .. } => Op::Down,
            Inputs::ExpertFfn { .. } => Op::ExpertFfn,
            Inputs::DenseMlp { .. } => Op::DenseMlp,
            Inputs::LmHeadRow { .. } => Op::LmHeadRow,
        }
    }

    /// Checks every tensor's length, every route index and the output's length against `s`.
    pub fn validate(&self, s: &Shape, out_len: usize) -> Result<(), InputError> {
        if s.t == 0 {
            return Err(InputError::Empty { op: self.op() });
        }
        let shape = describe(self.op(), s);
        let len = |tensor: &'static str, got: usize, expected: usize| {
            if got == expected {
                Ok(())
            } else {
                Err(InputError::Length {
                    tensor,
                    expected,
                    got,
                    shape: shape.clone(),
                })
            }
        };
        let routes = |idx: &[u32]| {
            idx.iter().enumerate().try_for_each(|(slot, &index)| {
                if (index as usize) < s.e {
                    Ok(())
                } else {
                    Err(InputError::Route {
                        slot,
                        index,
                        experts: s.e,
                    })
                }
            })
        };
        match *self {
            Inputs::GateUp { x, idx, gate_up } => {
                len("x", x.len(), s.t * s.h)?;
                len("idx", idx.len(), s.t * s.r)?;
                len("gate_up", gate_up.len(), s.e * 2 * s.f * s.h)?;
                routes(idx)?;
            }
            Inputs::Down {
                act,
                idx,
                weights,
                down,
            } => {
                len("act", act.len(), s.t * s.r * s.f)?;
                len("idx", idx.len(), s.t * s.r)?;
                len("weights", weights.len(), s.t * s.r)?;
                len("down", down.len(), s.e * s.h * s.f)?;
                routes(idx)?;
            }
            Inputs::ExpertFfn {
                x,
                idx,
                weights,
                gate_up,
                down,
            } => {
                len("x", x.len(), s.t * s.h)?;
                len("idx", idx.len(), s.t * s.r)?;
                len("weights", weights.len(), s.t * s.r)?;
                len("gate_up", gate_up.len(), s.e * 2 * s.f * s.h)?;
                len("down", down.len(), s.e * s.h * s.f)?;
                routes(idx)?;
            }
            Inputs::DenseMlp { x, gate, up, down } => {
                len("x", x.len(), s.t * s.h)?;
                len("gate", gate.len(), s.f * s.h)?;
                len("up", up.len(), s.f * s.h)?;
                len("down", down.len(), s.h * s.f)?;
            }
            Inputs::LmHeadRow { hidden, emb, .. } => {
                len("hidden", hidden.len(), s.t * s.h)?;
                len("emb", emb.len(), s.v * s.h)?;
            }
        }
        let expected = output_len(self.op(), s);
        if out_len != expected {
            return Err(InputError::Output {
                expected,
                got: out_len,
            });
        }
        Ok(())
    }
}

/// Elements of an op's output: `[T, R, F]` for gate_up, `[V]` for the LM head, else `[T, H]`.
pub fn output_len(op: Op, s: &Shape) -> usize {
    match op {
        Op::GateUp => s.t * s.r * s.f,
        Op::LmHeadRow => s.v,
        _ => s.t * s.h,
    }
}

/// `T=1 R=8 E=128 H=2816 F=704`: the op's dims and their sizes.
pub fn describe(op: Op, s: &Shape) -> String {
    op.dims()
        .iter()
        .map(|d| format!("{}={}", d, s.dim(*d)))
        .collect::<Vec<_>>()
        .join(" ")
}
