//! [`AlignedBuf`]: heap memory aligned for O_DIRECT transfers (the file device's bounce
//! buffers, the bench's device probe).

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment O_DIRECT needs of buffers, offsets and lengths on the devices quill targets
/// (4 KiB covers 512-byte and 4 KiB logical sectors).
pub const DIRECT_ALIGN: usize = 4096;

/// Zero-initialised heap memory aligned to [`DIRECT_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation outright (like a Box<[u8]>); shared references only
// read it.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zero bytes; panics if `len` is 0.
    pub fn new(len: usize) -> AlignedBuf {
        assert!(len > 0, "zero-length aligned buffer");
        let layout = Layout::from_size_align(len, DIRECT_ALIGN).expect("aligned buffer layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised bytes, and `&self` rules out a
        // mutable reference to them for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` owns `layout.size()` initialised bytes and `&mut self` makes this the only
        // reference to them.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this very layout, and freed only here.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_zeroed_and_writable() {
        let mut b = AlignedBuf::new(8192);
        assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_ALIGN, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[8191] = 7;
        assert_eq!(b.as_slice()[8191], 7);
    }
}
