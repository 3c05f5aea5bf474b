//! Generation: prefill (one shot or in chunks; the LM head runs on one row per chunk and only the
//! final chunk's row gives the first token), then one token per step; greedy or seeded sampling.

use crate::forward::{CausalLm, Head, ModelError, Trace};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How the next token is picked.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub greedy: bool,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            greedy: true,
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

pub use moek_ir::reference::argmax;

/// Picks a token from `logits`: greedy, or temperature, then top-k, then top-p (nucleus).
pub fn pick(logits: &[f32], s: &Sampling, rng: &mut SmallRng) -> u32 {
    if s.greedy || s.temperature <= 0.0 {
        return argmax(logits);
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let top = logits[order[0]];
    let mut probs: Vec<f32> = order
        .iter()
        .map(|&i| ((logits[i] - top) / s.temperature).exp())
        .collect();
    let sum: f32 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= sum);
    let mut kept = 0;
    let mut mass = 0.0;
    for p in &probs {
        kept += 1;
        mass += p;
        if mass >= s.top_p {
            break;
        }
    }
    let r: f32 = rng.random_range(0.0..mass);
    let mut acc = 0.0;
    for (i, p) in probs[..kept].iter().enumerate() {
        acc += p;
        if r < acc {
            return order[i] as u32;
        }
    }
    order[kept - 1] as u32
}

/// Generates up to `max_new` tokens after `prompt`, stopping at a stop token (kept in the output).
pub fn generate(
    model: &impl CausalLm,
    prompt: &[u32],
    max_new: usize,
    prefill_chunk: Option<usize>,
    sampling: &Sampling,
    stop: &[u32],
    trace: &mut Vec<Trace>,
) -> Result<Vec<u32>, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::Empty);
    }
    // What the whole generation will need is checked before any of it runs.
    let chunk = prefill_chunk.unwrap_or(prompt.len());
    if chunk == 0 {
        return Err(ModelError::Chunk);
    }
    let positions = prompt.len().saturating_add(max_new);
    if positions > model.context() {
        return Err(ModelError::Context {
            positions,
            context: model.context(),
        });
    }
    let needed = model.cache_bytes(positions);
    if let Some(available) = crate::limits::memory_available()
        && needed > available
    {
        return Err(ModelError::Memory {
            positions,
            needed,
            available,
        });
    }
    let mut cache = model.cache_for(positions);
    let mut last = vec![];
    for part in prompt.chunks(chunk) {
        last = model
            .forward(part, &mut cache, Head::Last, trace)?
            .remove(0);
    }
    let mut rng = SmallRng::seed_from_u64(sampling.seed);
    let mut out = vec![];
    while out.len() < max_new {
        let next = pick(&last, sampling, &mut rng);
        out.push(next);
        if stop.contains(&next) || out.len() == max_new {
            break;
        }
        last = model
            .forward(&[next], &mut cache, Head::Last, trace)?
            .remove(0);
    }
    Ok(out)
}
