//! The model's own behaviour on the built-in tiny Gemma-4 MoE: the KV cache (sliding layers keep
//! a window), chunked prefill, the final-row head, forced variants, the dispatch record.

use moek_kernels::dispatch::Backend;
use moek_model::forward::{Cache, CausalLm, Head, Kernels, ModelError};
use moek_model::gemma4::model::Model;
use moek_model::gemma4::tiny;
use moek_model::generate::{Sampling, generate};

fn model(variant: Option<&str>) -> Model<'static, half::bf16> {
    model_of(variant)
}

fn model_of<W: moek_kernels::Element>(variant: Option<&str>) -> Model<'static, W> {
    let cfg = tiny::config();
    let kernels = Kernels::new(Backend::cpu()).with_variant(variant.map(str::to_string));
    Model {
        weights: tiny::weights(&cfg),
        cfg,
        kernels,
    }
}

const PROMPT: [u32; 11] = [2, 17, 5, 9, 33, 41, 7, 12, 3, 60, 11];

#[test]
fn decoding_with_the_cache_matches_a_full_forward() {
    // f32: the prefill and decode variants then differ by summation order only.
    let m = model_of::<f32>(None);
    let mut trace = vec![];
    let full = m
        .forward(&PROMPT, &mut Cache::default(), Head::All, &mut trace)
        .unwrap();
    assert_eq!(full.len(), PROMPT.len());
    // Prefill 5, then each later token through the cache: past the sliding window of 4, so
    // the sliding layer drops its oldest rows along the way.
    let layout = m.cache_layout();
    let mut cache = m.cache_for(PROMPT.len());
    m.forward(&PROMPT[..5], &mut cache, Head::Last, &mut trace)
        .unwrap();
    assert!(
        cache.layers[0].pos.len() == m.cfg.sliding_window - 1,
        "a sliding layer keeps window - 1 positions after a prompt past its window"
    );
    assert_eq!(cache.layers[1].pos.len(), 5, "a full layer keeps all");
    // The room made for the whole sequence: no step moves a layer's rows to new memory.
    let rows = |c: &Cache| [c.layers[0].k.addresses(), c.layers[1].v.addresses()];
    let before = rows(&cache);
    for n in 5..PROMPT.len() {
        let step = m
            .forward(&PROMPT[n..n + 1], &mut cache, Head::Last, &mut trace)
            .unwrap();
        let held = cache.layers[0].pos.len();
        assert!(
            held >= m.cfg.sliding_window - 1 && held <= layout[0].held(n + 1),
            "after {} tokens the sliding layer holds {held} positions",
            n + 1
        );
        let (a, b) = (&step[0], &full[n]);
        let dev = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            dev < 1e-4,
            "token {n}: cached decode vs full forward: max abs {dev}"
        );
    }
    assert_eq!(
        rows(&cache),
        before,
        "a decode step grew a cache past its room"
    );
}

#[test]
fn one_shot_and_chunked_prefill_give_the_same_tokens() {
    let m = model(None);
    let s = Sampling::greedy();
    let one = generate(&m, &PROMPT, 6, None, &s, &[], &mut vec![]).unwrap();
    for chunk in [1, 3, 4, 7] {
        let got = generate(&m, &PROMPT, 6, Some(chunk), &s, &[], &mut vec![]).unwrap();
        assert_eq!(got, one, "chunk {chunk}");
    }
}

#[test]
fn the_head_runs_once_per_chunk_and_generation_on_one_row() {
    let m = model(None);
    let mut trace = vec![];
    generate(
        &m,
        &PROMPT,
        3,
        Some(4),
        &Sampling::greedy(),
        &[],
        &mut trace,
    )
    .unwrap();
    let heads: Vec<usize> = trace
        .iter()
        .filter(|t| t.what == "lm_head")
        .map(|t| t.tokens)
        .collect();
    // 3 prefill chunks (4 + 4 + 3 tokens) and 2 decode steps: one row each.
    assert_eq!(heads, [1, 1, 1, 1, 1]);
    let moe: Vec<usize> = trace
        .iter()
        .filter(|t| t.what == "moe" && t.layer == 0)
        .map(|t| t.tokens)
        .collect();
    assert_eq!(moe, [4, 4, 3, 1, 1], "the backbone processes every token");
    let first = trace.iter().find(|t| t.what == "moe").unwrap();
    assert!(
        first.choice.why.starts_with("most specific"),
        "{}",
        first.choice
    );
}

#[test]
fn a_forced_ineligible_variant_fails_before_the_cache_changes() {
    let m = model(Some("decode_expert_ffn_blocked"));
    let mut cache = Cache::default();
    let err = m
        .forward(&PROMPT, &mut cache, Head::Last, &mut vec![])
        .unwrap_err();
    assert!(matches!(err, ModelError::Kernel { .. }), "{err}");
    assert!(err.to_string().contains("is fixed at"), "{err}");
    assert_eq!(cache.len, 0);
    assert!(cache.layers.is_empty());
    // An eligible forced variant runs and is recorded as requested.
    let m = model(Some("general_expert_ffn_gather"));
    let mut trace = vec![];
    m.forward(&PROMPT, &mut Cache::default(), Head::Last, &mut trace)
        .unwrap();
    let moe = trace.iter().find(|t| t.what == "moe").unwrap();
    assert_eq!(moe.choice.kernel, "general_expert_ffn_gather");
    assert_eq!(moe.choice.why, "requested explicitly");
}

#[test]
fn tokens_outside_the_vocabulary_are_refused() {
    let m = model(None);
    let err = m
        .forward(&[1, 999], &mut Cache::default(), Head::Last, &mut vec![])
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("token 999 is outside the vocabulary of 96")
    );
}

#[test]
fn seeded_sampling_repeats_and_differs_from_greedy_somewhere() {
    let m = model(None);
    let s = Sampling {
        greedy: false,
        temperature: 1.5,
        top_k: 20,
        top_p: 0.95,
        seed: 9,
    };
    let a = generate(&m, &PROMPT, 8, None, &s, &[], &mut vec![]).unwrap();
    let b = generate(&m, &PROMPT, 8, None, &s, &[], &mut vec![]).unwrap();
    assert_eq!(a, b, "the same seed gives the same tokens");
    let other = Sampling { seed: 10, ..s };
    let c = generate(&m, &PROMPT, 8, None, &other, &[], &mut vec![]).unwrap();
    let g = generate(&m, &PROMPT, 8, None, &Sampling::greedy(), &[], &mut vec![]).unwrap();
    assert!(
        a != g || c != g,
        "sampling at temperature 1.5 never left the greedy path"
    );
    // A stop token ends generation (and is returned).
    let stop = [g[1]];
    let s2 = generate(
        &m,
        &PROMPT,
        8,
        None,
        &Sampling::greedy(),
        &stop,
        &mut vec![],
    )
    .unwrap();
    assert_eq!(s2, g[..2]);
}
