//! Per-thread scratch for the intermediates of one parallel work unit (an expert's gathered
//! tokens, its gate/up and down products). A buffer is taken from the running thread's pool and
//! given back when dropped, so the next unit on that worker reuses its pages. Without the pool,
//! each buffer (hundreds of KiB, above the allocator's mmap threshold) was mapped, faulted in
//! page by page and unmapped once per expert per call: about 3% of the grouped prefill.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

thread_local! {
    /// Given-back storage, in 4-byte words (every element type here is 2 or 4 bytes).
    static POOL: RefCell<Vec<Vec<u32>>> = const { RefCell::new(Vec::new()) };
}

/// A zeroed buffer of `len` elements from this thread's pool, returned to it on drop.
#[derive(Debug)]
pub struct Scratch<T: bytemuck::Pod> {
    words: Vec<u32>,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

impl<T: bytemuck::Pod> Scratch<T> {
    /// `len` zeroed elements.
    pub fn zeroed(len: usize) -> Self {
        const { assert!(std::mem::align_of::<T>() <= 4 && 4 % std::mem::size_of::<T>() == 0) };
        let words_len = (len * std::mem::size_of::<T>()).div_ceil(4);
        let mut words = POOL.with_borrow_mut(|pool| pool.pop()).unwrap_or_default();
        words.clear();
        words.resize(words_len, 0);
        Scratch {
            words,
            len,
            _elem: std::marker::PhantomData,
        }
    }
}

impl<T: bytemuck::Pod> Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
}

impl<T: bytemuck::Pod> DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

impl<T: bytemuck::Pod> Drop for Scratch<T> {
    fn drop(&mut self) {
        let words = std::mem::take(&mut self.words);
        // A thread being torn down has no pool left to give back to; the words are freed.
        let _ = POOL.try_with(|pool| pool.borrow_mut().push(words));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// A buffer comes back zeroed and sized, whatever the one before it held.
    #[test]
    fn reused_buffers_are_zeroed() {
        {
            let mut a = Scratch::<f32>::zeroed(1000);
            a.fill(3.0);
        }
        let b = Scratch::<bf16>::zeroed(7);
        assert_eq!(b.len(), 7);
        assert!(b.iter().all(|v| *v == bf16::ZERO));
        let c = Scratch::<f32>::zeroed(2000);
        assert_eq!(c.len(), 2000);
        assert!(c.iter().all(|v| *v == 0.0));
    }
}
