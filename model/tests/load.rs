//! Bad checkpoints and configs are typed errors naming the tensor or key, what was expected and
//! what was found; never a panic. Features moek does not implement are refused by name.

use moek_model::checkpoint::{Checkpoint, LoadError, Residence};
use moek_model::gemma4::config::{Config, ConfigError};
use moek_model::gemma4::weights;
use std::path::{Path, PathBuf};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gemma4-moe-f32")
}

/// A scratch copy of the f32 fixture, with its config passed through `edit`.
fn copy(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("moek-load-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        fixture().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    edited_config(&fixture(), &dir, edit);
    dir
}

/// `src`'s config.json passed through `edit`, written into `dir`.
fn edited_config(src: &Path, dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    let cfg = match Config::load(dir) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let ck = match Checkpoint::open(dir) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    weights::load::<f32>(&ck, &cfg, Residence::Mapped, |_| {})
        .map(|_| ())
        .expect_err("this checkpoint must not load")
        .to_string()
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = copy("missing", |c| c["num_hidden_layers"] = 5.into());
    // layer_types has 4 entries for 5 layers: the config itself is refused first.
    let err = load_err(&dir);
    assert!(err.contains("`layer_types`"), "{err}");
    let dir = copy("missing2", |c| {
        c["num_hidden_layers"] = 5.into();
        c["layer_types"]
            .as_array_mut()
            .unwrap()
            .push("sliding_attention".into());
    });
    let err = load_err(&dir);
    assert!(
        err.contains("tensor `model.layers.4.") && err.contains("is missing"),
        "{err}"
    );
}

#[test]
fn a_wrong_shape_names_the_tensor_and_both_shapes() {
    let dir = copy("shape", |c| c["vocab_size"] = 500.into());
    let err = load_err(&dir);
    assert!(
        err.contains("tensor `model.embed_tokens.weight` has shape [512, 64]; expected [500, 64]"),
        "{err}"
    );
}

#[test]
fn a_wrong_dtype_names_the_tensor() {
    let dir = fixture();
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let err = weights::load::<half::bf16>(&ck, &cfg, Residence::Mapped, |_| {})
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(err, LoadError::DType { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("tensor `model.embed_tokens.weight` is F32; expected BF16"),
        "{err}"
    );
}

#[test]
fn a_truncated_file_is_a_format_error_naming_it() {
    let dir = copy("truncated", |_| {});
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_err(&dir);
    assert!(
        err.contains("model.safetensors` is not a valid safetensors file"),
        "{err}"
    );
}

#[test]
fn a_bad_config_names_the_key() {
    let dir = copy("badkey", |c| c["hidden_size"] = "wide".into());
    let err = load_err(&dir);
    assert!(
        err.contains(
            "config key `hidden_size` is \"wide\"; expected an integer from 0 to 16777216"
        ),
        "{err}"
    );
    let dir = copy("nokey", |c| {
        c.as_object_mut().unwrap().remove("vocab_size");
    });
    assert!(load_err(&dir).contains("config key `vocab_size` is missing"));
    let dir = copy("type", |c| c["model_type"] = "llama".into());
    assert!(load_err(&dir).contains("config key `model_type` is `llama`"));
}

#[test]
fn unimplemented_features_are_refused_by_name() {
    let cases: [(&str, serde_json::Value, &str); 4] = [
        (
            "hidden_size_per_layer_input",
            256.into(),
            "per-layer input embeddings",
        ),
        ("num_kv_shared_layers", 2.into(), "KV-shared layers"),
        ("use_double_wide_mlp", true.into(), "the double-wide MLP"),
        (
            "use_bidirectional_attention",
            "all".into(),
            "bidirectional attention",
        ),
    ];
    for (key, value, feature) in cases {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
                .unwrap();
        v[key] = value;
        let err = Config::from_json(&v).unwrap_err();
        assert!(matches!(err, ConfigError::Unsupported { .. }));
        let msg = err.to_string();
        assert!(msg.contains(feature) && msg.contains(key), "{msg}");
    }
    // Absent means transformers' default of 256: per-layer inputs on, refused.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("config.json")).unwrap())
            .unwrap();
    v.as_object_mut()
        .unwrap()
        .remove("hidden_size_per_layer_input");
    assert!(Config::from_json(&v).is_err());
}

#[test]
fn both_config_layouts_give_the_same_full_layers() {
    let saved = Config::load(&fixture()).unwrap();
    let hub = Config::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gemma4-moe-bf16"),
    )
    .unwrap();
    assert_eq!(saved.layers, hub.layers);
    let full = &saved.layers[1];
    assert_eq!(
        (
            full.head_dim,
            full.num_key_value_heads,
            full.attention_k_eq_v
        ),
        (64, 1, true)
    );
    assert_eq!(full.rope.pairs, 8, "proportional RoPE: 0.25 x 64 / 2 pairs");
    assert_eq!(saved.layers[0].head_dim, 32);
}

/// The f32 fixture converted to f16 and cut into two shards with an index.
fn sharded_f16(name: &str) -> PathBuf {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let dir = std::env::temp_dir().join(format!("moek-load-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(fixture().join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    let converted: Vec<(String, Vec<usize>, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let t = st.tensor(n).unwrap();
            assert_eq!(t.dtype(), Dtype::F32);
            let v: Vec<f32> = bytemuck::pod_collect_to_vec(t.data());
            let h: Vec<half::f16> = v.iter().map(|&x| half::f16::from_f32(x)).collect();
            (
                n.clone(),
                t.shape().to_vec(),
                bytemuck::cast_slice(&h).to_vec(),
            )
        })
        .collect();
    let half_way = converted.len() / 2;
    let mut weight_map = serde_json::Map::new();
    for (i, part) in [&converted[..half_way], &converted[half_way..]]
        .iter()
        .enumerate()
    {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<(String, TensorView<'_>)> = part
            .iter()
            .map(|(n, shape, b)| {
                weight_map.insert(n.clone(), file.clone().into());
                (
                    n.clone(),
                    TensorView::new(Dtype::F16, shape.clone(), b).unwrap(),
                )
            })
            .collect();
        std::fs::write(
            dir.join(&file),
            safetensors::serialize(views, None).unwrap(),
        )
        .unwrap();
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({ "metadata": {}, "weight_map": weight_map }).to_string(),
    )
    .unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    dir
}

#[test]
fn a_sharded_f16_checkpoint_loads_and_gives_the_f32_logits_closely() {
    use moek_model::forward::{Cache, CausalLm, Head};
    use moek_model::gemma4::model::Model;
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join("expected.json")).unwrap())
            .unwrap();
    let tokens: Vec<u32> = e["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let dir = sharded_f16("sharded");
    let cfg = Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let model = Model {
        weights: weights::load::<half::f16>(&ck, &cfg, Residence::HugePages, |_| {}).unwrap(),
        cfg,
        kernels: moek_kernels::dispatch::Backend::cpu().into(),
    };
    let rows = model
        .forward(&tokens, &mut Cache::default(), Head::All, &mut vec![])
        .unwrap();
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in rows.iter().zip(e["logits"].as_array().unwrap()) {
        for (a, b) in g.iter().zip(w.as_array().unwrap()) {
            let b = b.as_f64().unwrap();
            num += (f64::from(*a) - b).powi(2);
            den += b * b;
        }
    }
    // f16 weights (2^-11 relative each) against the f32 computation: measured ~1e-3.
    let rel = (num / den).sqrt();
    assert!(rel < 1e-2, "f16 vs f32 logits: rel L2 {rel:.3e}");
}

/// All-row logits of a 4-token prompt on the CPU.
fn logits(cfg: &Config, weights: weights::Weights<'_, half::bf16>) -> Vec<Vec<f32>> {
    use moek_model::forward::{Cache, CausalLm, Head};
    use moek_model::gemma4::model::Model;
    let model = Model {
        cfg: cfg.clone(),
        weights,
        kernels: moek_kernels::dispatch::Backend::cpu().into(),
    };
    model
        .forward(
            &[2, 17, 5, 9],
            &mut Cache::default(),
            Head::All,
            &mut vec![],
        )
        .unwrap()
}

/// `save` (of the tiny model's draw) then `load` gives the tiny model's weights back in either residence: the logits are bit for
/// bit those of the weights that were saved, and the residence took effect (mapped matrices
/// borrow the file; huge-page ones are copies the model owns).
#[test]
fn saved_weights_load_back_mapped_or_in_huge_pages() {
    let cfg = moek_model::gemma4::tiny::config();
    let dir = std::env::temp_dir().join(format!("moek-load-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let saved = moek_model::gemma4::tiny::weights::<half::bf16>(&cfg);
    let draw = moek_model::gemma4::tiny::Draw::default();
    weights::save::<half::bf16>(draw, &cfg, &dir.join("model.safetensors")).unwrap();
    let want = logits(&cfg, saved);
    let ck = Checkpoint::open(&dir).unwrap();
    for residence in [Residence::Mapped, Residence::HugePages] {
        let loaded = weights::load::<half::bf16>(&ck, &cfg, residence, |_| {}).unwrap();
        use moek_model::quantized::{DenseMlp, Stored};
        let (Stored::Plain(embed), Stored::Plain(q), DenseMlp::Plain { down_proj, .. }) = (
            &loaded.embed_tokens,
            &loaded.layers[0].self_attn.q_proj,
            &loaded.layers[1].mlp,
        ) else {
            panic!("a bf16 checkpoint's matrices load as bf16");
        };
        let owned = [embed, q, down_proj].map(|m| matches!(m, std::borrow::Cow::Owned(_)));
        assert_eq!(
            owned,
            [residence == Residence::HugePages; 3],
            "{residence:?}"
        );
        let got = logits(&cfg, loaded);
        let bits = |rows: &[Vec<f32>]| -> Vec<u32> {
            rows.iter().flatten().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&got), bits(&want), "{residence:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The sharded checkpoint with its index text passed through `edit`, or a shard swapped for
/// another's contents.
fn sharded_with(edit: impl FnOnce(&Path, String) -> String) -> PathBuf {
    let dir = sharded_f16("bad-index");
    let index = dir.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(&index, edit(&dir, text)).unwrap();
    dir
}

#[test]
fn bad_shard_indexes_are_refused_by_name() {
    // Each case rebuilds the shared scratch directory, so they run one after another.
    let err = |dir: &Path| Checkpoint::open(dir).unwrap_err().to_string();
    let dir = sharded_with(|_, t| t.replace("model-00002-of-00002", "model-00003-of-00002"));
    let e = err(&dir);
    assert!(
        e.contains("cannot read") && e.contains("model-00003-of-00002"),
        "{e}"
    );
    // A tensor listed twice (JSON keeps both; a map would hide one).
    let dir = sharded_with(|_, t| {
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        let file = &v["weight_map"]["model.norm.weight"];
        t.replacen(
            "\"weight_map\":{",
            &format!("\"weight_map\":{{\"model.norm.weight\":{file},"),
            1,
        )
    });
    let e = err(&dir);
    assert!(e.contains("lists `model.norm.weight` twice"), "{e}");
    // A tensor the index puts in the wrong shard.
    let dir = sharded_with(|_, t| {
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        let (name, file) = v["weight_map"].as_object().unwrap().iter().next().unwrap();
        let other = if file.as_str().unwrap().contains("00001") {
            "00002"
        } else {
            "00001"
        };
        let moved = format!("model-{other}-of-00002.safetensors");
        t.replacen(
            &format!("\"{name}\":{file}"),
            &format!("\"{name}\":\"{moved}\""),
            1,
        )
    });
    let e = err(&dir);
    assert!(e.contains("which does not hold it"), "{e}");
    // The same tensor in both shards.
    let dir = sharded_with(|dir, t| {
        std::fs::copy(
            dir.join("model-00001-of-00002.safetensors"),
            dir.join("model-00002-of-00002.safetensors"),
        )
        .unwrap();
        t
    });
    let e = err(&dir);
    assert!(e.contains("is in both"), "{e}");
}

/// A Qwen3-MoE checkpoint missing one expert's tensor is refused naming it.
#[test]
fn a_qwen3_checkpoint_missing_an_expert_tensor_names_it() {
    use moek_model::qwen3;
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-qwen3-moe-f32");
    let dir = std::env::temp_dir().join(format!("moek-load-qwen3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let gone = "model.layers.3.mlp.experts.5.up_proj.weight";
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != gone)
        .collect();
    std::fs::write(
        dir.join("model.safetensors"),
        safetensors::serialize(kept, None).unwrap(),
    )
    .unwrap();
    let cfg = qwen3::config::Config::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let err = qwen3::weights::load::<f32>(&ck, &cfg, Residence::Mapped, |_| {}).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("tensor `{gone}` is missing (looked for `{gone}`)")
    );
}

/// A scratch copy of the tiny gpt-oss checkpoint with MXFP4 experts, its tensors passed through
/// `edit` (name, dtype, shape, bytes; `None` drops the tensor) and its config through
/// `edit_config`.
fn mxfp4_copy(
    name: &str,
    edit: impl Fn(
        &str,
        safetensors::Dtype,
        &[usize],
        &[u8],
    ) -> Option<(safetensors::Dtype, Vec<usize>, Vec<u8>)>,
    edit_config: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let src =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-gpt-oss-mxfp4");
    let dir = std::env::temp_dir().join(format!("moek-load-mxfp4-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .filter_map(|(n, t)| edit(&n, t.dtype(), t.shape(), t.data()).map(|(d, s, b)| (n, d, s, b)))
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = kept
        .iter()
        .map(|(n, d, s, b)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    edited_config(&src, &dir, edit_config);
    dir
}

/// What loading a gpt-oss checkpoint at `dir` says (it must fail), before any compute.
fn gpt_oss_load_err(dir: &Path) -> String {
    use moek_model::gpt_oss::{config::Config, weights};
    let cfg = match Config::load(dir) {
        Ok(c) => c,
        Err(e) => return e.to_string(),
    };
    let ck = Checkpoint::open(dir).unwrap();
    weights::load_quantized::<f32>(&ck, &cfg, Residence::Mapped, None, |_| {})
        .map(|_| ())
        .expect_err("this checkpoint must not load")
        .to_string()
}

const DOWN: &str = "model.layers.0.mlp.experts.down_proj";

#[test]
fn mxfp4_experts_with_a_missing_scale_tensor_name_it() {
    let scales = format!("{DOWN}_scales");
    let dir = mxfp4_copy(
        "no-scales",
        |n, d, s, b| (n != scales).then(|| (d, s.to_vec(), b.to_vec())),
        |_| {},
    );
    let err = gpt_oss_load_err(&dir);
    assert!(
        err.contains(&format!("`{scales}`")) && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn mxfp4_blocks_of_another_dtype_name_the_tensor_and_u8() {
    let blocks = format!("{DOWN}_blocks");
    let dir = mxfp4_copy(
        "dtype",
        |n, d, s, b| {
            let d = if n == blocks {
                safetensors::Dtype::I8
            } else {
                d
            };
            Some((d, s.to_vec(), b.to_vec()))
        },
        |_| {},
    );
    let err = gpt_oss_load_err(&dir);
    assert!(
        err.contains(&format!("tensor `{blocks}` is I8; expected U8 (MXFP4)")),
        "{err}"
    );
}

#[test]
fn mxfp4_blocks_of_another_shape_or_count_name_both_shapes() {
    // The same bytes as [E, out, in / 2]: a shape the layout does not have.
    let blocks = format!("{DOWN}_blocks");
    let dir = mxfp4_copy(
        "shape",
        |n, d, s, b| {
            let s = if n == blocks {
                vec![s[0], s[1], s[2] * s[3]]
            } else {
                s.to_vec()
            };
            Some((d, s, b.to_vec()))
        },
        |_| {},
    );
    let err = gpt_oss_load_err(&dir);
    assert!(
        err.contains(&format!(
            "tensor `{blocks}` has shape [8, 64, 48]; expected [8, 64, 3, 16]"
        )),
        "{err}"
    );
    // One expert's scales short: a count that does not match the blocks'.
    let scales = format!("{DOWN}_scales");
    let dir = mxfp4_copy(
        "count",
        |n, d, s, b| {
            if n != scales {
                return Some((d, s.to_vec(), b.to_vec()));
            }
            let per_expert = s[1] * s[2];
            Some((d, vec![s[0] - 1, s[1], s[2]], b[per_expert..].to_vec()))
        },
        |_| {},
    );
    let err = gpt_oss_load_err(&dir);
    assert!(
        err.contains(&format!(
            "tensor `{scales}` has shape [7, 64, 3]; expected [8, 64, 3]"
        )),
        "{err}"
    );
}

#[test]
fn a_quantization_config_this_code_does_not_read_is_refused_by_key() {
    let dir = mxfp4_copy(
        "quant-method",
        |_, d, s, b| Some((d, s.to_vec(), b.to_vec())),
        |c| c["quantization_config"]["quant_method"] = "gptq".into(),
    );
    let err = gpt_oss_load_err(&dir);
    assert!(
        err.contains("quantization_config.quant_method") && err.contains("gptq"),
        "{err}"
    );
}
