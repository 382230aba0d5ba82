//! The C ABI of peerdirect: `libpeerdirect.so` with `include/peerdirect.h`, for C and C++
//! runtimes. Every function is a thin wrapper over the `peerdirect` crate.
//!
//! Conventions, as the header documents them: handles are opaque pointers owned by the
//! caller; functions return 0 or a negative errno and leave a message (with what to do about
//! it) for `pd_last_error`; NULL handles and output pointers are refused with `-EINVAL`; no
//! panic crosses into C.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Nothing here may panic on purpose: every C function also runs inside `error::guard`, so that
// a panic from below (a bug) becomes -EIO and a message instead of unwinding into C; the test
// `every_c_function_runs_inside_the_guard` checks that.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::unreachable,
        clippy::todo,
        clippy::unimplemented,
        clippy::indexing_slicing
    )
)]

mod abi;
mod addresses;
mod callback;
mod error;
mod handle;
mod regcache;
mod registrar;

use std::ffi::{c_char, c_int, c_uint, CStr, OsStr};
use std::os::fd::{IntoRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use pd::{Control, Device, Errno, ExportFlags, PciAddress, RawExport, RawFree, Stats};

pub use abi::{FidDomain, FidEp, PdDeviceInfo, PdRegcacheStats, PdStats};
use error::{guard_status, handle_guard, shield, Failure};
use handle::{arg, put, take, Born};
pub use handle::{PdAllocation, PdDevice};
pub use regcache::{PdMr, PdRegCache};

/// Opens the device node at `path`, storing the status in `err` (if not NULL).
///
/// # Safety
///
/// `err` is NULL or valid for writing an `int`.
unsafe fn open(
    function: &str,
    err: *mut c_int,
    open: impl FnOnce() -> Result<Device, Failure>,
) -> *mut PdDevice {
    // SAFETY: `err` is passed on under the same contract.
    unsafe {
        handle_guard(function, err, || {
            let device = open()?;
            Ok(Box::into_raw(Box::new(PdDevice {
                device: Arc::new(device),
                born: Born::now(),
            })))
        })
    }
}

/// `pd_device *pd_device_open(unsigned index, int *err)`: opens `/dev/peerdirect<index>`.
///
/// # Safety
///
/// `err` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_device_open(index: c_uint, err: *mut c_int) -> *mut PdDevice {
    // SAFETY: `err` is passed on under the same contract.
    unsafe {
        open("pd_device_open", err, || {
            Device::open_index(index).map_err(Failure::from)
        })
    }
}

/// `pd_device *pd_device_open_path(const char *path, int *err)`: opens the device node at
/// `path`.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string; `err` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_device_open_path(
    path: *const c_char,
    err: *mut c_int,
) -> *mut PdDevice {
    const F: &str = "pd_device_open_path";
    let open_path = || {
        if path.is_null() {
            return Err(Failure::null(F, "path"));
        }
        // SAFETY: not NULL, and the caller promises a NUL-terminated string; it is only read
        // during this call.
        let path = unsafe { CStr::from_ptr(path) };
        // Paths are bytes on Linux: no decoding.
        Device::open(OsStr::from_bytes(path.to_bytes())).map_err(Failure::from)
    };
    // SAFETY: `err` is passed on under the same contract.
    unsafe { open(F, err, open_path) }
}

/// `void pd_device_close(pd_device *dev)`: closes the handle (NULL is ignored).
///
/// # Safety
///
/// `dev` is NULL or a handle from `pd_device_open*` not closed yet; it is not used after.
#[no_mangle]
pub unsafe extern "C" fn pd_device_close(dev: *mut PdDevice) {
    const F: &str = "pd_device_close";
    guard_status(F, || {
        // SAFETY: the caller hands back a pointer from `Box::into_raw` in `open`, once.
        drop(unsafe { take(F, "dev", dev) }?);
        Ok(())
    });
}

/// `int pd_device_info(const pd_device *dev, struct pd_device_info *info)`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `info` is NULL or valid for writing the struct.
#[no_mangle]
pub unsafe extern "C" fn pd_device_info(dev: *const PdDevice, info: *mut PdDeviceInfo) -> c_int {
    const F: &str = "pd_device_info";
    guard_status(F, || {
        // SAFETY: the caller promises `dev` is NULL or a live handle.
        let dev = unsafe { arg(F, "dev", dev) }?;
        if info.is_null() {
            return Err(Failure::null(F, "info"));
        }
        let value = PdDeviceInfo::from(&dev.device.info()?);
        // SAFETY: the caller promises `info` is NULL (refused) or valid for writing.
        unsafe { put(F, "info", info, value) }
    })
}

