//! A loaded model on a device keeps its weights there (each uploaded once, then only activations,
//! routes and outputs travel), and one loaded model serves several generations at once.

use moek_kernels::dispatch::Backend;
use moek_model::forward::{Cache, CausalLm, Head, uploaded};
use moek_model::gemma4::model::Model;
use moek_model::gemma4::tiny;
use moek_model::generate::{Sampling, generate};

const PROMPT: [u32; 11] = [2, 17, 5, 9, 33, 41, 7, 12, 3, 60, 11];

fn model(backend: Backend) -> Model<'static, half::bf16> {
    let cfg = tiny::config();
    Model::new(cfg.clone(), tiny::weights(&cfg), backend)
}

#[test]
fn on_wgpu_weights_are_uploaded_once_and_decode_steps_send_none() {
    let m = model(Backend::wgpu());
    let (mut cache, mut trace) = (Cache::default(), vec![]);
    m.forward(&PROMPT, &mut cache, Head::Last, &mut trace)
        .expect("an adapter (lavapipe in CI)");
    assert!(
        trace.iter().all(|t| t.fallback.is_none()),
        "every kernel of the tiny model runs on wgpu"
    );
    let prefill = uploaded(&trace).expect("wgpu runs report what they upload");
    // Every weight a kernel reads, once: the dense MLP and the expert banks of each layer, and
    // the LM head (tied: the embedding).
    let w = &m.weights;
    let mut expected = w.head().bytes();
    for l in &w.layers {
        expected += l.mlp.bytes();
        if let Some(moe) = &l.moe {
            expected += moe.experts.gate_up_proj.bytes() + moe.experts.down_proj.bytes();
        }
    }
    assert_eq!(prefill.weights, expected as u64, "bf16 weights, each once");
    for token in [5, 9] {
        trace.clear();
        m.forward(&[token], &mut cache, Head::Last, &mut trace)
            .unwrap();
        let step = uploaded(&trace).unwrap();
        assert_eq!(step.weights, 0, "a decode step uploads no weight bytes");
        assert!(step.other > 0, "its activations and routes do travel");
    }
    // Without resident weights every call uploads its weights again.
    let plain = Model {
        kernels: Backend::wgpu().into(),
        ..model(Backend::cpu())
    };
    trace.clear();
    plain
        .forward(&[5], &mut Cache::default(), Head::Last, &mut trace)
        .unwrap();
    assert_eq!(uploaded(&trace).unwrap().weights, expected as u64);
}

/// Two generations from two threads on one model give the tokens each gives alone.
fn concurrent_generations_match_sequential(backend: Backend) {
    let m = model(backend);
    let prompts: [&[u32]; 2] = [&PROMPT, &[4, 8, 15, 16, 23, 42]];
    let s = Sampling::greedy();
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| generate(&m, p, 6, Some(4), &s, &[], &mut vec![]).unwrap())
        .collect();
    assert_ne!(alone[0], alone[1], "the two prompts generate differently");
    let together: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let runs: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(|| generate(&m, p, 6, Some(4), &s, &[], &mut vec![]).unwrap()))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
}

#[test]
fn one_model_serves_two_generations_at_once_on_the_cpu() {
    concurrent_generations_match_sequential(Backend::cpu());
}

#[test]
fn one_model_serves_two_generations_at_once_on_wgpu() {
    concurrent_generations_match_sequential(Backend::wgpu());
}
