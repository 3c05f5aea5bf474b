//! Buffers the CPU streams from: weights and the bandwidth probe live in transparent huge pages.
//!
//! Reading gigabytes through 4 KiB pages misses the TLB on every page: on this project's machines
//! a 2-thread read reaches about 15 GB/s from 4 KiB pages and 27 GB/s from 2 MiB pages. Decode is
//! a pure stream of weights, so where they live sets its ceiling. Linux only maps huge pages into
//! a range that asked for them (`madvise`, the usual `enabled` setting), and only on first touch.

use rayon::prelude::*;

/// A zeroed `Vec` of `len` elements whose pages were asked to be huge before first touch.
///
/// The pages are first touched (and so faulted in and zeroed by the kernel) on every thread at
/// once: in a virtual machine each fault of fresh memory can trap to the host, and there one
/// thread faulting gigabytes of huge pages alone took four times as long as two.
///
/// Elsewhere than Linux, or where the kernel declines, it is an ordinary zeroed `Vec`.
pub fn huge_vec<T: Copy + Default + Send>(len: usize) -> Vec<T> {
    /// Elements each thread touches at a time: whole huge pages for any element size.
    const TOUCH: usize = 4 << 20;
    let mut v = huge_capacity(len);
    v.spare_capacity_mut()[..len]
        .par_chunks_mut(TOUCH)
        .for_each(|c| c.fill(std::mem::MaybeUninit::new(T::default())));
    // SAFETY: the first `len` elements were just written, and the capacity holds them.
    unsafe { v.set_len(len) };
    v
}

/// An empty `Vec` with room for `len` elements whose pages were asked to be huge: the writes
/// that fill it (`extend_from_slice`, `resize`) touch them first, so they come as huge pages.
pub fn huge_capacity<T>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = Vec::with_capacity(len);
    advise_huge(v.as_mut_ptr().cast(), len * std::mem::size_of::<T>());
    v
}

/// Keeps the memory this process frees for its own later allocations instead of handing it back
/// to the kernel (glibc's allocator: no `mmap` of its own for large blocks, no trimming), for a
/// run that draws and drops gigabytes of weights over and over (`moek check`).
///
/// A virtual machine whose balloon reports free pages to its host loses what a process hands
/// back, and touching fresh memory then traps to the host page by page: on such a machine
/// `moek check` spent 347 s of system time (377 s in all) handing back and refaulting its cases,
/// and 67-134 s (214-246 s) keeping them. The price: the resident set keeps its high-water mark
/// (peak 9.7 -> 11.9-15.9 GB there). Elsewhere than glibc, nothing.
pub fn retain_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's thresholds; -1 turns trimming off (mallopt(3)).
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, -1);
    }
}

/// The system allocator, with every block of [`LARGE`] bytes or more starting on a cache line.
///
/// glibc puts the blocks it maps 16 bytes past a page, so every row of a weight matrix built in
/// memory straddled two cache lines where its size is a multiple of 64 bytes. The AMX tiles read
/// weight rows in place, 64 bytes a tile row, and a straddling row costs two lines: aligned, the
/// grouped and persistent MoE prefill kernels ran 1.06x and 1.18x faster on AMX
/// (docs/performance.md). A binary installs it with `#[global_allocator]`; the blocks its
/// libraries allocate then come aligned too.
///
/// Large blocks keep the system's zeroing: a zeroed one is `calloc`'s, so fresh pages are not
/// touched before their first use.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineAligned;

/// Blocks of this many bytes or more start on a cache line (smaller ones hold no weights).
pub const LARGE: usize = 64 << 10;

/// A cache line's bytes.
pub const LINE: usize = 64;

/// A growable buffer whose first element starts a cache line: for the small buffers a kernel
/// loads a line at a time (an activation row), which [`LineAligned`] leaves to the system.
pub type Lines<T> = aligned_vec::AVec<T, aligned_vec::ConstAlign<LINE>>;

