//! The device's status page (`PEERDIRECT_STATUS_OFFSET`): mapped read-only, read with one
//! atomic load.

#![allow(unsafe_code)]

use core::mem::offset_of;
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU32, Ordering::Acquire};
use std::os::fd::BorrowedFd;

use rustix::io::{Errno, Result};
use rustix::mm::{self, MapFlags, ProtFlags};

use crate::uapi::{self, peerdirect_status};

/// A read-only shared mapping of a device's status page, unmapped on drop.
#[derive(Debug)]
pub(crate) struct StatusPage {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the page is only ever read, through atomic loads (`state`), and the mapping stays
// until the owner drops it: sharing the pointer between threads is sound.
unsafe impl Send for StatusPage {}
// SAFETY: as above.
unsafe impl Sync for StatusPage {}

impl StatusPage {
    /// Maps the status page of the device file `fd`. A regular file (a test's stand-in for a
    /// device) must hold a whole page: touching a mapped page past its end would be SIGBUS.
    pub(crate) fn map(fd: BorrowedFd<'_>) -> Result<Self> {
        let len = rustix::param::page_size();
        check_backed(fd, len, 0)?;
        // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that
        // overlaps no existing mapping, so nothing this process uses is replaced.
        let ptr = unsafe {
            mm::mmap(
                ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                fd,
                uapi::PEERDIRECT_STATUS_OFFSET.into(),
            )
        }?;
        let page = Self {
            ptr: NonNull::new(ptr.cast::<u8>()).ok_or(Errno::NOMEM)?,
            len,
        };
        // A module that knows the page writes its version before anyone can map it.
        if page.word(offset_of!(peerdirect_status, version)) != uapi::PEERDIRECT_STATUS_VERSION {
            return Err(Errno::PROTO);
        }
        Ok(page)
    }

    /// `struct peerdirect_status.state`, loaded with acquire semantics.
    pub(crate) fn state(&self) -> u32 {
        self.word(offset_of!(peerdirect_status, state))
    }

    /// `struct peerdirect_status.resets`, loaded with acquire semantics.
    pub(crate) fn resets(&self) -> u32 {
        self.word(offset_of!(peerdirect_status, resets))
    }

    fn word(&self, offset: usize) -> u32 {
        const { assert!(size_of::<peerdirect_status>() <= 4096) };
        // `offset` is that of a `__u32` field of the struct at the start of the page: 4-byte
        // aligned and inside the mapping, which stays mapped until `self` is dropped.
        // SAFETY: so the word is valid; only the kernel writes it, atomically: an atomic view.
        let word = unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(offset).cast::<u32>()) };
        word.load(Acquire)
    }
}

/// `ENODEV` if `fd` is a regular file (a test's stand-in for a device) shorter than
/// `offset + len`: reading such a mapping past the file's end raises SIGBUS.
fn check_backed(fd: BorrowedFd<'_>, len: usize, offset: u64) -> Result<()> {
    let stat = rustix::fs::fstat(fd)?;
    let regular =
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::RegularFile;
    let size = u64::try_from(stat.st_size).unwrap_or(0);
    if regular && offset.saturating_add(len as u64) > size {
        return Err(Errno::NODEV);
    }
    Ok(())
}

/// Maps `len` bytes at `offset` of the device file `fd`, shared, readable and writable if
/// asked, returns the first `u32` of the mapping and unmaps it: for testing the module's
/// checks of status page mappings.
pub(crate) fn probe_map(
    fd: BorrowedFd<'_>,
    len: usize,
    offset: u64,
    writable: bool,
) -> Result<u32> {
    let prot = if writable {
        ProtFlags::READ | ProtFlags::WRITE
    } else {
        ProtFlags::READ
    };
    if len < 4 {
        return Err(Errno::INVAL);
    }
    check_backed(fd, len, offset)?;
    // SAFETY: with a null address hint and no MAP_FIXED the kernel picks a range that overlaps
    // no existing mapping, so nothing this process uses is replaced.
    let ptr = unsafe { mm::mmap(ptr::null_mut(), len, prot, MapFlags::SHARED, fd, offset) }?;
    let page = StatusPage {
        ptr: NonNull::new(ptr.cast::<u8>()).ok_or(Errno::NOMEM)?,
        len,
    };
    // The module maps only its status page, whose first word is the version; `page` unmaps
    // the whole range when dropped.
    Ok(page.word(0))
}

impl Drop for StatusPage {
    fn drop(&mut self) {
        // An error (impossible for a range we mapped) leaves the mapping in place: safe.
        // SAFETY: `ptr` and `len` are a mapping `map` made, unmapped nowhere else, unreferenced.
        let _ = unsafe { mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
