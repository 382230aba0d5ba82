//! The ioctls themselves: the only place in the crate (with its child [`dma_buf`]) that issues
//! system calls with raw pointers. Everything here is safe to call; each `unsafe` block says why.

#![allow(unsafe_code)]

pub(crate) mod dma_buf;
pub(crate) mod fork;
pub(crate) mod status;

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

use rustix::io::Result;
use rustix::ioctl::{ioctl, Ioctl, IoctlOutput, Opcode};

use crate::uapi::{
    self, peerdirect_alloc, peerdirect_companion, peerdirect_export, peerdirect_export_range,
    peerdirect_free, peerdirect_info, peerdirect_p2p, PEERDIRECT_IOC_ALLOC,
    PEERDIRECT_IOC_COMPANION_ADD, PEERDIRECT_IOC_COMPANION_REMOVE,
    PEERDIRECT_IOC_COMPANION_RESET_DONE, PEERDIRECT_IOC_COMPANION_RESET_PREPARE,
    PEERDIRECT_IOC_EXPORT, PEERDIRECT_IOC_EXPORT_RANGE, PEERDIRECT_IOC_FREE, PEERDIRECT_IOC_INFO,
    PEERDIRECT_IOC_P2P,
};

/// A command's argument as it goes to the kernel: the command's struct, then bytes that stand
/// for the fields of newer versions of it.
///
/// # Safety
///
/// Implementors are `repr(C)`: first the struct that `OPCODE` takes a pointer to (plain
/// integers, starting with its `__u32 size`), then only bytes. [`RawRequest::size`] returns
/// that `size` field.
pub(crate) unsafe trait RawRequest {
    /// The ioctl request.
    const OPCODE: Opcode;

    /// The bytes the kernel may access: the struct and the bytes after it (padding excluded).
    const CAPACITY: usize;

    /// The `size` field: how many bytes the caller says the struct has.
    fn size(&self) -> u32;
}