/// `int pd_alloc(pd_device *dev, uint64_t length, uint64_t align, pd_allocation **out)`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pd_alloc(
    dev: *mut PdDevice,
    length: u64,
    align: u64,
    out: *mut *mut PdAllocation,
) -> c_int {
    const F: &str = "pd_alloc";
    guard_status(F, || {
        // SAFETY: the caller promises `dev` is NULL or a live handle.
        let dev = unsafe { arg(F, "dev", dev) }?;
        if out.is_null() {
            return Err(Failure::null(F, "out"));
        }
        let allocation = dev.device.alloc(length, (align != 0).then_some(align))?;
        let (hbm_offset, length) = (allocation.hbm_offset(), allocation.length());
        let allocation = Box::new(PdAllocation {
            device: Arc::clone(&dev.device),
            handle: allocation.into_handle(),
            hbm_offset,
            length,
            source: Default::default(),
            born: Born::now(),
        });
        // SAFETY: `out` is not NULL, and the caller promises it is valid for writing.
        unsafe { put(F, "out", out, Box::into_raw(allocation)) }
    })
}

/// `int pd_allocation_free(pd_allocation *alloc)`: frees the HBM and the handle (NULL: 0).
/// The handle is gone even when freeing fails. Before the FREE command, the device drops the
/// cache entries of every `pd_regcache` that registered the allocation.
///
/// # Safety
///
/// `alloc` is NULL or a handle from `pd_alloc` not freed yet; it is not used after.
#[no_mangle]
pub unsafe extern "C" fn pd_allocation_free(alloc: *mut PdAllocation) -> c_int {
    const F: &str = "pd_allocation_free";
    guard_status(F, || {
        // SAFETY: the caller hands back a pointer from `Box::into_raw` in `pd_alloc`, once.
        let Some(alloc) = unsafe { take(F, "alloc", alloc) }? else {
            return Ok(());
        };
        let mut raw = RawFree::<0>::new();
        raw.free.handle = alloc.handle;
        // The handle (and its export, after the caches let go) drops here, inside the guard.
        alloc.device.free_raw(&mut raw).map_err(Failure::from)
    })
}

/// `uint64_t pd_allocation_length(const pd_allocation *alloc)` (0 for NULL).
///
/// # Safety
///
/// `alloc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_allocation_length(alloc: *const PdAllocation) -> u64 {
    shield("pd_allocation_length", 0, || {
        // SAFETY: the caller promises NULL or a live handle.
        unsafe { alloc.as_ref() }.map_or(0, |a| a.length)
    })
}

/// `uint64_t pd_allocation_hbm_offset(const pd_allocation *alloc)` (0 for NULL).
///
/// # Safety
///
/// `alloc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_allocation_hbm_offset(alloc: *const PdAllocation) -> u64 {
    shield("pd_allocation_hbm_offset", 0, || {
        // SAFETY: the caller promises NULL or a live handle.
        unsafe { alloc.as_ref() }.map_or(0, |a| a.hbm_offset)
    })
}

/// `uint32_t pd_allocation_handle(const pd_allocation *alloc)` (0 for NULL).
///
/// # Safety
///
/// `alloc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_allocation_handle(alloc: *const PdAllocation) -> u32 {
    shield("pd_allocation_handle", 0, || {
        // SAFETY: the caller promises NULL or a live handle.
        unsafe { alloc.as_ref() }.map_or(0, |a| a.handle)
    })
}

/// `int pd_export(const pd_allocation *alloc, uint64_t offset, uint64_t length,
/// uint32_t flags, int *fd_out)`: a dma-buf of the range, owned by the caller.
///
/// # Safety
///
/// `alloc` is NULL or a live handle; `fd_out` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_export(
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    flags: u32,
    fd_out: *mut c_int,
) -> c_int {
    const F: &str = "pd_export";
    guard_status(F, || {
        // SAFETY: the caller promises `alloc` is NULL or a live handle.
        let alloc = unsafe { arg(F, "alloc", alloc) }?;
        if fd_out.is_null() {
            return Err(Failure::null(F, "fd_out"));
        }
        let flags = export_flags(F, flags)?;
        let mut raw = RawExport::<0>::new();
        raw.export.handle = alloc.handle;
        raw.export.offset = offset;
        raw.export.length = length;
        raw.export.flags = flags.bits();
        let dma_buf = alloc.device.export_raw(&mut raw)?;
        let fd = OwnedFd::from(dma_buf).into_raw_fd();
        // SAFETY: `fd_out` is not NULL, and the caller promises it is valid for writing.
        unsafe { put(F, "fd_out", fd_out, fd) }
    })
}

