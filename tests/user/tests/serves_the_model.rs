//! A user's spec serves the model: the fixture opened with a registry holding it runs it for
//! every MoE block of prefill and decode, and the dispatch record says so.

use moek_kernels::Registry;
use moek_model::forward::{Cache, CausalLm, Head};
use moek_model::{Options, open};
use std::path::PathBuf;
use std::sync::Arc;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/tiny-gemma4-moe-bf16")
}

/// The MoE records of a prefill then a decode step, with the model opened from `registry`.
fn moe_choices(registry: Registry) -> Vec<String> {
    let options = Options {
        registry: Arc::new(registry),
        ..Options::default()
    };
    let model = open(&fixture(), &options).expect("the fixture opens");
    let (mut cache, mut trace) = (Cache::default(), vec![]);
    model
        .forward(&[2, 17, 5, 9], &mut cache, Head::Last, &mut trace)
        .expect("prefill runs");
    model
        .forward(&[11], &mut cache, Head::Last, &mut trace)
        .expect("decode runs");
    trace
        .iter()
        .filter(|t| t.what == "moe")
        .map(|t| t.choice.to_string())
        .collect()
}

#[test]
fn the_users_spec_runs_inside_the_model() {
    let registry = Registry::builtin()
        .with(moek_user_specs::entries())
        .expect("a new name");
    let moe = moe_choices(registry);
    // Four layers, each once in prefill and once in decode.
    assert_eq!(moe.len(), 8, "{moe:#?}");
    for choice in &moe {
        assert!(choice.starts_with("tiny_expert_ffn on cpu"), "{choice}");
        assert!(choice.contains("most specific eligible"), "{choice}");
    }
}

#[test]
fn without_it_the_builtins_serve_the_same_model() {
    let moe = moe_choices(Registry::builtin());
    assert_eq!(moe.len(), 8);
    assert!(
        moe.iter().all(|c| !c.contains("tiny_expert_ffn")),
        "{moe:#?}"
    );
}

#[test]
fn a_users_entry_is_ranked_ahead_of_the_builtins() {
    let registry = Registry::builtin()
        .with(moek_user_specs::entries())
        .unwrap();
    let first = registry.entries().next().unwrap();
    assert_eq!(first.name(), "tiny_expert_ffn");
    let ranks: Vec<_> = registry.ranked().map(|(r, _)| r).collect();
    assert!(ranks.windows(2).all(|w| w[0] < w[1]), "{ranks:?}");
}

#[test]
fn a_name_taken_twice_is_refused() {
    let twice = Registry::builtin()
        .with(moek_user_specs::entries())
        .unwrap()
        .with(moek_user_specs::entries());
    let err = twice.expect_err("the same name twice");
    assert!(err.to_string().contains("`tiny_expert_ffn`"), "{err}");
}
