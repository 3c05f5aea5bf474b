//! What every lowering shares: the fixed sizes, a phase's work division, reduction segments and
//! tiles, the LX bump allocator, and affine helpers for slots and owners.

use super::*;
use moek_ir::spyre::*;
use moek_ir::{DimName, Kernel, Phase};

/// The fixed sizes of a Spyre spec (validation guarantees they are fixed).
pub(super) struct Sizes {
    pub(super) t: usize,
    pub(super) r: usize,
    pub(super) e: usize,
    pub(super) h: usize,
    pub(super) f: usize,
    /// LX bytes per core the plan must fit.
    pub(super) lx: usize,
}

impl Sizes {
    pub(super) fn of(k: &Kernel, lx: usize) -> Result<Self, LowerError> {
        let get = |d| {
            k.size(d).ok_or_else(|| {
                LowerError::Refused(format!("`{d}` is free; spyre programs are fixed"))
            })
        };
        Ok(Sizes {
            t: get(DimName::T)?,
            r: get(DimName::R)?,
            e: get(DimName::E)?,
            h: get(DimName::H)?,
            f: get(DimName::F)?,
            lx,
        })
    }
}

/// A phase's work division: the split dims, and each core's slice coordinates (row-major).
pub(super) struct Division {
    pub(super) slices: Vec<(String, usize)>,
    pub(super) core_slice: Vec<Vec<usize>>,
    pub(super) divisions: Vec<Vec<String>>,
}

impl Division {
    pub(super) fn of(k: &Kernel, phase: Phase) -> Result<Self, LowerError> {
        let slices: Vec<(String, usize)> = k
            .cores_for(phase)
            .iter()
            .filter(|s| s.parts > 1)
            .map(|s| (s.dim.to_string(), s.parts))
            .collect();
        let cores: usize = slices.iter().map(|s| s.1).product();
        if cores > CORES {
            return Err(LowerError::Refused(format!(
                "{cores} cores; spyre has {CORES}"
            )));
        }
        let core_slice = (0..cores)
            .map(|c| {
                let mut rest = c;
                let mut coords = vec![0; slices.len()];
                for (i, (_, parts)) in slices.iter().enumerate().rev() {
                    coords[i] = rest % parts;
                    rest /= parts;
                }
                coords
            })
            .collect();
        Ok(Division {
            slices,
            core_slice,
            divisions: vec![],
        })
    }

    pub(super) fn parts(&self, d: DimName) -> usize {
        self.slices
            .iter()
            .find(|s| s.0 == d.name())
            .map_or(1, |s| s.1)
    }

    /// The start of a core's slice of `d` (size `n` split evenly), as an affine of its slice.
    pub(super) fn start(&self, d: DimName, n: usize) -> Affine {
        let parts = self.parts(d);
        if parts > 1 {
            Affine::of(d.name(), n / parts)
        } else {
            Affine::constant(0)
        }
    }
}

/// Ordered segments of one core's range of a dim: the declared blocks clipped to the core's
/// slice, relative to its start. Spyre runs one program per core, so the segments must be the
/// same on every slice.
pub(super) fn segments(
    blocks: Option<&Blocks>,
    size: usize,
    parts: usize,
    what: &str,
) -> Result<Vec<(usize, usize)>, LowerError> {
    let len = size / parts;
    let ranges = blocks.map_or_else(|| vec![(0, size)], Blocks::ranges);
    let clip = |p: usize| -> Vec<(usize, usize)> {
        let (lo, hi) = (p * len, (p + 1) * len);
        ranges
            .iter()
            .map(|&(s, e)| (s.max(lo), e.min(hi)))
            .filter(|(s, e)| s < e)
            .map(|(s, e)| (s - lo, e - lo))
            .collect()
    };
    let first = clip(0);
    if (1..parts).any(|p| clip(p) != first) {
        return Err(LowerError::Refused(format!(
            "the {what} blocks do not repeat across the {parts} core slices of their dim; spyre runs one program per core"
        )));
    }
    Ok(first)
}

/// Cuts `(start, end)` segments into tiles of at most `tile` elements.
pub(super) fn tiles(segs: &[(usize, usize)], tile: usize) -> Vec<(usize, usize)> {
    segs.iter()
        .flat_map(|&(s, e)| (s..e).step_by(tile).map(move |t| (t, (t + tile).min(e))))
        .collect()
}

/// Bump allocation of LX buffers, 128 B aligned; every buffer lives for the whole phase.
pub(super) struct Plan {
    pub(super) buffers: Vec<Buffer>,
    pub(super) next: usize,
    /// LX bytes per core the buffers must fit.
    budget: usize,
}

impl Plan {
    pub(super) fn new(budget: usize) -> Self {
        Plan {
            buffers: vec![],
            next: 0,
            budget,
        }
    }

    pub(super) fn buf(&mut self, name: &str, elems: usize, dl16: bool) -> String {
        let bytes = elems * if dl16 { DL16 } else { F32 };
        self.buffers.push(Buffer {
            name: name.into(),
            addr: self.next,
            bytes,
            elems,
            dl16,
            live: (0, 0),
        });
        self.next = (self.next + bytes).next_multiple_of(STICK_BYTES);
        name.into()
    }

