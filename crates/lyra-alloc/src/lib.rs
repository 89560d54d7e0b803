//! The global allocator of Lyra's binaries: mimalloc, called as a C program calls it.
//!
//! The `mimalloc` crate passes every allocation's alignment to `mi_malloc_aligned`. In
//! mimalloc 3 that takes a slower path whenever the size class has no free block at hand, and
//! for a block over 1 KiB that is not a power of two it over-allocates. Allocating was 7.8% of
//! the instructions of a no-change plan of 10,000 steps through `mi_malloc_aligned`, 5.2%
//! through `mi_malloc`. Every mimalloc block is aligned to a word (block sizes are whole
//! words, and pages start 16-aligned), so an alignment of a word or less needs no asking;
//! larger ones still go to `mi_malloc_aligned`.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every block mimalloc hands out has: its blocks are whole machine words.
const WORD_ALIGNED: usize = size_of::<usize>();

/// mimalloc as the global allocator: `#[global_allocator] static A: lyra_alloc::MiMalloc = lyra_alloc::MiMalloc;`.
#[derive(Debug, Clone, Copy, Default)]
pub struct MiMalloc;

// SAFETY: each method returns what mimalloc returns for the layout (null on failure), aligned
// as asked: `mi_malloc`, `mi_zalloc` and `mi_realloc` only when the alignment is at most a
// word, which every mimalloc block has; the `_aligned` variants otherwise. Every block is
// freed by `mi_free`, whichever way it was allocated, as mimalloc allows.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc's allocating functions, with a size and a power-of-two alignment.
        unsafe { allocate(layout, mi::mi_malloc, mi::mi_malloc_aligned) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe { allocate(layout, mi::mi_zalloc, mi::mi_zalloc_aligned) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator, so from mimalloc.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`'s alignment, kept by the
        // reallocation as `alloc` keeps it.
        unsafe {
            if layout.align() <= WORD_ALIGNED {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

/// A block for `layout` from `plain` when every block is aligned enough for it, else from
/// `aligned`.
///
/// # Safety
///
/// `plain` and `aligned` allocate as `mi_malloc` and `mi_malloc_aligned` do.
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn allocate(
    layout: Layout,
    plain: unsafe extern "C" fn(usize) -> *mut c_void,
    aligned: unsafe extern "C" fn(usize, usize) -> *mut c_void,
) -> *mut u8 {
    // SAFETY: the caller's functions allocate, and the alignment is a power of two.
    unsafe {
        if layout.align() <= WORD_ALIGNED {
            plain(layout.size()).cast()
        } else {
            aligned(layout.size(), layout.align()).cast()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size up to a few pages and past, at every alignment up to a page: the block is
    /// aligned, writable over its whole size, keeps its bytes through growing and shrinking,
    /// and zeroed when asked.
    #[test]
    #[allow(unsafe_code)]
    fn blocks_are_aligned_and_keep_their_bytes() {
        let a = MiMalloc;
        let sizes = (1..=2048).chain([4095, 4096, 10_000, 65_537, 1 << 20, (4 << 20) + 8]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
                let layout = Layout::from_size_align(size, align).expect("a layout");
                // SAFETY: the layouts are valid and non-zero in size; each block is used only
                // within its size and freed once, with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null(), "size {size} align {align}");
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    p.write_bytes(0xa5, size);
                    let grown = a.realloc(p, layout, size * 2);
                    assert_eq!(grown as usize % align, 0, "grown: size {size} align {align}");
                    assert_eq!(*grown.add(size - 1), 0xa5);
                    let shrunk = a.realloc(grown, Layout::from_size_align(size * 2, align).expect("a layout"), size);
                    assert_eq!(shrunk as usize % align, 0, "shrunk: size {size} align {align}");
                    assert_eq!(*shrunk, 0xa5);
                    a.dealloc(shrunk, layout);
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
