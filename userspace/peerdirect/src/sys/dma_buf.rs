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

/// The virtual alignment a mapping of `len` bytes gets: the largest page-table entry size
/// (1 GiB, 2 MiB) it can fill, so that the exporter can map it with huge entries where the
/// memory is aligned too (peerdirect's allocations are, to 2 MiB by default); 0 for none.
pub(crate) fn huge_alignment(len: usize) -> usize {
    const PMD: usize = 2 << 20;
    const PUD: usize = 1 << 30;
    match len {
        l if l >= PUD => PUD,
        l if l >= PMD => PMD,
        _ => 0,
    }
}

impl Mapping {
    /// Maps bytes `0..len` of the dma-buf `fd`, shared, readable, and writable if asked, at
    /// a virtual address aligned to [`huge_alignment`]`(len)`.
    pub(crate) fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Self> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        let align = huge_alignment(len);
        if align == 0 {
            // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that
            // overlaps no existing mapping, so nothing this process uses is replaced.
            let ptr = unsafe { mm::mmap(ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }?;
            let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
            return Ok(Self { ptr, len, writable });
        }
        // Reserve `len + align` bytes of address space nobody else uses, map the dma-buf over
        // the aligned part of it, and give back the rest.
        let span = len.checked_add(align).ok_or(rustix::io::Errno::NOMEM)?;
        // SAFETY: as above (no MAP_FIXED); the reservation is inaccessible and unbacked.
        let base = unsafe {
            mm::mmap_anonymous(
                ptr::null_mut(),
                span,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?
        .cast::<u8>();
        let skip = (base as usize).next_multiple_of(align) - base as usize;
        // SAFETY: `base + skip .. + len` lies inside the reservation just made, which this
        // function alone owns: MAP_FIXED replaces only that part of it.
        let mapped = unsafe {
            mm::mmap(
                base.add(skip).cast(),
                len,
                prot,
                MapFlags::SHARED | MapFlags::FIXED,
                fd,
                0,
            )
        };
        // The reservation's head and tail (and, on failure, all of it) go back.
        let (head, tail) = (skip, span - skip - len);
        // SAFETY: each range is a part of the reservation not covered by the dma-buf's
        // mapping (or the whole reservation, when that mapping failed), unreferenced.
        unsafe {
            if mapped.is_err() {
                let _ = mm::munmap(base.cast(), span);
            } else {
                if head > 0 {
                    let _ = mm::munmap(base.cast(), head);
                }
                if tail > 0 {
                    let _ = mm::munmap(base.add(skip + len).cast(), tail);
                }
            }
        }
        let ptr = NonNull::new(mapped?.cast::<u8>()).ok_or(rustix::io::Errno::NOMEM)?;
        Ok(Self { ptr, len, writable })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Where it is mapped (for checks of its alignment).
    #[cfg(test)]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
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
