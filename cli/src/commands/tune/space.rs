//! The candidate schedules of an expert FFN, stated as `kernel!` text and kept only where the
//! DSL's own checker accepts them: the space is what the grammar can say, legality is the
//! compiler's, and an illegal candidate is counted by the checker's first reason, never run.

use moek_kernels::ir::tensors::{Optional, Optionals};
use moek_kernels::ir::{Activation, DType, Kernel, Target};
use std::collections::BTreeMap;

/// The sizes of an expert FFN (`T` tokens, `R` routes a token, `E` experts, hidden `H`,
/// intermediate `F`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dims {
    pub t: usize,
    pub r: usize,
    pub e: usize,
    pub h: usize,
    pub f: usize,
}

impl Dims {
    /// `T=1,R=8,E=128,H=2816,F=704` (any order, every dim once).
    pub fn parse(text: &str) -> Result<Dims, String> {
        let mut got: BTreeMap<&str, usize> = BTreeMap::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not DIM=SIZE"))?;
            let name = name.trim();
            if !["T", "R", "E", "H", "F"].contains(&name) {
                return Err(format!(
                    "`{name}` is not a dim of expert_ffn; valid: T, R, E, H, F"
                ));
            }
            let value: usize = value
                .trim()
                .parse()
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| format!("`{part}`: a size is a positive integer"))?;
            if got.insert(name, value).is_some() {
                return Err(format!("`{name}` is given twice"));
            }
        }
        let dim = |n: &str| {
            got.get(n)
                .copied()
                .ok_or_else(|| format!("`--dims` needs every dim of expert_ffn; `{n}` is missing"))
        };
        let d = Dims {
            t: dim("T")?,
            r: dim("R")?,
            e: dim("E")?,
            h: dim("H")?,
            f: dim("F")?,
        };
        if d.r > d.e {
            return Err(format!("R {} routes a token among E {} experts", d.r, d.e));
        }
        Ok(d)
    }

    pub fn text(&self) -> String {
        format!(
            "T={},R={},E={},H={},F={}",
            self.t, self.r, self.e, self.h, self.f
        )
    }

    pub fn shape(&self) -> moek_kernels::Shape {
        moek_kernels::Shape {
            t: self.t,
            r: self.r,
            e: self.e,
            h: self.h,
            f: self.f,
            ..moek_kernels::geometry::DECODE
        }
    }
}

/// What is searched: the op's sizes, its element type, activation and biases, and the target.
#[derive(Clone, Debug)]
pub struct Problem {
    pub dims: Dims,
    pub dtype: DType,
    pub activation: Activation,
    /// The optional tensors (the experts' biases).
    pub optional: Optionals,
    pub target: Target,
}

/// The biases as a spec writes them (`gate_up, down`), or `None` for none.
pub fn bias_text(o: Optionals) -> Option<String> {
    let named: Vec<&str> = o.iter().filter_map(Optional::bias_name).collect();
    (!named.is_empty()).then(|| named.join(", "))
}

/// One point of the space: the schedule's entries, in the order docs/dsl.md documents them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    pub lines: Vec<(String, String)>,
}

