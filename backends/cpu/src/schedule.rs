//! The small vocabulary generated code uses to follow a schedule: grids of work units, blocks
//! clipped to a unit's range, disjoint output writes, routes grouped by expert.

use crate::quant::Weight;
use moek_ir::Element;
use std::ops::Range;

/// The `i`-th of `parts` near-equal parts of `0..size` (exact when `parts` divides `size`).
pub fn part(size: usize, parts: usize, i: usize) -> Range<usize> {
    (i * size / parts)..((i + 1) * size / parts)
}

/// A grid of work units: each dim of `size` cut into `parts`; unit `u` is one part of each, the
/// last dim varying fastest.
#[derive(Clone, Copy, Debug)]
pub struct Grid<const N: usize> {
    dims: [(usize, usize); N],
}

impl<const N: usize> Grid<N> {
    pub fn new(dims: [(usize, usize); N]) -> Self {
        Grid { dims }
    }

    /// Number of work units.
    pub fn units(&self) -> usize {
        self.dims.iter().map(|d| d.1).product()
    }

    /// The part index of each dim for unit `u`.
    pub fn index(&self, u: usize) -> [usize; N] {
        let mut rest = u;
        let mut out = [0; N];
        for d in (0..N).rev() {
            out[d] = rest % self.dims[d].1;
            rest /= self.dims[d].1;
        }
        out
    }

    /// The range of each dim unit `u` covers.
    pub fn ranges(&self, u: usize) -> [Range<usize>; N] {
        let idx = self.index(u);
        std::array::from_fn(|d| part(self.dims[d].0, self.dims[d].1, idx[d]))
    }
}

/// The declared blocks, in declared order, clipped to `range` (empty pieces dropped).
pub fn clip(blocks: &[(usize, usize)], range: Range<usize>) -> Vec<(usize, usize)> {
    blocks
        .iter()
        .map(|&(s, e)| (s.max(range.start), e.min(range.end)))
        .filter(|(s, e)| s < e)
        .collect()
}

/// An output buffer that work units write disjoint parts of, in parallel.
///
/// The schedule guarantees disjointness: validated splits partition the output, so no two units
/// are handed overlapping ranges. Bounds are still checked.
#[derive(Debug)]
pub struct SharedOut<'a> {
    ptr: *mut f32,
    len: usize,
    _life: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: units only write disjoint ranges (see the type's doc); f32 is Send.
unsafe impl Send for SharedOut<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedOut<'_> {}

impl<'a> SharedOut<'a> {
    pub fn new(out: &'a mut [f32]) -> Self {
        SharedOut {
            ptr: out.as_mut_ptr(),
            len: out.len(),
            _life: std::marker::PhantomData,
        }
    }

    /// The elements `start..start + len`.
    ///
    /// # Safety
    /// No other live slice from this `SharedOut` may overlap the range.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len, "unit wrote past its output");
        // SAFETY: in bounds (asserted); exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

impl SharedOut<'_> {
    /// Copies a `rows x cols` tile (row-major, contiguous) to `start + i * ld` for each row `i`.
    ///
    /// # Safety
    /// No other unit may write the tile's cells while this runs.
    pub unsafe fn write_tile(
        &self,
        start: usize,
        ld: usize,
        tile: &[f32],
        rows: usize,
        cols: usize,
    ) {
        for i in 0..rows {
            // SAFETY: the tile's cells belong to this unit (the caller's contract).
            let dst = unsafe { self.slice(start + i * ld, cols) };
            dst.copy_from_slice(&tile[i * cols..(i + 1) * cols]);
        }
    }
}

/// `out[j - rows.start] = sum over segs (in order) of x[seg] . mat[j*ld + seg]` for `j` in `rows`.
///
/// Each segment's partial is a complete dot product added to the running sum in declared order.
/// Rows are read one at a time, front to back ([`crate::dot::dot_rows`]).
/// `ld`, the rows and the segments count values; `mat` may be quantized blocks ([`Weight`]).
pub fn matvec_segments<A: Element, W: Weight>(
    x: &[A],
    mat: &[W],
    ld: usize,
    rows: Range<usize>,
    segs: &[(usize, usize)],
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows.len(), "matvec output length");
    W::matvec_segments(x, mat, ld, rows, segs, out);
}

/// [`matvec_segments`] of a row made ready once ([`Weight::row`]) for every product it enters.
pub fn matvec_row<A: Element, W: Weight>(
    x: &W::Row<'_, A>,
    mat: &[W],
    ld: usize,
    rows: Range<usize>,
    segs: &[(usize, usize)],
    out: &mut [f32],
) {
    assert_eq!(out.len(), rows.len(), "matvec output length");
    W::matvec_row(x, mat, ld, rows, segs, out);
}

/// Values `range` of a weight tensor stored as `W` (`at..` runs to its end): the elements
/// themselves, or the blocks that hold them (the range must fall on block boundaries).
pub fn values<W: Element>(w: &[W], range: impl std::ops::RangeBounds<usize>) -> &[W] {
    use std::ops::Bound::{Excluded, Included, Unbounded};
    let n = W::VALUES;
    let start = match range.start_bound() {
        Included(&s) => s,
        Excluded(&s) => s + 1,
        Unbounded => 0,
    };
    let end = match range.end_bound() {
        Included(&e) => e + 1,
        Excluded(&e) => e,
        Unbounded => w.len() * n,
    };
    assert!(
        start.is_multiple_of(n) && end.is_multiple_of(n),
        "values {start}..{end} do not fall on blocks of {n}"
    );
    &w[start / n..end / n]
}

/// For each expert, the route slots `t * routes + r` that chose it, in slot order.
pub fn group_by_expert(idx: &[u32], experts: usize) -> Vec<Vec<usize>> {
    let mut lists = vec![Vec::new(); experts];
    for (slot, &e) in idx.iter().enumerate() {
        lists[e as usize].push(slot);
    }
    lists
}

/// The dense `[T, E]` route matrix: the weights of a token's routes to each expert (repeated
/// routes add), 0 where unselected.
pub fn dense_routes(
    idx: &[u32],
    weights: &[f32],
    tokens: usize,
    routes: usize,
    experts: usize,
) -> Vec<f32> {
    let mut dense = vec![0f32; tokens * experts];
    for t in 0..tokens {
        for r in 0..routes {
            dense[t * experts + idx[t * routes + r] as usize] += weights[t * routes + r];
        }
    }
    dense
}

/// Rows `rows` of a `[_, width]` matrix copied into `dst`, one after another.
pub fn gather_rows_into<W: Element>(
    dst: &mut [W],
    src: &[W],
    width: usize,
    rows: impl IntoIterator<Item = usize>,
) {
    for (d, r) in dst.chunks_exact_mut(width).zip(rows) {
        d.copy_from_slice(&src[r * width..(r + 1) * width]);
    }
}