// SAFETY: every method hands over to the system allocator, large blocks through `line`, whose
// blocks are told apart from the system's by the size the caller gives back (a block is freed
// with the layout it was made with).
unsafe impl std::alloc::GlobalAlloc for LineAligned {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        match line::holds(layout) {
            // SAFETY: the layout's size is not zero (it is at least LARGE).
            true => unsafe { line::alloc(layout.size(), false) },
            // SAFETY: the caller's contract.
            false => unsafe { std::alloc::System.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        match line::holds(layout) {
            // SAFETY: as in `alloc`.
            true => unsafe { line::alloc(layout.size(), true) },
            // SAFETY: the caller's contract.
            false => unsafe { std::alloc::System.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        match line::holds(layout) {
            // SAFETY: `ptr` came from `line::alloc` (the same size made it there).
            true => unsafe { line::free(ptr) },
            // SAFETY: the caller's contract.
            false => unsafe { std::alloc::System.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        // SAFETY (the new layout): the caller guarantees `size` rounded up to the alignment
        // does not overflow.
        let grown = unsafe { std::alloc::Layout::from_size_align_unchecked(size, layout.align()) };
        match (line::holds(layout), line::holds(grown)) {
            // SAFETY: `ptr` came from `line::alloc`; the caller's contract for the rest.
            (true, true) => unsafe { line::realloc(ptr, layout.size(), size) },
            // SAFETY: the caller's contract.
            (false, false) => unsafe { std::alloc::System.realloc(ptr, layout, size) },
            // Across the threshold: a new block, the contents copied, the old freed.
            _ => unsafe {
                let new = self.alloc(grown);
                if !new.is_null() {
                    std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(size));
                    self.dealloc(ptr, layout);
                }
                new
            },
        }
    }
}

/// Large blocks: `malloc`ed (or `calloc`ed) with a line to spare, handed out from the first
/// line boundary past the word that remembers where the system's block starts.
#[cfg(unix)]
mod line {
    use super::LINE;
    use std::alloc::Layout;

    /// Bytes asked of the system beyond the caller's: the word and the way to a boundary
    /// (`malloc` returns 16-byte aligned blocks, so at most 56).
    const SPARE: usize = LINE;

    /// Whether a block of `layout` is made here: large, and aligned no more than a line.
    pub(super) fn holds(layout: Layout) -> bool {
        layout.size() >= super::LARGE && layout.align() <= LINE
    }

    /// The first line boundary past a word into `raw` (at most SPARE bytes in: the system's
    /// blocks are aligned to a word at least).
    fn start(raw: *mut u8) -> *mut u8 {
        let at = raw.wrapping_add(size_of::<usize>());
        at.wrapping_add(at.align_offset(LINE))
    }

    /// A block of `size` bytes on a line boundary (zeroed if `zeroed`), or null.
    ///
    /// # Safety
    /// `size` is not zero.
    pub(super) unsafe fn alloc(size: usize, zeroed: bool) -> *mut u8 {
        let Some(total) = size.checked_add(SPARE) else {
            return std::ptr::null_mut();
        };
        // SAFETY: plain C allocations of a nonzero size.
        let raw = unsafe {
            match zeroed {
                true => libc::calloc(total, 1),
                false => libc::malloc(total),
            }
        }
        .cast::<u8>();
        if raw.is_null() {
            return raw;
        }
        let ptr = start(raw);
        // SAFETY: `ptr` lies at least a word into the block, its `size` bytes inside it.
        unsafe { ptr.cast::<*mut u8>().sub(1).write_unaligned(raw) };
        ptr
    }

    /// The system's block behind `ptr`.
    ///
    /// # Safety
    /// `ptr` came from [`alloc`] or [`realloc`].
    unsafe fn raw(ptr: *mut u8) -> *mut u8 {
        // SAFETY: the word before `ptr` was written when it was handed out.
        unsafe { ptr.cast::<*mut u8>().sub(1).read_unaligned() }
    }

    /// Frees a block from [`alloc`].
    ///
    /// # Safety
    /// `ptr` came from [`alloc`] or [`realloc`] and is not used again.
    pub(super) unsafe fn free(ptr: *mut u8) {
        // SAFETY: the caller's contract.
        unsafe { libc::free(raw(ptr).cast()) }
    }

    /// The block at `ptr` (`old` bytes) resized to `size` bytes, both large; null if the
    /// system has no room (the old block then stands).
    ///
    /// # Safety
    /// `ptr` came from [`alloc`] or [`realloc`] with `old` bytes.
    pub(super) unsafe fn realloc(ptr: *mut u8, old: usize, size: usize) -> *mut u8 {
        let Some(total) = size.checked_add(SPARE) else {
            return std::ptr::null_mut();
        };
        // SAFETY: the caller's contract; `ptr` lies inside the system's block.
        let (base, offset) = unsafe {
            let base = raw(ptr);
            (base, ptr.offset_from(base) as usize)
        };
        // SAFETY: `base` is the system's block; the new one holds `total` bytes.
        let moved = unsafe { libc::realloc(base.cast(), total) }.cast::<u8>();
        if moved.is_null() {
            return moved;
        }
        let ptr = start(moved);
        // SAFETY: the contents sit `offset` bytes into the new block (realloc kept them); they
        // move to the boundary (the ranges may overlap), and the word before it is rewritten.
        unsafe {
            let at = ptr.offset_from(moved) as usize;
            if at != offset {
                std::ptr::copy(moved.add(offset), ptr, old.min(size));
            }
            ptr.cast::<*mut u8>().sub(1).write_unaligned(moved);
        }
        ptr
    }
}

/// Elsewhere than Unix every block is the system's.
#[cfg(not(unix))]
mod line {
    pub(super) fn holds(_: std::alloc::Layout) -> bool {
        false
    }
    pub(super) unsafe fn alloc(_: usize, _: bool) -> *mut u8 {
        unreachable!("no block is held here")
    }
    pub(super) unsafe fn free(_: *mut u8) {
        unreachable!("no block is held here")
    }
    pub(super) unsafe fn realloc(_: *mut u8, _: usize, _: usize) -> *mut u8 {
        unreachable!("no block is held here")
    }
}

/// Asks the CPU to start loading the cache line at `p` into L1: a hint that reads nothing and
/// never faults, whatever the address (elsewhere than x86_64, nothing).
#[inline(always)]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86_64 CPU, and a prefetch does not access memory.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// [`prefetch`] every cache line of the `bytes` bytes at `p`. A kernel whose step reads more
/// or less than a line prefetches its step's whole span: one prefetch a step at a fixed
/// distance skips a line now and then (one in nine for steps of 72 bytes), and each skipped
/// line is a demand miss the core waits for.
#[inline(always)]
pub fn prefetch_span<T>(p: *const T, bytes: usize) {
    let p = p.cast::<u8>();
    for offset in span_offsets(bytes) {
        prefetch(p.wrapping_add(offset));
    }
}

/// Offsets into a span of `bytes` bytes that touch each of its cache lines, wherever it starts:
/// one a line's width apart, and its last byte. A plain counted range, which the compiler
/// unrolls into straight prefetches for a constant span (a chained iterator stayed a loop with a
/// state flag: a dozen scalar instructions a step beside the kernels' vector work).
#[inline(always)]
fn span_offsets(bytes: usize) -> impl Iterator<Item = usize> {
    let last = bytes.saturating_sub(1);
    (0..=bytes.div_ceil(LINE)).map(move |i| (i * LINE).min(last))
}

/// [`prefetch`] into L2 only: for lines wanted thousands of cycles later, which L1 would not keep.
#[inline(always)]
pub fn prefetch_l2<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `prefetch`.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for huge pages on the whole 2 MiB pages inside `bytes` bytes at `ptr` (a hint; errors
/// only mean small pages).
fn advise_huge(ptr: *mut u8, bytes: usize) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = ptr.align_offset(HUGE);
        if start < bytes {
            let len = (bytes - start) / HUGE * HUGE;
            if len > 0 {
                // SAFETY: the range lies inside one live allocation of `bytes` bytes; madvise
                // with MADV_HUGEPAGE changes no contents, only how pages are backed.
                unsafe { libc::madvise(ptr.add(start).cast(), len, libc::MADV_HUGEPAGE) };
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_prefetches_every_line_it_touches_wherever_it_starts() {
        for bytes in 1..=300 {
            for start in 0..64 {
                let lines: std::collections::BTreeSet<usize> =
                    span_offsets(bytes).map(|o| (start + o) / 64).collect();
                let want: std::collections::BTreeSet<usize> =
                    (start / 64..=(start + bytes - 1) / 64).collect();
                assert_eq!(lines, want, "{bytes} bytes from {start}");
            }
        }
    }

    #[test]
    fn huge_vec_is_zeroed_and_sized() {
        let v = huge_vec::<u16>((4 << 20) + 3);
        assert_eq!(v.len(), (4 << 20) + 3);
        assert!(v.iter().all(|&x| x == 0));
    }

    /// Large blocks start on a line, come zeroed when asked, keep their contents through
    /// every kind of resize (within large sizes, and across the threshold both ways), and
    /// small ones are the system's.
    #[test]
    fn large_blocks_start_on_a_line_and_keep_their_contents() {
        use std::alloc::{GlobalAlloc, Layout};
        let a = LineAligned;
        let fill = |p: *mut u8, n: usize| {
            for i in 0..n {
                // SAFETY: `p` holds `n` bytes.
                unsafe { p.add(i).write((i % 251) as u8) };
            }
        };
        let holds = |p: *mut u8, n: usize| {
            // SAFETY: `p` holds at least `n` bytes.
            (0..n).all(|i| unsafe { p.add(i).read() } == (i % 251) as u8)
        };
        for align in [1, 2, 16, 64] {
            let layout = Layout::from_size_align(LARGE + 3, align).unwrap();
            // SAFETY: nonzero sizes; every block is freed with the layout it has.
            unsafe {
                let z = a.alloc_zeroed(layout);
                assert_eq!(z as usize % 64, 0, "align {align}");
                assert!((0..layout.size()).all(|i| z.add(i).read() == 0));
                a.dealloc(z, layout);

                let mut p = a.alloc(layout);
                assert_eq!(p as usize % 64, 0);
                fill(p, layout.size());
                let mut size = layout.size();
                // Larger and larger (moving as the system likes), then smaller, then below
                // the threshold and back above it.
                for next in [
                    3 * LARGE + 5,
                    64 * LARGE + 1,
                    2 * LARGE,
                    LARGE - 7,
                    LARGE + 9,
                ] {
                    let moved = a.realloc(p, Layout::from_size_align(size, align).unwrap(), next);
                    assert!(!moved.is_null());
                    assert!(
                        holds(moved, size.min(next)),
                        "{size} -> {next}, align {align}"
                    );
                    if next >= LARGE {
                        assert_eq!(moved as usize % 64, 0, "{size} -> {next}");
                    }
                    fill(moved, next);
                    (p, size) = (moved, next);
                }
                a.dealloc(p, Layout::from_size_align(size, align).unwrap());
            }
        }
        // Small blocks and over-aligned ones stay the system's (and still work).
        let small = Layout::from_size_align(100, 8).unwrap();
        let wide = Layout::from_size_align(LARGE, 4096).unwrap();
        for layout in [small, wide] {
            // SAFETY: as above.
            unsafe {
                let p = a.alloc(layout);
                assert_eq!(p as usize % layout.align(), 0);
                fill(p, layout.size());
                assert!(holds(p, layout.size()));
                a.dealloc(p, layout);
            }
        }
    }

    #[test]
    fn huge_capacity_is_empty_with_room() {
        let v = huge_capacity::<u32>((1 << 20) + 5);
        assert!(v.is_empty() && v.capacity() >= (1 << 20) + 5);
    }
}