    pub(super) fn finish(
        mut self,
        name: &str,
        div: Division,
        body: Vec<Instr>,
    ) -> Result<Stage, LowerError> {
        let last = flat_len(&body).saturating_sub(1);
        self.buffers.iter_mut().for_each(|b| b.live = (0, last));
        if self.next > self.budget {
            let list: Vec<String> = self
                .buffers
                .iter()
                .map(|b| format!("{} {} B", b.name, b.bytes))
                .collect();
            return Err(LowerError::Refused(format!(
                "the {name} phase needs {} bytes of LX per core ({}); the budget is {}",
                self.next,
                list.join(", "),
                self.budget
            )));
        }
        Ok(Stage {
            name: name.into(),
            slices: div.slices,
            core_slice: div.core_slice,
            divisions: div.divisions,
            buffers: self.buffers,
            body,
            selected_copy: 0,
        })
    }
}

/// What one column of a streamed weight tile holds in LX, so a tile that cannot fit says which
/// phase and reduction to cut, and by how much.
pub(super) struct Streamed {
    pub(super) phase: Phase,
    /// The dim the tile advances along.
    pub(super) along: DimName,
    /// The dim each tile column's weight rows run along, its size, and its widest segment per
    /// core (what blocking or a core split shortens).
    pub(super) reduction: DimName,
    pub(super) size: usize,
    pub(super) widest: usize,
    /// Whether `reduce:` blocks shorten the rows (else only a core split does).
    pub(super) blocks_shorten: bool,
    /// LX bytes per reduction element of one tile column (gate and up: two DL16 rows).
    pub(super) per_reduction: usize,
    /// Further LX bytes per tile column (accumulators, outputs).
    pub(super) per_column: usize,
}

impl Streamed {
    fn per_elem(&self) -> usize {
        self.widest * self.per_reduction + self.per_column
    }

    /// Why no tile fits beside `fixed` resident bytes, and the blocking that would fit.
    fn refusal(&self, k: &Kernel, lx: usize, fixed: usize) -> LowerError {
        let stick = STICK_BYTES / DL16;
        let (phase, cores) = match self.phase {
            Phase::All => (format!("`{}`", k.op), "cores".to_string()),
            p => (format!("the {p} phase"), format!("cores({p})")),
        };
        let r = self.reduction;
        let room = lx.saturating_sub(fixed) / stick;
        let most = room.saturating_sub(self.per_column) / self.per_reduction.max(1);
        let mut msg = format!(
            "{phase} streams weight tiles along `{}`, each column a `{r}` row of {}: one {stick}-column tile needs {} bytes of LX beside {fixed} resident, over the budget of {lx}",
            self.along,
            self.widest,
            stick * self.per_elem(),
        );
        let fits = (2..=self.size)
            .filter(|&c| self.size.is_multiple_of(c) && (self.size / c).is_multiple_of(stick))
            .find(|c| self.size / c <= most);
        match fits {
            Some(c) if most >= stick && self.blocks_shorten => msg.push_str(&format!(
                "; cut `{r}` to at most {most} per tile column: `reduce: {r} = {} x {c}`, or `{cores}: {r} = {c}`",
                self.size / c
            )),
            Some(c) if most >= stick => msg.push_str(&format!(
                "; cut `{r}` to at most {most} per core: split it {c} ways in `{cores}`"
            )),
            _ => msg.push_str(&format!(
                "; `{r}` would need rows of at most {most}, and no whole-stick blocking of {} gives them: split the resident operands across more cores",
                self.size
            )),
        }
        LowerError::Streamed {
            reduction: r,
            why: msg,
        }
    }
}

/// The streaming tile: the spec's `stream:` tile when it fixes one (refused when it does not
/// fit), else the widest that fits, up to `n`.
pub(super) fn tile_for(
    k: &Kernel,
    lx: usize,
    n: usize,
    fixed: usize,
    what: &Streamed,
) -> Result<usize, LowerError> {
    let dim = what.along;
    let Some(t) = k.schedule.stream.iter().find(|t| t.dim == dim) else {
        return pick_tile(k, lx, n, fixed, what);
    };
    let tile = t.size.min(n);
    let need = fixed + what.per_elem() * tile;
    if need > lx {
        let fits = pick_tile(k, lx, n, fixed, what)?;
        return Err(LowerError::Refused(format!(
            "the stream tile {dim} = {} needs {need} bytes of LX per core; the budget is {lx}: `stream: {dim} = {fits}` fits",
            t.size
        )));
    }
    Ok(tile)
}

/// The widest whole-stick tile of `n` elements whose `fixed + per_elem * tile` bytes fit LX.
fn pick_tile(
    k: &Kernel,
    lx: usize,
    n: usize,
    fixed: usize,
    what: &Streamed,
) -> Result<usize, LowerError> {
    let stick = STICK_BYTES / DL16;
    let room = lx.saturating_sub(fixed) / what.per_elem().max(1);
    let tile = (room.min(n) / stick) * stick;
    if tile == 0 {
        return Err(what.refusal(k, lx, fixed));
    }
    Ok(tile.min(n))
}

/// `a + c`.
pub(super) fn add(a: &Affine, c: usize) -> Affine {
    Affine {
        constant: a.constant + c,
        terms: a.terms.clone(),
    }
}

/// The route slot `(t0 + ti) * R + r0 + ri`.
pub(super) fn slot(t0: &Affine, r0: &Affine, ti: usize, ri: usize, r: usize) -> Affine {
    let mut a = Affine::constant(ti * r + ri);
    a.terms
        .extend(t0.terms.iter().map(|(d, c)| (d.clone(), c * r)));
    a.terms.extend(r0.terms.iter().cloned());
    a
}

/// Cores whose slice is 0 in each of `dims` that the division splits (they write the result).
pub(super) fn owner(div: &Division, dims: &[&str]) -> Vec<(String, usize)> {
    div.slices
        .iter()
        .filter(|(d, _)| dims.contains(&d.as_str()))
        .map(|(d, _)| (d.clone(), 0))
        .collect()
}
