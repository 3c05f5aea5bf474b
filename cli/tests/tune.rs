//! `moek tune`: the space pruned by the checker and counted by reason, the ranking, the winner
//! written as a spec that compiles and passes the harness, and the cache's key.

use moek_kernels::ir::{DType, Target};
use std::path::PathBuf;
use std::process::Command;

fn moek(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moek"))
        .args(args)
        .output()
        .expect("moek runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn json(args: &[&str]) -> serde_json::Value {
    let (ok, out, err) = moek(args);
    assert!(ok, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("moek-tune-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn path(&self, name: &str) -> String {
        self.0.join(name).to_str().unwrap().to_string()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The whole Spyre space of the 26B-A4B decode expert FFN: every candidate is legal or pruned
/// under a reason, the legal ones are ranked by modeled time, and the best is simulated on
/// values within the tolerance with the bytes the counting walk gave.
#[test]
fn spyre_ranks_every_legal_schedule_and_counts_the_pruned_by_reason() {
    let v = json(&[
        "tune",
        "--spec",
        "decode_expert_ffn_blocked",
        "--target",
        "spyre",
        "--dtype",
        "bf16",
        "--simulate",
        "1",
        "--no-cache",
        "--format",
        "json",
    ]);
    let legal = v["legal"].as_u64().unwrap();
    let pruned: u64 = v["pruned"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(legal > 0 && pruned > 0, "{v}");
    assert_eq!(legal + pruned, v["candidates"].as_u64().unwrap());
    assert!(
        v["pruned"]
            .as_object()
            .unwrap()
            .keys()
            .any(|why| why.contains("sticks")),
        "{v}"
    );
    let ranked = v["ranked"].as_array().unwrap();
    let skipped: u64 = v["skipped"]
        .as_object()
        .unwrap()
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(ranked.len() as u64 + skipped, legal);
    let ms: Vec<f64> = ranked
        .iter()
        .map(|r| r["figure"].as_f64().unwrap())
        .collect();
    assert!(ms.windows(2).all(|w| w[0] <= w[1]), "best first: {ms:?}");
    assert_eq!(ranked[0]["unit"], "ms");
    assert_eq!(ranked[0]["simulated"]["passed"], true, "{}", ranked[0]);
    assert_eq!(
        ranked[0]["simulated"]["counts_agree"], true,
        "{}",
        ranked[0]
    );
    assert!(ranked[1].get("simulated").is_none());
    // The floor is the weights read once: no schedule is modeled below it.
    let floor = v["floor"].as_f64().unwrap();
    assert!(ms[0] >= floor * (1.0 - 1e-9), "{} < floor {floor}", ms[0]);
}

/// On the CPU the winner is measured against the built-in; what `--write` writes compiles
/// unchanged through the DSL's checker to the schedule that won, and passes the equivalence
/// harness the generated tests run; the cache answers the same question again, and a corrupt
/// cache is a clear error.
#[test]
fn the_cpu_winner_is_written_as_a_spec_that_compiles_and_passes() {
    let dir = Scratch::new("cpu");
    let (spec, cache) = (dir.path("tuned.rs"), dir.path("cache.json"));
    let args = [
        "tune",
        "--dims",
        "T=1,R=2,E=4,H=256,F=128",
        "--activation",
        "silu",
        "--dtype",
        "bf16",
        "--target",
        "cpu",
        "--budget",
        "3",
        "--write",
        &spec,
        "--cache",
        &cache,
        "--format",
        "json",
    ];
    let v = json(&args);
    assert_eq!(v["cached"], false);
    assert!(v["legal"].as_u64().unwrap() > 1);
    let ranked = v["ranked"].as_array().unwrap();
    assert!(ranked[0]["vs_builtin"].as_f64().unwrap() > 0.0);
    assert!(ranked[0]["calls"].as_u64().unwrap() >= 1);
    assert_eq!(ranked[0]["unit"], "GB/s");
    let text = std::fs::read_to_string(&spec).unwrap();
    assert_eq!(text, v["spec"].as_str().unwrap());
    let tokens: proc_macro2::TokenStream = text.parse().unwrap();
    let specs = moek_dsl::parse::parse_specs(tokens).expect("the written spec parses");
    let k = moek_dsl::check::check(&specs[0]).expect("the written spec checks");
    // Every entry of the ranked schedule is a line of the written spec.
    for entry in ranked[0]["schedule"].as_str().unwrap().split("; ") {
        let (key, value) = entry.split_once(": ").unwrap();
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with(&format!("{key}:"))
                    && l.ends_with(&format!(" {value};"))),
            "`{entry}` is not in\n{text}"
        );
    }
    let entry = moek_kernels::KernelEntry::scheduled(k);
    moek_kernels::testing::check_spec(&entry, Target::Cpu, DType::Bf16);
    // Asked again: the cached winner, nothing measured.
    let again = json(&args);
    assert_eq!(again["cached"], true);
    assert_eq!(again["spec"], v["spec"]);
    // Another shape is another key: searched, not the cached pick.
    let mut other = args;
    other[2] = "T=1,R=2,E=4,H=256,F=64";
    assert_eq!(json(&other)["cached"], false);
    // A cache that is not moek's JSON is refused by name, and left as it was.
    std::fs::write(&cache, "{not json").unwrap();
    let (ok, out, err) = moek(&args);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("tuning cache") && err.contains("cache.json"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&cache).unwrap(), "{not json");
}

#[test]
fn bad_requests_are_refused_by_name() {
    for (args, want) in [
        (&["tune", "--dims", "T=1,R=8"][..], "`E` is missing"),
        (
            &[
                "tune",
                "--dims",
                "T=1,R=2,E=4,H=256,F=128",
                "--op",
                "gate_up",
            ],
            "not searched yet",
        ),
        (&["tune"], "--dims"),
        (&["tune", "--spec", "nope"], "no spec is named `nope`"),
        (
            &[
                "tune",
                "--dims",
                "T=1,R=2,E=4,H=256,F=128",
                "--write",
                "/nonexistent/dir/t.rs",
            ],
            "does not exist",
        ),
        (
            &["tune", "--dims", "T=1,R=2,E=4,H=256,F=128", "--dtype", "q9"],
            "unknown dtype `q9`",
        ),
        (
            &[
                "tune",
                "--dims",
                "T=1,R=2,E=4,H=256,F=128",
                "--activation",
                "relu",
            ],
            "unknown activation",
        ),
    ] {
        let (ok, out, err) = moek(args);
        assert!(!ok && out.is_empty(), "{args:?}: {out}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// The f32 fixture (tiny Gemma-4 MoE: H 64, F 32, 8 experts, top-2).
const F32: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/tiny-gemma4-moe-f32"
);

/// A spec tuned for the fixture (`--model`: its decode geometry, activation and f32 storage)
/// serves the model: `--tuned` ranks it ahead of
/// the built-ins and `--explain` names it on the decode steps' MoE (the one-token steps its
/// `T = 1` admits). A tuned file that does not check is refused by name before the model loads.
#[test]
fn the_model_runs_a_tuned_spec_and_explain_names_it() {
    let dir = Scratch::new("model");
    let spec = dir.path("tuned.rs");
    json(&[
        "tune",
        "--model",
        F32,
        "--target",
        "cpu",
        "--budget",
        "2",
        "--write",
        &spec,
        "--no-cache",
        "--format",
        "json",
    ]);
    let generate = [
        "generate",
        "--model",
        F32,
        "--tokens",
        "2,17,5",
        "--max-new-tokens",
        "3",
        "--greedy",
        "--explain",
        "--tuned",
        &spec,
    ];
    let (ok, _, err) = moek(&generate);
    assert!(ok, "{err}");
    let name = "tuned_expert_ffn_cpu_t1r2e8h64f32";
    let decode: Vec<&str> = err
        .lines()
        .filter(|l| l.contains(" moe (1 tokens)"))
        .collect();
    assert!(!decode.is_empty(), "{err}");
    assert!(decode.iter().all(|l| l.contains(name)), "{err}");
    std::fs::write(&spec, "pub broken = expert_ffn { dims: T = 1; }").unwrap();
    let (ok, out, err) = moek(&generate);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("--tuned") && err.contains("broken"), "{err}");
}

/// wgpu is searched by measurement as the CPU is (on lavapipe here, at a small size): ranked,
/// timed against the built-in in the same rounds, with no floor claimed.
#[test]
fn wgpu_is_searched_by_measurement() {
    let v = json(&[
        "tune",
        "--dims",
        "T=1,R=2,E=4,H=256,F=128",
        "--dtype",
        "f32",
        "--target",
        "wgpu",
        "--budget",
        "10",
        "--no-cache",
        "--format",
        "json",
    ]);
    assert_eq!(v["target"], "wgpu");
    let best = &v["ranked"][0];
    assert!(best["calls"].as_u64().unwrap() >= 1, "{v}");
    assert!(best["figure"].as_f64().unwrap() > 0.0);
    assert!(best["floor_ratio"].is_null() && v["floor"].is_null(), "{v}");
}

/// At sizes no built-in Spyre spec is fixed at (a user's new geometry), the search still ranks
/// and simulates: there is simply no built-in to compare with.
#[test]
fn spyre_searches_a_geometry_no_builtin_serves() {
    let v = json(&[
        "tune",
        "--dims",
        "T=1,R=4,E=16,H=512,F=256",
        "--target",
        "spyre",
        "--dtype",
        "bf16",
        "--simulate",
        "1",
        "--no-cache",
        "--format",
        "json",
    ]);
    assert!(v["builtin"].is_null(), "{v}");
    let best = &v["ranked"][0];
    assert!(best["vs_builtin"].is_null(), "{best}");
    assert_eq!(best["simulated"]["passed"], true, "{best}");
    assert!(
        v["spec"]
            .as_str()
            .unwrap()
            .contains("no built-in spec serves")
    );
}

/// Quantized weights are searched too: candidates whose cuts split a block are pruned by the
/// checker's reason (H 224 is seven blocks: reductions in 2, 4 or 8 parts split one), the rest
/// timed on blocks quantized once.
#[test]
fn quantized_weights_are_searched_on_whole_blocks() {
    let v = json(&[
        "tune",
        "--dims",
        "T=1,R=2,E=4,H=224,F=96",
        "--dtype",
        "q8_0_bf16",
        "--target",
        "cpu",
        "--budget",
        "2",
        "--no-cache",
        "--format",
        "json",
    ]);
    assert_eq!(v["dtype"], "q8_0_bf16");
    assert!(
        v["pruned"]
            .as_object()
            .unwrap()
            .keys()
            .any(|why| why.contains("whole blocks")),
        "{v}"
    );
    let best = &v["ranked"][0];
    assert!(best["calls"].as_u64().unwrap() >= 1, "{best}");
    assert!(v["spec"].as_str().unwrap().contains("q8_0_bf16"));
}
