//! Bounded fuzzing on the stable toolchain: seeded random mutations of valid inputs, a fixed
//! number per target in CI (seconds), as many as asked for in a soak run. Every run prints its
//! seed and count; a failing input is printed with the seed and iteration that rebuild it.
//!
//! `MOEK_FUZZ_ITERS=N` sets the count for every target, `MOEK_FUZZ_SEED=S` the seed (else a
//! fixed one, so CI is repeatable).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::fmt::Debug;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// The seed CI uses when `MOEK_FUZZ_SEED` is unset.
pub const CI_SEED: u64 = 0x6d6f_656b;

/// One fuzz target's run: how many inputs, from which seed.
#[derive(Debug)]
pub struct Fuzz {
    pub name: &'static str,
    pub seed: u64,
    pub iters: usize,
}

impl Fuzz {
    /// `ci_iters` inputs unless `MOEK_FUZZ_ITERS` says otherwise; prints what it will run.
    pub fn new(name: &'static str, ci_iters: usize) -> Fuzz {
        let env = |key: &str| std::env::var(key).ok().and_then(|v| v.parse().ok());
        let f = Fuzz {
            name,
            seed: env("MOEK_FUZZ_SEED").unwrap_or(CI_SEED),
            iters: env("MOEK_FUZZ_ITERS").map_or(ci_iters, |n: u64| n as usize),
        };
        eprintln!(
            "fuzz {}: {} inputs from MOEK_FUZZ_SEED={}",
            f.name, f.iters, f.seed
        );
        f
    }

    /// For each iteration, draws an input with `make` and runs `check` on it. A panic anywhere,
    /// or an `Err` from `check`, fails with the input, the seed and the iteration. Returns how
    /// many inputs `check` accepted (`Ok(true)`) and refused (`Ok(false)`).
    pub fn run<T: Debug>(
        &self,
        mut make: impl FnMut(&mut SmallRng) -> T,
        mut check: impl FnMut(&T) -> Result<bool, String>,
    ) -> Counts {
        let mut counts = Counts::default();
        quiet_panics_in_fuzz_runs();
        for i in 0..self.iters {
            let mut rng = SmallRng::seed_from_u64(self.seed.wrapping_add(i as u64));
            let input = make(&mut rng);
            IN_RUN.with(|r| r.set(true));
            let outcome = catch_unwind(AssertUnwindSafe(|| check(&input)));
            IN_RUN.with(|r| r.set(false));
            let fail = |why: String| -> ! {
                let mut shown = format!("{input:?}");
                if shown.len() > 4000 {
                    shown.truncate(4000);
                    shown.push_str(" ...");
                }
                panic!(
                    "fuzz {}: {why}\n  rebuild: MOEK_FUZZ_SEED={}, iteration {i}\n  input: {shown}",
                    self.name, self.seed,
                )
            };
            match outcome {
                Ok(Ok(true)) => counts.accepted += 1,
                Ok(Ok(false)) => counts.refused += 1,
                Ok(Err(why)) => fail(why),
                Err(panic) => {
                    let msg = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    let at = PANICKED_AT
                        .with(|p| p.borrow_mut().take())
                        .unwrap_or_default();
                    fail(format!("panicked at {at}: {msg}"))
                }
            }
        }
        eprintln!(
            "fuzz {}: {} accepted, {} refused with an error",
            self.name, counts.accepted, counts.refused
        );
        counts
    }
}

thread_local! {
    static IN_RUN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    static PANICKED_AT: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Installs, once per process, a panic hook that records where a panic inside a fuzz run
/// happened (the report prints it) instead of printing a backtrace per input; panics elsewhere
/// go to the hook that was there before.
fn quiet_panics_in_fuzz_runs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_RUN.with(|r| r.get()) {
                let at = info
                    .location()
                    .map(|l| format!("{}:{}", l.file(), l.line()));
                PANICKED_AT.with(|p| *p.borrow_mut() = at);
            } else {
                before(info)
            }
        }));
    });
}

/// What a run's inputs came to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub accepted: usize,
    pub refused: usize,
}

