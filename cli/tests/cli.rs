//! The `moek` command as users run it.

use moek_kernels::ir::Target;
use std::process::Command;

fn moek(args: &[&str]) -> (bool, String, String) {
    moek_env(args, &[])
}

/// `moek` with extra environment variables.
fn moek_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let (code, out, err) = moek_raw(&os(args), env);
    (code == 0, out, err)
}

#[test]
fn list_prints_every_spec_name_first() {
    let (ok, out, _) = moek(&["list"]);
    assert!(ok);
    let names: Vec<&str> = out
        .lines()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let builtin = moek_kernels::Registry::builtin();
    let want: Vec<&str> = builtin.entries().map(|e| e.name()).collect();
    assert_eq!(names, want);
    assert!(out.contains("reduce H=704x4"), "{out}");
}

#[test]
fn emit_prints_the_generated_cpu_variant() {
    let (ok, out, _) = moek(&["emit", "decode_gate_up_h704x4", "--backend", "cpu"]);
    assert!(ok);
    assert!(out.contains("pub fn cpu<"), "{out}");
    assert!(
        out.contains("(0usize, 704usize),\n") && out.contains("(2112usize, 2816usize),\n"),
        "the blocks are baked in: {out}"
    );
    assert!(
        out.contains("(::moek_kernels::__private::ir::DimName::T, 1usize)"),
        "the fixed sizes are baked in: {out}"
    );
    assert!(out.contains("Skeleton::GateUp"), "{out}");
    looks_formatted(&out);
}

/// The printed source is formatted Rust (prettyplease output ends each item with a newline).
fn looks_formatted(src: &str) {
    assert!(src.lines().count() > 20 && src.ends_with("}\n"), "{src}");
}

#[test]
fn emit_errors_are_clear() {
    let (ok, _, err) = moek(&["emit", "nope", "--backend", "cpu"]);
    assert!(!ok);
    assert!(err.contains("no spec is named `nope`"), "{err}");
    let (ok, _, err) = moek(&["emit", "general_down", "--backend", "spyre"]);
    assert!(!ok);
    assert!(
        err.contains("does not target spyre (targets: cpu, wgpu)"),
        "{err}"
    );
}

#[test]
fn check_runs_specs_at_real_size_and_reports() {
    let (ok, out, err) = moek(&[
        "check",
        "--filter",
        "decode_gate_up",
        "--require",
        "cpu,spyre",
    ]);
    assert!(ok, "{out}{err}");
    let row = |target: &str, dtype: &str| {
        out.lines().any(|l| {
            l.starts_with(&format!("decode_gate_up_h704x4 [{target}]"))
                && l.contains(&format!(" {dtype} "))
                && l.contains("T=1 R=8 E=128 H=2816 F=704")
                && l.ends_with("yes")
        })
    };
    for target in ["cpu", "spyre"] {
        for dtype in ["f16", "bf16"] {
            assert!(
                row(target, dtype),
                "no passing {target} {dtype} row in {out}"
            );
        }
    }
    assert_eq!(
        out.matches("modeled ").count(),
        2,
        "spyre rows carry the cost model: {out}"
    );
    assert!(
        out.contains("ASSUMED 1.5 GHz"),
        "the ring clock assumption is printed: {out}"
    );
}

#[test]
fn emit_prints_the_spyre_program() {
    let (ok, out, err) = moek(&["emit", "decode_expert_ffn_blocked", "--backend", "spyre"]);
    assert!(ok, "{err}");
    for key in [
        "\"cores_used\": 8",
        "\"indexed_load\"",
        "\"lx_budget\": 1677721",
        "\"scale_acc\"",
    ] {
        assert!(out.contains(key), "no {key} in the program");
    }
    let (ok, out, err) = moek(&[
        "emit",
        "prefill_expert_ffn_persistent",
        "--backend",
        "spyre",
    ]);
    assert!(ok, "{err}");
    for key in [
        "\"loop\"",
        "\"divisions\"",
        "\"advancing\"",
        "\"ring_reduce\"",
        "\"cores_used\": 32",
    ] {
        assert!(out.contains(key), "no {key} in the persistent program");
    }
}

