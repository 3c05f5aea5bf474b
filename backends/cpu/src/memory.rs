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
    fn huge_vec_is_zeroed_and_sized() {
        let v = huge_vec::<u16>((4 << 20) + 3);
        assert_eq!(v.len(), (4 << 20) + 3);
        assert!(v.iter().all(|&x| x == 0));
    }

    #[test]
    fn huge_capacity_is_empty_with_room() {
        let v = huge_capacity::<u32>((1 << 20) + 5);
        assert!(v.is_empty() && v.capacity() >= (1 << 20) + 5);
    }
}
