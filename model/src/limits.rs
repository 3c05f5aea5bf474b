//! What the machine can hold: the memory a run may use, checked before the work that would
//! need more (a copied checkpoint, a KV cache), so a run that cannot fit says so with the sizes
//! instead of being killed part way.

/// Bytes of memory a run may use: the kernel's `MemAvailable` (Linux), or `MOEK_MEMORY_LIMIT`
/// (bytes) when that is set and lower. `None` where neither says (no check is made).
pub fn memory_available() -> Option<u64> {
    let limit = std::env::var("MOEK_MEMORY_LIMIT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok());
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    });
    match (limit, meminfo) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