#[test]
fn check_refuses_a_backend_it_cannot_run() {
    let (ok, _, err) = moek(&["check", "--require", "metal"]);
    assert!(!ok);
    assert!(
        err.contains("invalid value 'metal' for '--require")
            && err.contains("[possible values: cpu, wgpu, spyre]"),
        "{err}"
    );
}

/// `moek` with an adapter filter nothing matches: as on a machine without a GPU driver.
fn moek_without_adapter(args: &[&str]) -> (bool, String, String) {
    moek_env(args, &[("WGPU_ADAPTER_NAME", "no-such-adapter")])
}

#[test]
fn without_an_adapter_check_says_so_and_goes_on_unless_wgpu_is_required() {
    let (ok, out, err) = moek_without_adapter(&["check", "--filter", "dense_mlp_26b"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("wgpu: no adapter"), "{out}");
    assert!(out.contains("apt-get install mesa-vulkan-drivers"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.contains("[wgpu]") && l.contains("no adapter: not run")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.contains("[cpu]") && l.ends_with("yes")),
        "{out}"
    );
    // A run without wgpu rows does not ask for an adapter, so it says nothing of one.
    let (ok, out, err) =
        moek_without_adapter(&["check", "--backend", "cpu", "--filter", "dense_mlp_26b"]);
    assert!(ok, "{out}{err}");
    assert!(!out.contains("wgpu"), "{out}");
    assert!(out.lines().any(|l| l.contains("[cpu]")), "{out}");
    let (ok, _, err) =
        moek_without_adapter(&["check", "--require", "wgpu", "--filter", "dense_mlp_26b"]);
    assert!(!ok);
    assert!(
        err.contains("backend `wgpu` is required but no wgpu adapter"),
        "{err}"
    );
}

#[test]
fn check_runs_the_wgpu_column_with_the_adapter_name() {
    let (ok, out, err) = moek(&["check", "--require", "wgpu", "--filter", "general_down"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("wgpu adapter: "), "{out}");
    for dtype in ["f16", "bf16", "f32"] {
        assert!(
            out.lines().any(|l| l.starts_with("general_down [wgpu]")
                && l.contains(&format!(" {dtype} "))
                && l.ends_with("yes")),
            "{out}"
        );
    }
}

#[test]
fn check_names_what_a_cpu_driver_ran_and_prints_its_wall_time() {
    // The wgpu rows alone: the CPU rows would draw the whole 262144-row head in every dtype.
    let (ok, out, err) = moek(&[
        "check",
        "--require",
        "wgpu",
        "--backend",
        "wgpu",
        "--filter",
        "general_lm_head_row",
    ]);
    assert!(ok, "{out}{err}");
    assert!(
        !out.contains(" [cpu] ") && !out.contains(" [spyre] "),
        "{out}"
    );
    let cut = "run at T=1 H=2816 V=32768, not the spec's T=1 H=2816 V=262144";
    // A row per dtype of the plain head and the quantized one on wgpu.
    let wgpu_rows = out.lines().filter(|l| l.contains(" [wgpu] ")).count();
    let declared: usize = moek_kernels::Registry::builtin()
        .entries()
        .map(|e| e.ir())
        .filter(|k| k.name.contains("general_lm_head_row") && k.targets.contains(&Target::Wgpu))
        .map(|k| k.dtypes.len())
        .sum();
    assert_eq!(wgpu_rows, declared, "{out}");
    assert!(
        declared >= 5,
        "the plain and quantized heads declare {declared} dtypes"
    );
    // Mesa's CPU drivers (CI's lavapipe) run the head at fewer rows and say so; a GPU runs it whole.
    let cpu_driver = out.contains("llvmpipe") || out.contains("lavapipe");
    assert_eq!(
        out.matches(cut).count(),
        if cpu_driver { wgpu_rows } else { 0 },
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("check took ") && l.contains("(CPU ISA ")),
        "{out}"
    );
}

#[test]
fn one_backend_name_serves_every_command() {
    // `wgpu` and `wgsl` name the same backend to `emit`.
    let (ok, by_backend, err) = moek(&["emit", "decode_expert_ffn_blocked", "--backend", "wgpu"]);
    assert!(ok, "{err}");
    let (_, by_language, _) = moek(&["emit", "decode_expert_ffn_blocked", "--backend", "wgsl"]);
    assert_eq!(by_backend, by_language);
    // `bench` measures this machine's backends and says where Spyre's figures are, before
    // measuring anything.
    let (ok, out, err) = moek(&["bench", "--backend", "spyre"]);
    assert!(!ok);
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("moek spyre-calibrate"), "{err}");
}

