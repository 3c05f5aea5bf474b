//! KTIR's textual forms: types, boxes, identity maps, and the SSA names and hoisted index
//! constants a rendering draws on.

use std::fmt::Write;

/// `tensor<AxBxT>`.
pub(super) fn tensor(shape: &[usize], dt: &str) -> String {
    format!("tensor<{}x{dt}>", dims(shape))
}

/// `memref<AxBxT>`.
pub(super) fn memref(shape: &[usize], dt: &str) -> String {
    format!("memref<{}x{dt}>", dims(shape))
}

/// `!ktdp.access_tile<AxBxindex>`.
pub(super) fn access_tile(shape: &[usize]) -> String {
    format!("!ktdp.access_tile<{}xindex>", dims(shape))
}

/// `AxB`.
pub(super) fn dims(shape: &[usize]) -> String {
    shape
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// The reassociation that folds every dim of a rank-`r` shape but the last into rows:
/// `[[0, 1], [2]]` for rank 3 (`tensor.collapse_shape` to `[rows, last]`, `expand_shape` back).
pub(super) fn rows_then_last(r: usize) -> String {
    let rows = (0..r - 1)
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    format!("[[{rows}], [{}]]", r - 1)
}

/// The box `0 <= d_i < shape[i]` as an affine set.
pub(super) fn boxed(shape: &[usize]) -> String {
    let vars = vars(shape.len());
    let bounds = shape
        .iter()
        .enumerate()
        .map(|(i, s)| format!("d{i} >= 0, -d{i} + {} >= 0", s - 1))
        .collect::<Vec<_>>()
        .join(", ");
    format!("affine_set<({vars}) : ({bounds})>")
}

/// The identity map of rank `r`.
pub(super) fn identity(r: usize) -> String {
    let vars = vars(r);
    format!("affine_map<({vars}) -> ({vars})>")
}

fn vars(r: usize) -> String {
    (0..r)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A function's text: numbered SSA names, index constants hoisted to its entry (ktir-cpu drops
/// a value defined inside a loop body when the body's scope ends), and affine-set aliases
/// defined above the module (its parser reads a group set only through an alias).
#[derive(Debug, Default)]
pub(super) struct Text {
    pub lines: Vec<String>,
    pub indent: usize,
    next: usize,
    constants: Vec<usize>,
    pub aliases: Vec<String>,
}

impl Text {
    /// An empty text whose lines start at `indent`.
    pub fn at(indent: usize) -> Text {
        Text {
            indent,
            ..Text::default()
        }
    }

    /// A fresh SSA name `%<stem><n>`.
    pub fn fresh(&mut self, stem: &str) -> String {
        self.next += 1;
        format!("%{stem}{}", self.next)
    }

    pub fn line(&mut self, s: impl AsRef<str>) {
        let mut l = "  ".repeat(self.indent);
        l.push_str(s.as_ref());
        self.lines.push(l);
    }

    /// `%name = op` on a fresh name.
    pub fn def(&mut self, stem: &str, op: impl AsRef<str>) -> String {
        let v = self.fresh(stem);
        self.line(format!("{v} = {}", op.as_ref()));
        v
    }

    /// The index constant `v`, defined once at the function's entry.
    pub fn index(&mut self, v: usize) -> String {
        if !self.constants.contains(&v) {
            self.constants.push(v);
        }
        format!("%c{v}")
    }

    /// The alias of affine set `set` (`#ringN`).
    pub fn alias(&mut self, set: String) -> String {
        let at = match self.aliases.iter().position(|a| *a == set) {
            Some(i) => i,
            None => {
                self.aliases.push(set);
                self.aliases.len() - 1
            }
        };
        format!("#ring{at}")
    }

    /// The index constants' definitions, one line each at `indent`.
    pub fn constants(&self, indent: usize) -> Vec<String> {
        self.constants
            .iter()
            .map(|v| {
                let mut l = "  ".repeat(indent);
                write!(l, "%c{v} = arith.constant {v} : index").expect("a string");
                l
            })
            .collect()
    }
}