/// `int pd_export_range(const pd_device *dev, uint64_t bar_offset, uint64_t length,
/// uint32_t flags, int *fd_out)`: a dma-buf of bytes `[bar_offset, bar_offset + length)` of a
/// companion device's BAR (`PEERDIRECT_IOC_EXPORT_RANGE`), owned by the caller. Memory the
/// device's owner allocated, which the caller vouches for: it needs `CAP_SYS_ADMIN`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `fd_out` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_export_range(
    dev: *const PdDevice,
    bar_offset: u64,
    length: u64,
    flags: u32,
    fd_out: *mut c_int,
) -> c_int {
    const F: &str = "pd_export_range";
    guard_status(F, || {
        // SAFETY: the caller promises `dev` is NULL or a live handle.
        let dev = unsafe { arg(F, "dev", dev) }?;
        if fd_out.is_null() {
            return Err(Failure::null(F, "fd_out"));
        }
        let flags = export_flags(F, flags)?;
        let dma_buf = dev.device.export_range(bar_offset, length, flags)?;
        let fd = OwnedFd::from(dma_buf).into_raw_fd();
        // SAFETY: `fd_out` is not NULL, and the caller promises it is valid for writing.
        unsafe { put(F, "fd_out", fd_out, fd) }
    })
}

/// The `PD_EXPORT_*` flags of `function`; any other bit is `-EINVAL` here, since the
/// module's `EOPNOTSUPP` for it would come with the hint for a device that cannot export.
fn export_flags(function: &str, flags: u32) -> Result<ExportFlags, Failure> {
    let unknown = flags & !(abi::PD_EXPORT_CLOEXEC | abi::PD_EXPORT_RDWR);
    if unknown != 0 {
        return Err(Failure::new(
            Errno::INVAL,
            format!("{function}: unknown flags {unknown:#x}; only PD_EXPORT_CLOEXEC and PD_EXPORT_RDWR exist"),
        ));
    }
    Ok(ExportFlags::from_bits_truncate(flags))
}

/// `int pd_stats(unsigned index, struct pd_stats *out)`: the module's counters for
/// `/dev/peerdirect<index>`, from debugfs.
///
/// # Safety
///
/// `out` is NULL or valid for writing the struct.
#[no_mangle]
pub unsafe extern "C" fn pd_stats(index: c_uint, out: *mut PdStats) -> c_int {
    const F: &str = "pd_stats";
    guard_status(F, || {
        if out.is_null() {
            return Err(Failure::null(F, "out"));
        }
        let stats = PdStats::from(&Stats::read(index)?);
        // SAFETY: the caller promises `out` is NULL (refused) or valid for writing.
        unsafe { put(F, "out", out, stats) }
    })
}

/// `int pd_companion_reset_prepare(const pd_device *dev)`: tells peerdirect that the owner of
/// the companion `dev` serves is about to reset the device
/// (`PEERDIRECT_IOC_COMPANION_RESET_PREPARE` through the control device).
///
/// # Safety
///
/// `dev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_companion_reset_prepare(dev: *const PdDevice) -> c_int {
    // SAFETY: `dev` is passed on under the same contract.
    unsafe {
        companion_reset(
            "pd_companion_reset_prepare",
            dev,
            Control::companion_reset_prepare,
        )
    }
}

/// `int pd_companion_reset_done(const pd_device *dev)`: the reset announced by
/// `pd_companion_reset_prepare` is over (`PEERDIRECT_IOC_COMPANION_RESET_DONE`).
///
/// # Safety
///
/// `dev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_companion_reset_done(dev: *const PdDevice) -> c_int {
    // SAFETY: `dev` is passed on under the same contract.
    unsafe {
        companion_reset(
            "pd_companion_reset_done",
            dev,
            Control::companion_reset_done,
        )
    }
}

/// Sends `command` for the PCI device `dev` serves, through the control device.
///
/// # Safety
///
/// `dev` is NULL or a live handle.
unsafe fn companion_reset(
    function: &str,
    dev: *const PdDevice,
    command: fn(&Control, PciAddress) -> Result<(), pd::Error>,
) -> c_int {
    guard_status(function, || {
        // SAFETY: the caller promises `dev` is NULL or a live handle.
        let dev = unsafe { arg(function, "dev", dev) }?;
        let device = dev.device.info()?.pci_address;
        command(&Control::open()?, device)?;
        Ok(())
    })
}

/// `const char *pd_last_error(void)`: the message of the last failure on this thread.
#[no_mangle]
pub extern "C" fn pd_last_error() -> *const c_char {
    shield("pd_last_error", c"".as_ptr(), error::last_error)
}

/// `const char *pd_strerror(int err)`: a static description of errno `err` (either sign).
#[no_mangle]
pub extern "C" fn pd_strerror(err: c_int) -> *const c_char {
    shield("pd_strerror", c"Unknown error".as_ptr(), || {
        error::strerror(err).as_ptr()
    })
}

/// `const char *pd_version(void)`: the library's version, e.g. "0.1.0".
#[no_mangle]
pub extern "C" fn pd_version() -> *const c_char {
    const VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(version) => version,
            // A version is digits and dots; this cannot happen.
            Err(_) => c"unknown",
        };
    shield("pd_version", VERSION.as_ptr(), || VERSION.as_ptr())
}

#[cfg(test)]
mod tests;
