//! System calls on a dma-buf fd that involve raw pointers: DMA-BUF's ioctls, and `mmap` with
//! the [`Mapping`] that owns the mapped range.

#![allow(unsafe_code)]

use core::ffi::{c_void, CStr};
use core::ptr::{self, NonNull};
use std::os::fd::BorrowedFd;

use rustix::io::Result;
use rustix::ioctl::{ioctl, IntegerSetter, Setter};
use rustix::mm::{self, MapFlags, ProtFlags};

use crate::uapi::{dma_buf_sync, DMA_BUF_IOCTL_SYNC, DMA_BUF_SET_NAME};

/// `DMA_BUF_IOCTL_SYNC` with `flags` (`DMA_BUF_SYNC_*`, passed through unchecked).
pub(crate) fn sync(fd: BorrowedFd<'_>, flags: u64) -> Result<()> {
    let sync = dma_buf_sync { flags };
    // SAFETY: DMA_BUF_IOCTL_SYNC takes a `*const struct dma_buf_sync`, which `Setter` passes
    // (a pointer to its own copy of the struct); the kernel only reads it.
    let request = unsafe { Setter::<DMA_BUF_IOCTL_SYNC, dma_buf_sync>::new(sync) };
    // SAFETY: the opcode and the argument agree (above).
    unsafe { ioctl(fd, request) }
}

/// `DMA_BUF_SET_NAME`.
pub(crate) fn set_name(fd: BorrowedFd<'_>, name: &CStr) -> Result<()> {
    // SAFETY: DMA_BUF_SET_NAME takes a pointer to a NUL-terminated string, which the kernel
    // reads (strndup_user) and never writes; `name` is one and outlives the call.
    let request = unsafe {
        IntegerSetter::<DMA_BUF_SET_NAME>::new_pointer(name.as_ptr().cast_mut().cast::<c_void>())
    };
    // SAFETY: the opcode and the argument agree (above); the string lives until we return.
    unsafe { ioctl(fd, request) }
}

/// A shared mapping of a dma-buf, unmapped on drop.
///
/// The memory is the device's (write-combined HBM): it is only ever copied to and from with
/// plain loads and stores, and no Rust reference into it is ever made, because the device, the
/// host and other mappings may change it at any time.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

impl Mapping {
    /// Maps bytes `0..len` of the dma-buf `fd`, shared, readable, and writable if asked.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Self> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that
        // overlaps no existing mapping, so nothing this process uses is replaced.
        let ptr = unsafe { mm::mmap(ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }?;
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(Self { ptr, len, writable })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn writable(&self) -> bool {
        self.writable
    }

    /// Copies bytes `offset..offset + buf.len()` of the mapping into `buf`.
    ///
    /// # Panics
    ///
    /// If the range is not inside the mapping.
    pub(crate) fn read(&self, offset: usize, buf: &mut [u8]) {
        self.check_range(offset, buf.len());
        // The mapping stays mapped and readable until `self` is dropped, and no reference into
        // it exists.
        // SAFETY: the range is inside it (checked above); `buf` is Rust's, so no overlap.
        unsafe {
            ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), buf.as_mut_ptr(), buf.len())
        }
    }

    /// Copies `data` into bytes `offset..offset + data.len()` of the mapping.
    ///
    /// # Panics
    ///
    /// If the range is not inside the mapping, or the mapping is not writable.
    pub(crate) fn write(&mut self, offset: usize, data: &[u8]) {
        assert!(self.writable, "write to a read-only dma-buf mapping");
        self.check_range(offset, data.len());
        // The mapping stays mapped and writable (asserted above) until `self` is dropped, no
        // reference into it exists, and `&mut self` keeps other copies through it out.
        // SAFETY: the range is inside it (checked above); `data` is Rust's, so no overlap.
        unsafe {
            ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }

    fn check_range(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "bytes {offset}..+{len} are outside the {}-byte mapping",
            self.len
        );
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // An error (impossible for a range we mapped) leaves the mapping in place: safe.
        // SAFETY: `ptr` and `len` are a mapping `new` made, unmapped nowhere else, unreferenced.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