/// Applies `n` random mutations to `v`: a node replaced by a value of the wrong type, an absurd
/// number (0, 2^40, negative, fractional, huge) or nested garbage; an object key removed; an
/// array element removed, duplicated or the array cut short; two numbers swapped.
pub fn mutate_json(v: &mut Value, n: usize, rng: &mut SmallRng) {
    for _ in 0..n {
        let paths = paths(v);
        let path = &paths[rng.random_range(0..paths.len())];
        let (parent, last) = path.split_at(path.len().saturating_sub(1));
        match rng.random_range(0..6) {
            0 if !last.is_empty() => {
                // Remove the node from its parent.
                match (at(v, parent), &last[0]) {
                    (Value::Object(m), Step::Key(k)) => {
                        m.remove(k);
                    }
                    (Value::Array(a), Step::Index(i)) => {
                        a.remove(*i);
                    }
                    _ => {}
                }
            }
            1 if !last.is_empty() => {
                if let (Value::Array(a), Step::Index(i)) = (at(v, parent), &last[0]) {
                    let keep = rng.random_range(0..=*i);
                    if rng.random_bool(0.5) {
                        a.truncate(keep);
                    } else {
                        let dup = a[*i].clone();
                        a.insert(keep, dup);
                    }
                }
            }
            2 => *at(v, path) = absurd_number(rng),
            3 => *at(v, path) = wrong_type(rng),
            4 => {
                if let Value::Number(x) = at(v, path) {
                    let x = x.as_f64().unwrap_or(0.0);
                    *at(v, path) = serde_json::json!(x + rng.random_range(-2..=2) as f64);
                } else {
                    *at(v, path) = absurd_number(rng);
                }
            }
            _ => *at(v, path) = garbage(rng, 3),
        }
    }
}

#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

/// Every node's path, the root first.
fn paths(v: &Value) -> Vec<Vec<Step>> {
    let mut out = vec![vec![]];
    let mut i = 0;
    while i < out.len() {
        let path = out[i].clone();
        match at_ref(v, &path) {
            Value::Object(m) => out.extend(m.keys().map(|k| {
                let mut p = path.clone();
                p.push(Step::Key(k.clone()));
                p
            })),
            Value::Array(a) => out.extend((0..a.len()).map(|j| {
                let mut p = path.clone();
                p.push(Step::Index(j));
                p
            })),
            _ => {}
        }
        i += 1;
    }
    out
}

fn at_ref<'v>(v: &'v Value, path: &[Step]) -> &'v Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &v[k.as_str()],
        Step::Index(i) => &v[*i],
    })
}

fn at<'v>(v: &'v mut Value, path: &[Step]) -> &'v mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

/// A number no sane config or program has, or an edge one.
pub fn absurd_number(rng: &mut SmallRng) -> Value {
    let choices: [Value; 12] = [
        0.into(),
        1.into(),
        (-1).into(),
        (1u64 << 40).into(),
        u64::MAX.into(),
        i64::MIN.into(),
        (1u64 << 32).into(),
        serde_json::json!(0.5),
        serde_json::json!(-1e300),
        serde_json::json!(1e308),
        3.into(),
        (usize::MAX / 2).into(),
    ];
    choices[rng.random_range(0..choices.len())].clone()
}

fn wrong_type(rng: &mut SmallRng) -> Value {
    match rng.random_range(0..6) {
        0 => Value::Null,
        1 => Value::Bool(rng.random_bool(0.5)),
        2 => "garbage".into(),
        3 => "".into(),
        4 => Value::Array(vec![]),
        _ => Value::Object(Default::default()),
    }
}

/// Nested garbage up to `depth` levels.
fn garbage(rng: &mut SmallRng, depth: usize) -> Value {
    if depth == 0 || rng.random_bool(0.4) {
        return if rng.random_bool(0.5) {
            absurd_number(rng)
        } else {
            wrong_type(rng)
        };
    }
    if rng.random_bool(0.5) {
        Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| garbage(rng, depth - 1))
                .collect(),
        )
    } else {
        let mut m = serde_json::Map::new();
        for k in ["a", "type", "shape", "0"]
            .iter()
            .take(rng.random_range(0..4))
        {
            m.insert(k.to_string(), garbage(rng, depth - 1));
        }
        Value::Object(m)
    }
}

/// Mutates `bytes` in place: a few random bytes overwritten, and maybe cut short.
pub fn mutate_bytes(bytes: &mut Vec<u8>, rng: &mut SmallRng) {
    for _ in 0..rng.random_range(1..4) {
        if !bytes.is_empty() {
            let i = rng.random_range(0..bytes.len());
            bytes[i] = rng.random();
        }
    }
    if rng.random_bool(0.3) {
        let keep = rng.random_range(0..=bytes.len());
        bytes.truncate(keep);
    }
}
