//! `moek spyre-calibrate`: the cost model beside the public device figures (docs/spyre-program.md), whatever
//! the ratio, and the decode blocking pairs the device recorded, with the bytes that explain the
//! model's order. The model is built from public constants and is not tuned to any of these.

use super::{CommandError, spec};
use moek_kernels::geometry;
use moek_kernels::ir::{DType, Target};
use moek_kernels::testing::{self, Modeled};
use std::process::ExitCode;

/// A public figure and the built-in spec of the same shape.
struct Figure {
    what: &'static str,
    public_ms: f64,
    spec: &'static str,
}

const FIGURES: &[Figure] = &[
    Figure {
        what: "expert loop, decode (one token, 8 routes)",
        public_ms: 2.75,
        spec: "decode_expert_ffn_blocked",
    },
    Figure {
        what: "expert loop, prefill (E128/T512/H2816/F704)",
        public_ms: 40.22,
        spec: "prefill_expert_ffn_persistent",
    },
    Figure {
        what: "expert function E128/T512/H2816/F704 (29-31)",
        public_ms: 30.0,
        spec: "prefill_expert_ffn_persistent",
    },
    Figure {
        what: "expert FFN, persistent",
        public_ms: 42.6,
        spec: "prefill_expert_ffn_persistent",
    },
];

/// A schedule change the device measured, and the built-in specs on either side of it.
struct Pair {
    what: &'static str,
    device_ms: (f64, f64),
    before: &'static str,
    after: &'static str,
}

/// The decode expert layer before and after each blocking change (docs/spyre-program.md).
const PAIRS: &[Pair] = &[
    Pair {
        what: "gate/up blocking, H 704 x 4",
        device_ms: (4.043, 2.956),
        before: "decode_expert_ffn_ordinary",
        after: "decode_expert_ffn_gate_up_blocked",
    },
    Pair {
        what: "down column blocks 1024/1024/768",
        device_ms: (2.948, 2.501),
        before: "decode_expert_ffn_gate_up_blocked",
        after: "decode_expert_ffn_blocked",
    },
];

pub fn run() -> Result<ExitCode, CommandError> {
    println!("{}", moek_spyre::cost::assumptions());
    println!(
        "{:<48} {:>10} {:>11} {:>8}",
        "public figure", "public ms", "modeled ms", "ratio"
    );
    let mut runs: Vec<(&str, Modeled)> = Vec::new();
    for f in FIGURES {
        if !runs.iter().any(|r| r.0 == f.spec) {
            runs.push((f.spec, modeled(f.spec)?));
        }
        let m = &runs.iter().find(|r| r.0 == f.spec).expect("run above").1;
        let ms = m.seconds * 1e3;
        println!(
            "{:<48} {:>10.2} {:>11.3} {:>8.3}  ({}, {} bound)",
            f.what,
            f.public_ms,
            ms,
            ms / f.public_ms,
            f.spec,
            m.dominant
        );
    }
    println!(
        "\ndecode schedule pairs the device recorded (bf16, one token, 8 routes), modeled on the built-in specs:"
    );
    let mut agree = 0;
    for pair in PAIRS {
        let (before, after) = (modeled(pair.before)?, modeled(pair.after)?);
        let same_order = (before.seconds > after.seconds) == (pair.device_ms.0 > pair.device_ms.1);
        agree += usize::from(same_order);
        println!(
            "  {:<36} device {:.3} -> {:.3} ms, modeled {:.3} -> {:.3} ms ({}): {}",
            pair.what,
            pair.device_ms.0,
            pair.device_ms.1,
            before.seconds * 1e3,
            after.seconds * 1e3,
            pair.after,
            if same_order {
                "same order"
            } else {
                "other order"
            }
        );
        for (name, m) in [(pair.before, &before), (pair.after, &after)] {
            println!(
                "    {name:<34} {:.1} MB device<->LX ({:.1} MB of it selected-weight copies), {:.1} KB ring, {} bound",
                m.dev_bytes as f64 / 1e6,
                m.copy_bytes as f64 / 1e6,
                m.ring_bytes as f64 / 1e3,
                m.dominant
            );
        }
    }
    println!(
        "  {agree} of {} pairs in the device's order. Blocking reads each block of the unchanged bank by route,\n  \
         where an unblocked selection is copied whole first (docs/spyre-program.md, \"Selected-weight copies\").",
        PAIRS.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// The modeled cost of one simulated run of `name` at its fixed size (bf16).
fn modeled(name: &str) -> Result<Modeled, CommandError> {
    let entry = spec(&moek_kernels::Registry::builtin(), name)?;
    let shape = testing::shape_for(entry.ir(), &geometry::DECODE);
    let report = testing::run_seeds(&entry, Target::Spyre, DType::Bf16, &shape, &[1]).remove(0);
    Ok(report.modeled.expect("spyre runs carry the cost model"))
}