/// Defines `$name<TAIL>`: a command's struct (field `$field`) sent as is, followed by `TAIL`
/// bytes, and its [`RawRequest`] implementation.
macro_rules! raw_request {
    ($(#[$doc:meta])* $name:ident { $field:ident: $ty:ident }, $opcode:expr, $size_ver0:expr) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy)]
        pub struct $name<const TAIL: usize> {
            /// The struct as this crate knows it.
            pub $field: $ty,
            /// Bytes right after the struct; the kernel reads them when `size` covers them.
            pub tail: [u8; TAIL],
        }

        impl<const TAIL: usize> $name<TAIL> {
            /// The bytes the kernel may access: the struct and the tail.
            pub const CAPACITY: usize = size_of::<$ty>() + TAIL;

            /// A well-formed request: `size` is the struct's, everything else zero.
            pub fn new() -> Self {
                Self {
                    $field: $ty {
                        size: $size_ver0,
                        ..Default::default()
                    },
                    tail: [0; TAIL],
                }
            }
        }

        impl<const TAIL: usize> Default for $name<TAIL> {
            fn default() -> Self {
                Self::new()
            }
        }

        // SAFETY: `repr(C)` with the struct `$opcode` takes first and a byte array after it;
        // `size` returns the struct's `size` field.
        unsafe impl<const TAIL: usize> RawRequest for $name<TAIL> {
            const OPCODE: Opcode = $opcode;
            const CAPACITY: usize = size_of::<$ty>() + TAIL;

            fn size(&self) -> u32 {
                // The tail must start where the kernel looks for the bytes it does not know.
                const { assert!(offset_of!($name<TAIL>, tail) == size_of::<$ty>()) };
                self.$field.size
            }
        }
    };
}

raw_request!(
    /// A `PEERDIRECT_IOC_INFO` argument under the caller's full control: the struct, sent as
    /// is (`size`, `flags` and the `__reserved*` fields included), followed by `TAIL` more bytes
    /// that stand for the fields of a newer version of the struct.
    ///
    /// Meant for exercising the module's argument checks; [`crate::Device::info`] is the normal
    /// way.
    RawInfo { info: peerdirect_info },
    PEERDIRECT_IOC_INFO,
    uapi::PEERDIRECT_INFO_SIZE_VER1
);

raw_request!(
    /// A `PEERDIRECT_IOC_ALLOC` argument under the caller's full control, like [`RawInfo`].
    /// [`crate::Device::alloc`] is the normal way.
    RawAlloc { alloc: peerdirect_alloc },
    PEERDIRECT_IOC_ALLOC,
    uapi::PEERDIRECT_ALLOC_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_FREE` argument under the caller's full control, like [`RawInfo`].
    /// [`crate::Allocation::free`] is the normal way.
    RawFree { free: peerdirect_free },
    PEERDIRECT_IOC_FREE,
    uapi::PEERDIRECT_FREE_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_EXPORT` argument under the caller's full control, like [`RawInfo`].
    /// [`crate::Allocation::export`] is the normal way.
    RawExport { export: peerdirect_export },
    PEERDIRECT_IOC_EXPORT,
    uapi::PEERDIRECT_EXPORT_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_P2P` argument under the caller's full control, like [`RawInfo`].
    /// [`crate::Device::p2p`] is the normal way.
    RawP2p { p2p: peerdirect_p2p },
    PEERDIRECT_IOC_P2P,
    uapi::PEERDIRECT_P2P_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_EXPORT_RANGE` argument under the caller's full control, like
    /// [`RawInfo`]. [`crate::Device::export_range`] is the normal way.
    RawExportRange { export: peerdirect_export_range },
    PEERDIRECT_IOC_EXPORT_RANGE,
    uapi::PEERDIRECT_EXPORT_RANGE_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_COMPANION_ADD` argument under the caller's full control, like
    /// [`RawInfo`]. [`crate::Control::add_companion`] is the normal way.
    RawCompanionAdd { companion: peerdirect_companion },
    PEERDIRECT_IOC_COMPANION_ADD,
    uapi::PEERDIRECT_COMPANION_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_COMPANION_REMOVE` argument under the caller's full control, like
    /// [`RawInfo`]. [`crate::Control::remove_companion`] is the normal way.
    RawCompanionRemove { companion: peerdirect_companion },
    PEERDIRECT_IOC_COMPANION_REMOVE,
    uapi::PEERDIRECT_COMPANION_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_COMPANION_RESET_PREPARE` argument under the caller's full control,
    /// like [`RawInfo`]. [`crate::Control::companion_reset_prepare`] is the normal way.
    RawCompanionResetPrepare { companion: peerdirect_companion },
    PEERDIRECT_IOC_COMPANION_RESET_PREPARE,
    uapi::PEERDIRECT_COMPANION_SIZE_VER0
);

raw_request!(
    /// A `PEERDIRECT_IOC_COMPANION_RESET_DONE` argument under the caller's full control, like
    /// [`RawInfo`]. [`crate::Control::companion_reset_done`] is the normal way.
    RawCompanionResetDone { companion: peerdirect_companion },
    PEERDIRECT_IOC_COMPANION_RESET_DONE,
    uapi::PEERDIRECT_COMPANION_SIZE_VER0
);

/// Sends `raw` with its command and leaves in it what the kernel wrote back.
///
/// # Panics
///
/// If `raw.size()` exceeds `R::CAPACITY`: the kernel would access memory past `raw`.
/// [`crate::Device`]'s `*_raw` methods refuse such requests before getting here.
pub(crate) fn send<R: RawRequest>(fd: BorrowedFd<'_>, raw: &mut R) -> Result<()> {
    assert!(raw.size() as usize <= R::CAPACITY);
    // Every peerdirect command takes a pointer to its struct, possibly followed by the fields
    // of newer versions: the kernel reads `size` first, refuses sizes below the first
    // version, then reads `size` bytes and writes back at most min(`size`, its sizeof) bytes.
    // `R` is that struct followed by bytes (the `RawRequest` contract), and `size` does not
    // reach past them (asserted above). `Request` borrows `raw` mutably for the call.
    // SAFETY: so every access stays inside `raw`, the write-back aliases nothing, and any
    // bytes the kernel writes are valid for plain integers.
    unsafe { ioctl(fd, Request(raw)) }
}

/// Sends a `PEERDIRECT_IOC_EXPORT` request and takes ownership of the dma-buf fd it returns.
/// `None` when the kernel reported success with a negative fd, which only a broken module does.
pub(crate) fn export<const TAIL: usize>(
    fd: BorrowedFd<'_>,
    raw: &mut RawExport<TAIL>,
) -> Result<Option<OwnedFd>> {
    send(fd, raw)?;
    Ok(adopt_new_fd(raw.export.fd))
}

/// `PEERDIRECT_IOC_EXPORT_RANGE`: like [`export`].
pub(crate) fn export_range<const TAIL: usize>(
    fd: BorrowedFd<'_>,
    raw: &mut RawExportRange<TAIL>,
) -> Result<Option<OwnedFd>> {
    send(fd, raw)?;
    Ok(adopt_new_fd(raw.export.fd))
}

/// The dma-buf fd a successful export reported (`None` if negative).
fn adopt_new_fd(new_fd: i32) -> Option<OwnedFd> {
    if new_fd < 0 {
        return None;
    }
    // The export succeeded, so the kernel installed a new file descriptor in this process's
    // table and reported its number in `fd` (every accepted `size` covers `fd`).
    // SAFETY: nothing else in the process has seen that number: this is its only owner.
    Some(unsafe { OwnedFd::from_raw_fd(new_fd) })
}

/// The argument of [`send`]: a mutable borrow of the whole request.
struct Request<'a, R>(&'a mut R);

// SAFETY: the opcode is the one `R` is made for (the `RawRequest` contract) and the pointer is
// `R` itself, which the kernel may write (`IS_MUTATING`); the output is nothing but `R`.
unsafe impl<R: RawRequest> Ioctl for Request<'_, R> {
    type Output = ();

    const IS_MUTATING: bool = true;

    fn opcode(&self) -> Opcode {
        R::OPCODE
    }

    fn as_ptr(&mut self) -> *mut c_void {
        core::ptr::from_mut(self.0).cast()
    }

    unsafe fn output_from_ptr(_: IoctlOutput, _: *mut c_void) -> Result<()> {
        Ok(())
    }
}

/// `_IO(PEERDIRECT_IOCTL_TYPE, nr)` with a null argument.
pub(crate) fn command(fd: BorrowedFd<'_>, nr: u8) -> Result<()> {
    // A user access to address 0 fails with EFAULT (vm.mmap_min_addr: it is never mapped).
    // SAFETY: with a null argument, whatever the module makes of command `nr`, it cannot
    // read or write this process's memory.
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