#[test]
fn emit_prints_the_wgsl_program() {
    let (ok, out, err) = moek(&["emit", "decode_expert_ffn_blocked", "--backend", "wgsl"]);
    assert!(ok, "{err}");
    assert!(out.contains("@compute @workgroup_size(WG)"), "{out}");
    assert!(out.contains("fn down_routes_cols2("), "{out}");
    assert!(!out.contains("enable f16;"));
    let (ok, out, _) = moek(&[
        "emit",
        "decode_expert_ffn_blocked",
        "--backend",
        "wgsl",
        "--dtype",
        "f16",
        "--f16",
    ]);
    assert!(ok);
    assert!(out.contains("enable f16;"), "{out}");
    let (ok, _, err) = moek(&[
        "emit",
        "decode_expert_ffn_blocked",
        "--backend",
        "wgsl",
        "--dtype",
        "f32",
    ]);
    assert!(!ok);
    assert!(
        err.contains("has no `f32` variant (dtypes: f16, bf16)"),
        "{err}"
    );
}

const F32: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/tiny-gemma4-moe-f32"
);

#[test]
fn logits_prints_the_last_row_or_every_row_as_json() {
    let (ok, out, err) = moek(&[
        "logits", "--model", F32, "--tokens", "2,17,5", "--format", "json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["position"], 2);
    assert_eq!(rows[0]["logits"].as_array().unwrap().len(), 512);
    let (ok, out, _) = moek(&[
        "logits", "--model", F32, "--tokens", "2,17,5", "--all", "--format", "json",
    ]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let positions: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["position"].as_u64().unwrap())
        .collect();
    assert_eq!(positions, [0, 1, 2]);
    // The weights read in place or copied into huge pages: the same logits, to the bit.
    let by = |weights: &str| {
        let (ok, out, err) = moek(&[
            "logits",
            "--model",
            F32,
            "--tokens",
            "2,17,5",
            "--weights",
            weights,
            "--format",
            "json",
        ]);
        assert!(ok, "{err}");
        out
    };
    assert_eq!(by("mapped"), by("huge-pages"));
}

#[test]
fn generate_prints_new_tokens_and_explains_its_choices() {
    let (ok, out, err) = moek(&[
        "generate",
        "--model",
        F32,
        "--tokens",
        "2,17,5,9,33,41,7,12,3,60",
        "--max-new-tokens",
        "4",
        "--greedy",
        "--prefill-chunk",
        "4",
        "--format",
        "json",
        "--explain",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 4);
    assert!(
        err.contains(
            "layer 0 moe (4 tokens): general_expert_ffn_grouped on cpu (f32): most specific"
        ),
        "{err}"
    );
    assert!(
        err.contains("layer 3 moe (1 tokens): general_expert_ffn_gather on cpu"),
        "{err}"
    );
    assert!(
        err.contains("; not prefill_expert_ffn_persistent: it has no f32 variant"),
        "{err}"
    );
}

#[test]
fn model_errors_are_clear() {
    let (ok, _, err) = moek(&["logits", "--model", "/nonexistent", "--tokens", "1"]);
    assert!(!ok);
    assert!(
        err.contains("cannot read `/nonexistent/config.json`"),
        "{err}"
    );
    let (ok, _, err) = moek(&[
        "generate",
        "--model",
        F32,
        "--tokens",
        "2,3",
        "--max-new-tokens",
        "2",
        "--variant",
        "decode_expert_ffn_blocked",
    ]);
    assert!(!ok);
    assert!(
        err.contains("variant `decode_expert_ffn_blocked` was requested but is not eligible"),
        "{err}"
    );
}

/// `moek bench --geometry GEOMETRY --layers 1` as JSON, with every field scripts check present
/// and sane; `traced` are the kernel kinds a decode step must have spent time in.
fn model_bench(geometry: &str, traced: &[&str], extra: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "--geometry",
        geometry,
        "--layers",
        "1",
        "--iters",
        "3",
        "--format",
        "json",
    ];
    args.extend(extra);
    let (ok, out, err) = moek(&args);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    assert_eq!(v["geometry"], geometry);
    for key in [
        "decode_tokens_per_s",
        "prefill_tokens_per_s",
        "moe_decode_ms_per_layer",
        "moe_prefill_ms_per_token_layer",
        "bytes_per_decode_step",
        "read_bandwidth_gbs",
        "peak_rss_bytes",
        "weights_bytes",
        "prefill_gflops",
        "isa_peak_gflops",
        "decode_ceiling_tokens_per_s",
        "decode_bandwidth_ratio",
        "moe_decode_bandwidth_ratio",
        "prefill_moe_gflops",
        "prefill_rest_gflops",
        "prefill_head_ms",
        "prefill_weight_bytes",
        "prefill_roof_gflops",
        "prefill_moe_roof_gflops",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` in {out}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    // The parts' FLOPs over their times give back the whole prefill's rate.
    let f = |key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    let tokens = f("prompt_tokens");
    let whole_s = tokens / f("prefill_tokens_per_s");
    let moe_s = f("moe_prefill_ms_per_token_layer") / 1e3 * tokens * f("layers");
    let head_s = f("prefill_head_ms") / 1e3;
    let rest_s = whole_s - moe_s - head_s;
    assert!(
        moe_s > 0.0 && head_s > 0.0 && rest_s > 0.0,
        "prefill parts {moe_s} {head_s} {rest_s} of {whole_s} s"
    );
    let moe_rest_flops = f("prefill_moe_gflops") * moe_s + f("prefill_rest_gflops") * rest_s;
    let whole_flops = f("prefill_gflops") * whole_s;
    assert!(
        moe_rest_flops < whole_flops && whole_flops - moe_rest_flops < 0.05 * whole_flops,
        "prefill {whole_flops} GFLOP in all, {moe_rest_flops} outside the LM head row"
    );
    // The roof: the peak, or the bandwidth times FLOPs per weight byte where that is lower;
    // the weights it counts are held.
    let peak = v["integer_peak_gflops"]
        .as_f64()
        .unwrap_or(f("isa_peak_gflops"));
    let streamed = whole_flops * 1e9 / f("prefill_weight_bytes") * f("read_bandwidth_gbs");
    let roof = f("prefill_roof_gflops");
    assert!(
        (roof - peak.min(streamed)).abs() < 1e-6 * roof,
        "roof {roof} against peak {peak} and streamed {streamed}"
    );
    assert!(f("prefill_moe_roof_gflops") <= peak, "{out}");
    assert!(f("prefill_weight_bytes") <= f("weights_bytes"), "{out}");
    // The step's parts: the traced kernel kinds, each a positive time, and the rest.
    let parts = &v["decode_step_ms"];
    for key in ["lm_head", "moe", "dense_mlp"] {
        let x = parts[key]
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` in {parts}"));
        assert!(x.is_finite() && x >= 0.0, "{key} = {x}");
        assert_eq!(x > 0.0, traced.contains(&key), "{key} = {x}");
    }
    assert!(
        parts["rest"].as_f64().is_some_and(f64::is_finite),
        "{parts}"
    );
    assert_eq!(v["prompt_tokens"], 512);
    assert_eq!(v["weights"], "memory");
    // The per-step probes' range holds their median.
    let range: Vec<f64> = v["read_bandwidth_range_gbs"]
        .as_array()
        .unwrap_or_else(|| panic!("`read_bandwidth_range_gbs` in {out}"))
        .iter()
        .map(|b| b.as_f64().unwrap())
        .collect();
    let median = v["read_bandwidth_gbs"].as_f64().unwrap();
    assert!(
        range.len() == 2 && range[0] <= median && median <= range[1],
        "{range:?} around {median}"
    );
    v
}

#[test]
fn the_kernel_bench_judges_each_prefill_call_against_its_own_peak() {
    let (ok, out, err) = moek(&["bench", "--iters", "3", "--format", "json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("one JSON object");
    let f = |key: &str| {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("`{key}` in {out}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
        x
    };
    // A call runs under the peak of its moment: a share, not a percentage or its inverse. The
    // bound is loose: tests run beside each other, so a peak may be timed while another test's
    // process holds a core that the call after it has to itself.
    for ratio in ["prefill_peak_ratio", "persistent_peak_ratio"] {
        assert!(f(ratio) < 1.5, "{ratio} = {} in {out}", f(ratio));
    }
    assert!(
        f("prefill_roof_gflops") <= f("isa_peak_gflops"),
        "the roof is at most the peak: {out}"
    );
    for key in [
        "isa_peak_gflops",
        "prefill_gflops",
        "persistent_gflops",
        "decode_ratio",
        "prefill_ratio",
        "read_bandwidth_gbs",
        "gemm_crate_gflops",
    ] {
        f(key);
    }
}

#[test]
fn the_model_bench_prints_the_fields_scripts_check() {
    let traced = ["lm_head", "moe", "dense_mlp"];
    let bf16 = model_bench("26b-a4b", &traced, &[]);
    assert!(bf16["quantized"].is_null(), "{bf16}");
    // `--dtype q4_0`: the same keys, the experts and the embedding counted as stored (4.5 bits a
    // weight against 16: what a step reads and what is held shrink to less than half).
    let q4 = model_bench("26b-a4b", &traced, &["--dtype", "q4_0"]);
    assert_eq!(q4["quantized"], "q4_0");
    for key in [
        "bytes_per_decode_step",
        "weights_bytes",
        "moe_decode_bytes_per_layer",
    ] {
        let (q, b) = (q4[key].as_f64().unwrap(), bf16[key].as_f64().unwrap());
        assert!(q < 0.45 * b, "{key}: q4 {q} against bf16 {b}");
    }
}

#[test]
fn the_model_bench_times_a_forced_variant_and_refuses_one_that_cannot_serve_it() {
    let gather = "general_expert_ffn_gather";
    let v = model_bench(
        "26b-a4b",
        &["lm_head", "moe", "dense_mlp"],
        &["--variant", gather],
    );
    assert_eq!(v["variant"], gather, "{v}");
    // The blocked decode variant cannot take the 512-token prompt: nothing is timed.
    let (ok, out, err) = moek(&[
        "bench",
        "--geometry",
        "26b-a4b",
        "--layers",
        "1",
        "--variant",
        "decode_expert_ffn_blocked",
    ]);
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("variant `decode_expert_ffn_blocked` was requested but is not eligible"),
        "{err}"
    );
}

#[test]
fn the_qwen3_bench_prints_the_same_fields() {
    // Qwen3-30B-A3B has no dense MLP beside its experts.
    let v = model_bench("qwen3-30b-a3b", &["lm_head", "moe"], &[]);
    assert!(v["weights_bytes"].as_f64().unwrap() > 2e9, "{v}");
}

#[test]
fn generate_encodes_a_prompt_with_the_checkpoints_tokenizer() {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{F32}/expected.json")).unwrap())
            .unwrap();
    let prompt = v["prompt"].as_str().unwrap();
    let (ok, out, err) = moek(&[
        "generate",
        "--model",
        F32,
        "--prompt",
        prompt,
        "--max-new-tokens",
        "8",
        "--greedy",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    let margins: Vec<f64> = v["prompt_margins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_f64().unwrap())
        .collect();
    let sure = margins.iter().take_while(|&&m| m > 0.05).count();
    let want = &v["prompt_greedy"].as_array().unwrap()[..sure];
    assert_eq!(&got["tokens"].as_array().unwrap()[..sure], want, "{out}");
    if sure == margins.len() {
        assert_eq!(got["text"], v["prompt_greedy_text"], "{out}");
    }
    let (ok, _, err) = moek(&[
        "generate",
        "--model",
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tiny-gemma4-moe-bf16"
        ),
        "--prompt",
        "hello",
        "--max-new-tokens",
        "1",
    ]);
    assert!(!ok);
    assert!(
        err.contains("tokenizer.json`, which does not exist"),
        "{err}"
    );
}

/// `moek` with raw arguments (any bytes) and extra environment variables.
fn moek_raw(args: &[std::ffi::OsString], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moek"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("moek runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn os(args: &[&str]) -> Vec<std::ffi::OsString> {
    args.iter().map(Into::into).collect()
}

/// Arguments, extra environment and what stderr must say.
type BadCase = (
    Vec<String>,
    &'static [(&'static str, &'static str)],
    &'static str,
);

/// Every bad argument is refused with a message naming it and what was expected: a non-zero
/// exit, and nothing on stdout as if it had worked.
#[test]
fn bad_arguments_are_refused_by_name_with_nothing_on_stdout() {
    let file = format!("{F32}/config.json");
    let long: Vec<String> = (0..1025).map(|i| (i % 50).to_string()).collect();
    let long = long.join(",");
    let generate = |extra: &[&str]| {
        let mut a = vec!["generate", "--model", F32, "--max-new-tokens", "2"];
        a.extend_from_slice(extra);
        a.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let own = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let cases: Vec<BadCase> = vec![
        (
            own(&["check", "--backend", "cpu,tpu"]),
            &[],
            "invalid value 'tpu' for '--backend",
        ),
        (
            generate(&["--tokens", "999999"]),
            &[],
            "token 999999 is outside the vocabulary of",
        ),
        (
            generate(&["--tokens", ""]),
            &[],
            "invalid value '' for '--tokens",
        ),
        (
            generate(&["--tokens", "-1"]),
            &[],
            "invalid value '-1' for '--tokens",
        ),
        (
            generate(&["--tokens", "2,abc"]),
            &[],
            "invalid value 'abc' for '--tokens",
        ),
        (
            own(&[
                "generate",
                "--model",
                F32,
                "--tokens",
                "2,3",
                "--max-new-tokens",
                "2000",
            ]),
            &[],
            "2002 positions exceed the model's context of 1024",
        ),
        (
            own(&["logits", "--model", F32, "--tokens", &long]),
            &[],
            "1025 positions exceed",
        ),
        (
            generate(&["--tokens", "2,3", "--prefill-chunk", "0"]),
            &[],
            "a prefill chunk of 0",
        ),
        (
            own(&[
                "generate",
                "--model",
                &file,
                "--tokens",
                "2",
                "--max-new-tokens",
                "1",
            ]),
            &[],
            "is a file, not a checkpoint directory",
        ),
        (
            generate(&["--tokens", "2,3", "--weights", "huge-pages"]),
            &[("MOEK_MEMORY_LIMIT", "1000")],
            "but 1000 bytes are available",
        ),
        (
            generate(&["--tokens", "2,3", "--weights", "mapped"]),
            &[("MOEK_MEMORY_LIMIT", "1000")],
            "the KV cache for 4 positions needs",
        ),
    ];
    for (args, env, want) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, out, err) = moek_raw(&os(&args), env);
        assert_ne!(code, 0, "{args:?} must fail");
        assert!(out.is_empty(), "{args:?} printed {out}");
        assert!(err.contains(want), "{args:?}: expected `{want}` in: {err}");
    }
}

/// A `--prompt` of random bytes: refused (not UTF-8; tokens past the tiny vocabulary) or run,
/// never a crash.
#[test]
fn random_prompts_are_refused_or_run() {
    use rand::Rng;
    use std::os::unix::ffi::OsStringExt;
    let fuzz = moek_tests::fuzz::Fuzz::new("--prompt", 12);
    fuzz.run(
        |rng| {
            let n = rng.random_range(0..40);
            (0..n)
                .map(|_| rng.random::<u8>().max(1))
                .collect::<Vec<u8>>()
        },
        |bytes| {
            let mut args = os(&[
                "generate",
                "--model",
                F32,
                "--max-new-tokens",
                "1",
                "--prompt",
            ]);
            args.push(std::ffi::OsString::from_vec(bytes.clone()));
            let (code, out, err) = moek_raw(&args, &[]);
            match code {
                0 if !out.is_empty() => Ok(true),
                1 | 2 if out.is_empty() && !err.trim().is_empty() => Ok(false),
                _ => Err(format!("exit {code}, stdout {out:?}, stderr {err:?}")),
            }
        },
    );
}

const QWEN3: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/tiny-qwen3-moe-f32"
);

/// The family is config.json's `model_type`: the Qwen3-MoE fixture generates with the same
/// command, its experts and dense layer through the SiLU variants, and an unknown family is
/// refused naming the ones there are.
#[test]
fn generate_runs_qwen3_moe_by_its_model_type() {
    let (ok, out, err) = moek(&[
        "generate",
        "--model",
        QWEN3,
        "--tokens",
        "5,6,7,8,9",
        "--max-new-tokens",
        "3",
        "--greedy",
        "--prefill-chunk",
        "2",
        "--explain",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    assert!(
        err.contains("layer 0 moe (2 tokens): general_expert_ffn_grouped_silu on cpu"),
        "{err}"
    );
    assert!(
        err.contains("layer 2 dense_mlp (1 tokens): general_dense_mlp_silu on cpu"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("moek-cli-family-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let (ok, out, err) = moek(&["logits", "--model", dir.to_str().unwrap(), "--tokens", "1"]);
    assert!(!ok && out.is_empty());
    assert!(
        err.contains("`model_type` is \"llama\"") || err.contains("`model_type` is `llama`"),
        "{err}"
    );
    assert!(
        err.contains("`gemma4_text` or `gemma4` (Gemma-4), `qwen3_moe` (Qwen3-MoE)"),
        "{err}"
    );
}

const GPT_OSS_MXFP4: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/tiny-gpt-oss-mxfp4"
);

/// gpt-oss with its experts in MXFP4 as the hub ships them generates with the same command, and
/// `--explain` names the variants its experts ran: the biased clamped SwiGLU over MXFP4 blocks,
/// tokens grouped by expert for the prompt, gathered by route for each new token.
#[test]
fn generate_runs_gpt_oss_mxfp4_by_its_model_type() {
    let (ok, out, err) = moek(&[
        "generate",
        "--model",
        GPT_OSS_MXFP4,
        "--tokens",
        "5,6,7,8,9",
        "--max-new-tokens",
        "3",
        "--greedy",
        "--explain",
        "--format",
        "json",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    for line in [
        "layer 0 moe (5 tokens): general_expert_ffn_grouped_swiglu_biased_quantized on cpu",
        "layer 0 moe (1 tokens): general_expert_ffn_gather_swiglu_biased_quantized on cpu",
    ] {
        assert!(err.contains(line), "{line}: {err}");
    }
}

/// `generation_config.json`'s stop token ends generation through the command: the first token
/// of the model's own greedy continuation that does not appear before it.
#[test]
fn generate_stops_at_the_checkpoints_stop_token() {
    let dir = std::env::temp_dir().join(format!("moek-cli-eos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(format!("{F32}/{file}"), dir.join(file)).unwrap();
    }
    // The prompt transformers' reference ran (its greedy continuation varies).
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{F32}/expected.json")).unwrap())
            .unwrap();
    let tokens: Vec<u32> = expected["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let prompt = tokens
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let model = moek_model::open(&dir, &moek_model::Options::default()).unwrap();
    let greedy = moek_model::generate::generate(
        &model,
        &tokens,
        8,
        None,
        &moek_model::generate::Sampling::greedy(),
        &[],
        &mut vec![],
    )
    .unwrap();
    let at = (1..greedy.len())
        .find(|&i| !greedy[..i].contains(&greedy[i]))
        .expect("the greedy tokens vary");
    std::fs::write(
        dir.join("generation_config.json"),
        serde_json::json!({ "eos_token_id": [greedy[at]] }).to_string(),
    )
    .unwrap();
    let (ok, out, err) = moek(&[
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--greedy",
        "--max-new-tokens",
        "8",
        "--format",
        "json",
        "--tokens",
        &prompt,
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let got: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let want: Vec<u64> = greedy[..=at].iter().map(|&t| u64::from(t)).collect();
    assert_eq!(got, want, "stops at the stop token");
}
