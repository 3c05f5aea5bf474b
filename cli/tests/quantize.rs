//! `moek quantize` and quantizing at load through the command: the written checkpoint loads as
//! quantizing at load does (bit for bit), bad ones are named errors, and `--explain` names the
//! quantized variants that ran.

use moek_kernels::Backend;
use moek_kernels::ir::BlockFormat;
use moek_model::checkpoint::{Checkpoint, LoadError, Residence};
use moek_model::forward::{Cache, CausalLm, Head};
use moek_model::gemma4::config::Config;
use moek_model::gemma4::model::Model;
use moek_model::gemma4::weights;
use moek_model::quantized::Quantize;
use std::path::{Path, PathBuf};

/// The model's fixture readers (this file uses some of them).
#[path = "../../model/tests/common/mod.rs"]
#[allow(dead_code)]
mod common;

fn fixture() -> PathBuf {
    common::fixture("tiny-gemma4-moe-f32").0
}

fn model_of(dir: &Path, quantize: Option<BlockFormat>) -> Model<'static, f32> {
    let cfg = Config::load(dir).unwrap();
    let ck: &'static Checkpoint = Box::leak(Box::new(Checkpoint::open(dir).unwrap()));
    let quantize = quantize.map(Quantize::whole);
    let w = weights::load_quantized::<f32>(ck, &cfg, Residence::Mapped, quantize, |_| {}).unwrap();
    Model::new(cfg, w, Backend::cpu())
}

fn all_logits(model: &impl CausalLm, tokens: &[u32]) -> Vec<Vec<f32>> {
    model
        .forward(tokens, &mut Cache::default(), Head::All, &mut vec![])
        .unwrap()
}

/// A scratch directory removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("moek-quant-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn moek(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_moek"))
        .args(args)
        .output()
        .unwrap()
}

