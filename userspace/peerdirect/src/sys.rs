//! The ioctls themselves: the only place in the crate that issues system calls with raw
//! pointers. Everything here is safe to call; each `unsafe` block says why.

#![allow(unsafe_code)]

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use std::os::fd::BorrowedFd;

use rustix::io::Result;
use rustix::ioctl::{ioctl, Ioctl, IoctlOutput, Opcode, Updater};

use crate::uapi::{self, peerdirect_info, PEERDIRECT_IOC_INFO};

/// A `PEERDIRECT_IOC_INFO` argument under the caller's full control: the struct, sent as is
/// (`size`, `flags` and the `__reserved*` fields included), followed by `TAIL` more bytes that
/// stand for the fields of a newer version of the struct.
///
/// Meant for exercising the module's argument checks; [`crate::Device::info`] is the normal way.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawInfo<const TAIL: usize> {
    /// The struct as this crate knows it.
    pub info: peerdirect_info,
    /// Bytes right after the struct; the kernel reads them when `info.size` covers them.
    pub tail: [u8; TAIL],
}

impl<const TAIL: usize> RawInfo<TAIL> {
    /// The bytes the kernel may access: the struct and the tail.
    pub const CAPACITY: usize = size_of::<peerdirect_info>() + TAIL;

    /// A well-formed request: `size` is the struct's, everything else zero.
    pub fn new() -> Self {
        Self {
            info: info_request(),
            tail: [0; TAIL],
        }
    }
}

impl<const TAIL: usize> Default for RawInfo<TAIL> {
    fn default() -> Self {
        Self::new()
    }
}

/// A `struct peerdirect_info` ready to send: `size` set, everything else zero.
pub(crate) fn info_request() -> peerdirect_info {
    peerdirect_info {
        size: uapi::PEERDIRECT_INFO_SIZE_VER0,
        ..Default::default()
    }
}

/// `PEERDIRECT_IOC_INFO` with the struct this crate was built with.
pub(crate) fn info(fd: BorrowedFd<'_>) -> Result<peerdirect_info> {
    let mut info = info_request();
    // SAFETY: PEERDIRECT_IOC_INFO takes a `*mut struct peerdirect_info`, and `peerdirect_info` is
    // that struct, generated from the header (tests/uapi_layout.rs checks its layout against the
    // C compiler's). `size` is the struct's own, so the kernel accesses no byte outside it.
    let request = unsafe { Updater::<PEERDIRECT_IOC_INFO, peerdirect_info>::new(&mut info) };
    // SAFETY: the opcode and the argument agree (above); `request` borrows `info` mutably for
    // the call, so the kernel's write-back aliases nothing, and any bytes it writes are a valid
    // `peerdirect_info` (plain integers).
    unsafe { ioctl(fd, request) }?;
    Ok(info)
}

/// `PEERDIRECT_IOC_INFO` with a [`RawInfo`].
///
/// # Panics
///
/// If `raw.info.size` exceeds `RawInfo::<TAIL>::CAPACITY`: the kernel would access memory past
/// `raw`. [`crate::Device::info_raw`] refuses such requests before getting here.
pub(crate) fn info_raw<const TAIL: usize>(
    fd: BorrowedFd<'_>,
    raw: &mut RawInfo<TAIL>,
) -> Result<()> {
    // The tail must start where the kernel looks for the bytes it does not know.
    const { assert!(offset_of!(RawInfo<TAIL>, tail) == size_of::<peerdirect_info>()) };
    assert!(raw.info.size as usize <= RawInfo::<TAIL>::CAPACITY);
    // SAFETY: PEERDIRECT_IOC_INFO takes a pointer to a `struct peerdirect_info`, possibly
    // followed by the fields of newer versions: the kernel reads at most
    // max(`size`, sizeof(struct peerdirect_info)) bytes from it and writes back at most
    // min(`size`, sizeof(struct peerdirect_info)). `RawInfo` is `repr(C)` with the struct first
    // and the tail right after it (asserted at compile time), and `size` does not reach past the
    // tail (asserted above), so every access stays inside `raw`.
    let request = unsafe { Updater::<PEERDIRECT_IOC_INFO, RawInfo<TAIL>>::new(raw) };
    // SAFETY: as above; `request` borrows `raw` mutably for the call, and any bytes the kernel
    // writes are valid for its plain-integer fields.
    unsafe { ioctl(fd, request) }
}

/// `_IO(PEERDIRECT_IOCTL_TYPE, nr)` with a null argument.
pub(crate) fn command(fd: BorrowedFd<'_>, nr: u8) -> Result<()> {
    // SAFETY: the argument is a null pointer, so whatever the module makes of command `nr`,
    // it cannot read or write this process's memory: a user access to address 0 fails with
    // EFAULT (the zero page is never mapped, vm.mmap_min_addr).
    unsafe { ioctl(fd, NullArgCommand(uapi::command(nr))) }
}

/// An `_IO` command whose number is only known at run time (rustix's `NoArg` wants a constant).
struct NullArgCommand(Opcode);

// SAFETY: the argument is always null, so the call cannot touch userspace memory
// (`IS_MUTATING = false` holds) and there is no output to extract.
unsafe impl Ioctl for NullArgCommand {
    type Output = ();

    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        self.0
    }

    fn as_ptr(&mut self) -> *mut c_void {
        core::ptr::null_mut()
    }

    unsafe fn output_from_ptr(_: IoctlOutput, _: *mut c_void) -> Result<()> {
        Ok(())
    }
}
