//! How the measuring commands report: the output format, medians, and the bandwidth probe
//! each timed sample is judged against.

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// The probe read before each timed decode call or step: past the largest cache
/// ([`moek_cpu::bandwidth::probe_bytes`]), in huge pages like the weights, best of two passes.
/// Shared machines change memory speed from one second to the next, so each sample is judged
/// against its own moment.
pub(crate) fn sample_probe() -> moek_cpu::bandwidth::Probe {
    moek_cpu::bandwidth::Probe::new(moek_cpu::bandwidth::probe_bytes())
}

/// The median over samples of `work / roof[i] / times[i]`: each timed sample's share of the
/// roof measured just before it (bytes against the read bandwidth probed, FLOPs against the
/// peak timed).
pub(crate) fn median_ratio(work: f64, roof: &[f64], times: &[f64]) -> f64 {
    median(roof.iter().zip(times).map(|(r, t)| work / r / t))
}

/// The most a prefill could reach, GFLOP/s: the lower of the `peak` (GFLOP/s) and what reading
/// its weights once allows, `flops` over the time `bytes` take at `bandwidth` (bytes/s). Every
/// weight is read from memory at least once, the weights being far larger than the caches.
pub(crate) fn prefill_roof(peak: f64, flops: f64, bytes: f64, bandwidth: f64) -> f64 {
    peak.min(flops / bytes * bandwidth / 1e9)
}

/// Figures as one pretty JSON object on stdout (what `--format json` scripts read).
pub(crate) fn print_json(figures: &impl serde::Serialize) {
    println!(
        "{}",
        serde_json::to_string_pretty(figures).expect("figures serialise")
    );
}

pub(crate) fn median(samples: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = samples.collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