impl Schedule {
    /// The entries on one line, as a table shows them.
    pub fn summary(&self) -> String {
        self.lines
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// The whole spec, named `name`, as `kernel!` text.
    pub fn spec(&self, name: &str, p: &Problem, doc: &str) -> String {
        let d = p.dims;
        let mut lines = vec![
            (
                "dims".to_string(),
                format!(
                    "T = {}, R = {}, E = {}, H = {}, F = {}",
                    d.t, d.r, d.e, d.h, d.f
                ),
            ),
            ("dtypes".to_string(), p.dtype.to_string()),
            ("targets".to_string(), p.target.to_string()),
        ];
        if p.activation != Activation::default() {
            lines.push(("activation".to_string(), activation_text(p.activation)));
        }
        if let Some(b) = bias_text(p.optional) {
            lines.push(("bias".to_string(), b));
        }
        lines.extend(self.lines.iter().cloned());
        let width = lines.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
        let body: String = lines
            .iter()
            .map(|(k, v)| format!("        {:<width$} {v};\n", format!("{k}:")))
            .collect();
        let doc: String = doc.lines().map(|l| format!("    /// {l}\n")).collect();
        format!("{doc}    pub {name} = expert_ffn {{\n{body}    }}\n")
    }
}

impl Schedule {
    /// The schedule of `k` (a built-in spec, say) as spec entries, so the incumbent is a
    /// candidate too and the search never ends slower than it. `None` where `k` has an entry
    /// the search does not state (streaming tiles).
    pub fn of(k: &Kernel) -> Option<Schedule> {
        use moek_kernels::ir::{Blocks, Phase, Selection};
        let s = &k.schedule;
        if !s.stream.is_empty() {
            return None;
        }
        let line = |k: &str, v: String| (k.to_string(), v);
        let blocks = |b: &Blocks| match b.sizes.as_slice() {
            [first, ..] if b.sizes.iter().all(|x| x == first) && b.sizes.len() > 1 => {
                format!("{} = {first} x {}", b.dim, b.sizes.len())
            }
            sizes => format!(
                "{} = [{}]",
                b.dim,
                sizes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut lines = vec![line(
            "select",
            match s.select {
                Selection::Gather => "gather E by R".into(),
                Selection::Grouped => "grouped E by R".into(),
                Selection::Dense => "dense E".into(),
                Selection::None => return None,
            },
        )];
        lines.extend(s.reduce.iter().map(|b| line("reduce", blocks(b))));
        lines.extend(s.columns.iter().map(|b| line("columns", blocks(b))));
        for c in &s.cores {
            let key = match c.phase {
                Phase::All => "cores".to_string(),
                Phase::GateUp => "cores(gate_up)".to_string(),
                Phase::Down => "cores(down)".to_string(),
            };
            let dims: Vec<String> = c.splits.iter().map(|x| x.dim.to_string()).collect();
            let parts: Vec<String> = c.splits.iter().map(|x| x.parts.to_string()).collect();
            lines.push((key, format!("{} = {}", dims.join(" x "), parts.join(" x "))));
        }
        if let Some(g) = &s.groups {
            lines.push(line("groups", format!("{} = {}", g.dim, g.parts)));
        }
        if let Some(d) = s.persistent {
            lines.push(line("loop", format!("{d} persistent")));
        }
        if !k.requires.is_empty() {
            let r: Vec<String> = k.requires.iter().map(ToString::to_string).collect();
            lines.push(line("requires", r.join(", ")));
        }
        Some(Schedule { lines })
    }
}

/// An activation as a spec writes it.
pub fn activation_text(a: Activation) -> String {
    match a {
        Activation::GeluTanh => "gelu_tanh".into(),
        Activation::Silu => "silu".into(),
        Activation::SwigluClamped { limit, alpha } => {
            format!("swiglu_clamped(limit = {limit:?}, alpha = {alpha:?})")
        }
    }
}

/// Every schedule the grammar can state for `p`'s sizes, before the checker: selection (gather,
/// grouped, dense with a persistent expert loop), reduction blocks of H, column blocks of H,
/// core splits per phase (route owners, tokens, and one reduction or column dim), token groups.
pub fn candidates(p: &Problem) -> Vec<Schedule> {
    let d = p.dims;
    let mut out = Vec::new();
    let line = |k: &str, v: String| (k.to_string(), v);
    // Reduction blocks of H: equal blocks, 2 to 8 of them (the checker keeps those in whole
    // sticks on Spyre).
    let mut reduce: Vec<Option<String>> = vec![None];
    reduce.extend(
        (2..=8)
            .filter(|&n| d.h.is_multiple_of(n))
            .map(|n| Some(format!("H = {} x {n}", d.h / n))),
    );
    // Column blocks of H: blocks of c columns, the remainder last (1024/1024/768 is c = 1024
    // at H 2816), at most 8 blocks.
    let mut columns: Vec<Option<String>> = vec![None];
    for c in [256, 512, 768, 1024, 1536, 2048] {
        if c >= d.h || d.h.div_ceil(c) > 8 {
            continue;
        }
        let mut sizes = vec![c; d.h / c];
        if !d.h.is_multiple_of(c) {
            sizes.push(d.h % c);
        }
        let text = sizes
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        columns.push(Some(format!("H = [{text}]")));
    }
    let routes: Vec<usize> = [d.r, d.r / 2, 1]
        .into_iter()
        .filter(|&r| r >= 1)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .rev()
        .collect();
    // Gathered routes (decode and short prompts): route owners alone, or route owners beside a
    // split of the phase's other cut dim (at most 32 cores in all).
    let splits = |other: &str| -> Vec<String> {
        routes
            .iter()
            .map(|r| format!("R = {r}"))
            .chain(
                [2, 4, 8, 16]
                    .into_iter()
                    .filter(|k| d.r * k <= 32)
                    .map(|k| format!("R x {other} = {} x {k}", d.r)),
            )
            .collect()
    };
    let (gate_up, down) = (splits("F"), splits("H"));
    if d.t <= 8 {
        for red in &reduce {
            for col in &columns {
                for gu in &gate_up {
                    for dn in &down {
                        let mut lines = vec![line("select", "gather E by R".into())];
                        lines.extend(red.clone().map(|v| line("reduce", v)));
                        lines.extend(col.clone().map(|v| line("columns", v)));
                        lines.push(line("cores(gate_up)", gu.clone()));
                        lines.push(line("cores(down)", dn.clone()));
                        if red.is_some() || col.is_some() {
                            lines.push(line("requires", "indexed_selection_layout".into()));
                        }
                        out.push(Schedule { lines });
                    }
                }
            }
        }
    }
    if d.t >= 2 {
        // Tokens grouped by expert: one GEMM pair per bank (the grammar gives it no cuts).
        out.push(Schedule {
            lines: vec![line("select", "grouped E by R".into())],
        });
        // Every expert densely in one persistent loop, token groups owning x and the
        // accumulator, T x (H or F) core splits per phase.
        let splits = |second: &str| -> Vec<String> {
            let mut v = Vec::new();
            for a in [1, 2, 4, 8, 16, 32] {
                for b in [1, 2, 4, 8] {
                    if a * b <= 32 && a * b >= 8 {
                        v.push(format!("T x {second} = {a} x {b}"));
                    }
                }
            }
            v
        };
        for g in [8, 16, 32] {
            for gu in splits("H").iter().chain(&splits("F")) {
                for dn in splits("H").iter().chain(&splits("F")) {
                    out.push(Schedule {
                        lines: vec![
                            line("select", "dense E".into()),
                            line("cores(gate_up)", gu.clone()),
                            line("cores(down)", dn.clone()),
                            line("groups", format!("T = {g}")),
                            line("loop", "E persistent".into()),
                            line("requires", "lx_completed_sum".into()),
                        ],
                    });
                }
            }
        }
    }
    out
}

/// The checker's verdict on every candidate: the legal ones with their IR, and the illegal ones
/// counted by reason (the checker's first message, numbers written `N`, so one rule is one row).
#[derive(Debug, Default)]
pub struct Checked {
    pub legal: Vec<(Schedule, Kernel)>,
    pub pruned: BTreeMap<String, usize>,
}

/// Runs the DSL's checker (the one `kernel!` runs) on each candidate's spec text.
pub fn check(p: &Problem, candidates: Vec<Schedule>) -> Checked {
    let mut checked = Checked::default();
    for (i, s) in candidates.into_iter().enumerate() {
        let text = s.spec(&format!("candidate_{i}"), p, "");
        match crate::commands::spec_text::compile(&text) {
            Ok(k) => checked.legal.push((s, k)),
            Err(why) => *checked.pruned.entry(reason(&why.messages[0])).or_default() += 1,
        }
    }
    checked
}

/// A checker message as a reason class: its numbers written `N`, without the valid choices
/// some messages list after `; `.
fn reason(message: &str) -> String {
    let first = message.split("; ").next().unwrap_or(message);
    let mut out = String::new();
    let mut in_number = false;
    for c in first.chars() {
        if c.is_ascii_digit() || (in_number && c == '.') {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every built-in expert FFN's schedule, stated by `Schedule::of` and checked again, is the
    /// schedule it had: the incumbent enters the search as itself.
    #[test]
    fn builtin_schedules_are_stated_as_they_are() {
        let builtin = moek_kernels::Registry::builtin();
        let mut stated = 0;
        for entry in builtin.entries() {
            let k = entry.ir();
            if k.op != moek_kernels::ir::Op::ExpertFfn {
                continue;
            }
            let Some(schedule) = Schedule::of(k) else {
                continue;
            };
            let s = moek_kernels::geometry::real_shape(k);
            let p = Problem {
                dims: Dims {
                    t: s.t,
                    r: s.r,
                    e: s.e,
                    h: s.h,
                    f: s.f,
                },
                dtype: k.dtypes[0],
                activation: k.activation,
                optional: k.optional,
                target: k.targets[0],
            };
            let text = schedule.spec("again", &p, "");
            let again = crate::commands::spec_text::compile(&text)
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", k.name));
            assert_eq!(again.schedule, k.schedule, "{}\n{text}", k.name);
            assert_eq!(again.requires, k.requires, "{}", k.name);
            stated += 1;
        }
        assert!(stated >= 10, "{stated}");
    }

    #[test]
    fn reasons_class_messages_by_their_words() {
        assert_eq!(
            reason("split 3 does not divide `H` 2816; valid: 1, 2"),
            "split N does not divide `H` N"
        );
    }

    #[test]
    fn dims_are_read_whole_or_refused() {
        let d = Dims::parse("T=1,R=8,E=128,H=2816,F=704").unwrap();
        assert_eq!(d.text(), "T=1,R=8,E=128,H=2816,F=704");
        assert!(
            Dims::parse("T=1,R=8,E=128,H=2816")
                .unwrap_err()
                .contains("`F`")
        );
        assert!(
            Dims::parse("T=1,R=8,E=4,H=2,F=2")
                .unwrap_err()
                .contains("R 8")
        );
        assert!(Dims::parse("X=1").unwrap_err().contains("valid: T"));
    }
}