/// `moek quantize --model src --dtype dtype --out out [more]`, which must succeed; what it
/// printed.
fn quantize_with(src: &str, dtype: &str, out: &str, more: &[&str]) -> String {
    let args = ["quantize", "--model", src, "--dtype", dtype, "--out", out];
    let run = moek(&[&args[..], more].concat());
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// [`quantize_with`] the whole model.
fn quantize(src: &str, dtype: &str, out: &str) -> String {
    quantize_with(src, dtype, out, &[])
}

/// The command names the tensors it put in blocks, as the family chose them: gpt-oss's LM head
/// alone with `--quantize-experts-only` (its experts' stored orientation is input by output),
/// attention's projections beside it for the whole model; Gemma-4's experts and more.
#[test]
fn quantize_names_the_tensors_it_put_in_blocks() {
    let out = Scratch::new("names-gpt-oss");
    let src = common::fixture("tiny-gpt-oss-bf16").0;
    let (src, dir) = (src.to_str().unwrap(), out.0.to_str().unwrap());
    let said = quantize_with(src, "q8_0", dir, &["--quantize-experts-only"]);
    assert!(
        said.contains(": `lm_head.weight` in q8_0 blocks, every other tensor as stored"),
        "{said}"
    );
    std::fs::remove_dir_all(dir).unwrap();
    let said = quantize(src, "q8_0", dir);
    assert!(
        said.contains(" tensors (`") && said.contains("in q8_0 blocks"),
        "{said}"
    );
    let ck = Checkpoint::open(&out.0).unwrap();
    let q = "model.layers.0.self_attn.q_proj.weight".to_string();
    let router = "model.layers.0.mlp.router.weight".to_string();
    assert_eq!(ck.quantized(&[q]), Some(BlockFormat::Q8_0));
    assert_eq!(ck.quantized(&[router]), None);
    let out = Scratch::new("names-gemma4");
    let said = quantize(fixture().to_str().unwrap(), "q4_0", out.0.to_str().unwrap());
    assert!(
        said.contains(" tensors (`") && said.contains("in q4_0 blocks"),
        "{said}"
    );
}

/// `moek quantize` writes blocks the loader maps as they are: its checkpoint computes the same
/// logits, bit for bit, as quantizing at load, and names its format in the metadata.
#[test]
fn a_quantized_checkpoint_loads_as_quantizing_at_load() {
    let out = Scratch::new("roundtrip");
    let dir = out.0.to_str().unwrap();
    let src = fixture();
    quantize(src.to_str().unwrap(), "q4_0", dir);
    let ck = Checkpoint::open(&out.0).unwrap();
    assert_eq!(ck.quantization(), Some(BlockFormat::Q4_0));
    let tokens = common::ids(&common::fixture("tiny-gemma4-moe-f32").1["tokens"]);
    let stored = all_logits(&model_of(&out.0, None), &tokens);
    let at_load = all_logits(&model_of(&src, Some(BlockFormat::Q4_0)), &tokens);
    let bits = |r: &[Vec<f32>]| -> Vec<u32> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(bits(&stored), bits(&at_load));
    // The command refuses to write over it, and leaves it whole.
    let again = moek(&[
        "quantize",
        "--model",
        src.to_str().unwrap(),
        "--dtype",
        "q8_0",
        "--out",
        dir,
    ]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already holds a checkpoint"));
    assert_eq!(
        Checkpoint::open(&out.0).unwrap().quantization(),
        Some(BlockFormat::Q4_0)
    );
}

/// A quantized checkpoint whose metadata names an unknown format, or whose blocks do not have
/// the shape the config implies, is a typed error naming it.
#[test]
fn bad_quantized_checkpoints_are_named_errors() {
    let out = Scratch::new("bad");
    let src = fixture();
    quantize(src.to_str().unwrap(), "q8_0", out.0.to_str().unwrap());
    let path = out.0.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    // The header is JSON after an 8-byte length: rename the format in place (same length).
    let at = bytes
        .windows(6)
        .position(|w| w == b"\"q8_0\"")
        .expect("the metadata names the format");
    let mut renamed = bytes.clone();
    renamed[at + 2] = b'9';
    std::fs::write(&path, &renamed).unwrap();
    let err = Checkpoint::open(&out.0).unwrap_err();
    assert!(matches!(err, LoadError::Format { .. }), "{err}");
    assert!(err.to_string().contains("q9_0"), "{err}");
    // A config whose experts are wider than the blocks stored.
    std::fs::write(&path, &bytes).unwrap();
    let ck = Checkpoint::open(&out.0).unwrap();
    let mut cfg = Config::load(&out.0).unwrap();
    let moe = cfg.moe.as_mut().unwrap();
    moe.moe_intermediate_size *= 2;
    let err = weights::load::<f32>(&ck, &cfg, Residence::Mapped, |_| {}).unwrap_err();
    assert!(matches!(err, LoadError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("experts.gate_up_proj"), "{err}");
}

/// `--quantize` on `logits` runs the banks, the dense MLP and the head through the quantized
/// variants (the dense MLP through the one-expert spec), and `--explain` names them;
/// `--quantize-experts-only` leaves the dense MLP in the checkpoint's dtype. (Qwen3's fixture:
/// its dense layer is whole blocks wide.)
#[test]
fn quantize_at_load_runs_the_quantized_variants() {
    let src = common::fixture("tiny-qwen3-moe-f32").0;
    let explain = |more: &[&str]| {
        let src = src.to_str().unwrap();
        let args = [
            "logits",
            "--model",
            src,
            "--tokens",
            "5,6,7",
            "--quantize",
            "q8_0",
        ];
        let run = moek(&[&args[..], more, &["--explain"]].concat());
        assert!(
            run.status.success(),
            "{}",
            String::from_utf8_lossy(&run.stderr)
        );
        String::from_utf8_lossy(&run.stderr).into_owned()
    };
    let line = |log: &str, what: &str| {
        log.lines()
            .find(|l| l.contains(&format!(" {what} (")))
            .unwrap_or_else(|| panic!("no {what} record in {log}"))
            .to_string()
    };
    let whole = explain(&[]);
    for what in ["moe", "lm_head", "dense_mlp"] {
        let line = line(&whole, what);
        assert!(line.contains("on cpu (q8_0)"), "{line}");
    }
    let dense = line(&whole, "dense_mlp");
    assert!(dense.contains("dense_mlp_quantized"), "{dense}");
    let experts = explain(&["--quantize-experts-only"]);
    let line = line(&experts, "dense_mlp");
    assert!(line.contains("(f32)"), "{line}");
}

/// `moek quantize` serves Qwen3-MoE too: each expert's matrices and the untied head are written
/// in blocks, gathered into banks at load as they are, and the checkpoint computes the logits of
/// quantizing at load bit for bit.
#[test]
fn a_quantized_qwen3_checkpoint_loads_as_quantizing_at_load() {
    let out = Scratch::new("qwen3");
    let (src, v) = common::fixture("tiny-qwen3-moe-f32");
    quantize(src.to_str().unwrap(), "q8_0", out.0.to_str().unwrap());
    let ck = Checkpoint::open(&out.0).unwrap();
    assert_eq!(
        ck.quantized(&["lm_head.weight".into()]),
        Some(BlockFormat::Q8_0)
    );
    let expert = "model.layers.1.mlp.experts.0.gate_proj.weight".to_string();
    assert_eq!(ck.quantized(&[expert]), Some(BlockFormat::Q8_0));
    let open = |dir: &Path, quantize| {
        let options = moek_model::Options {
            quantize,
            weights: Some(Residence::Mapped),
            ..moek_model::Options::default()
        };
        moek_model::open(dir, &options).unwrap()
    };
    let tokens = common::ids(&v["tokens"]);
    let stored = all_logits(&open(&out.0, None), &tokens);
    let whole = Some(Quantize::whole(BlockFormat::Q8_0));
    let at_load = all_logits(&open(&src, whole), &tokens);
    let bits = |r: &[Vec<f32>]| -> Vec<u32> { r.iter().flatten().map(|x| x.to_bits()).collect() };
    assert_eq!(bits(&stored), bits(&at_load));
}
