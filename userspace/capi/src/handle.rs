//! The handles that the C functions of the crate root and of `regcache` share, `pd_device`
//! and `pd_allocation`, and the checks of pointer arguments every C function makes. Below
//! both, so that neither needs the other's.

use std::sync::{Arc, Mutex};

use pd::cache::ExportId;
use pd::registrar::libfabric::DmaBufSource;
use pd::Device;

use crate::error::Failure;

/// `pd_device`: an open `/dev/peerdirectN`. Allocations share it, so the file stays open until
/// the device handle is closed and every allocation made through it is freed.
pub struct PdDevice {
    pub(crate) device: Arc<Device>,
}

/// `pd_allocation`: HBM allocated through a `pd_device`, freed by `pd_allocation_free`.
///
/// The crate's `Allocation` borrows its `Device`, which a C handle cannot express; this keeps
/// the device alive instead and names the allocation by its handle, issuing the same
/// FREE and EXPORT commands as `Allocation` does.
pub struct PdAllocation {
    pub(crate) device: Arc<Device>,
    pub(crate) handle: u32,
    pub(crate) hbm_offset: u64,
    pub(crate) length: u64,
    /// The export `pd_register` registers from, made (and mapped) on its first call. Closed
    /// when the handle is freed, after the device has invalidated its cache entries.
    pub(crate) source: Mutex<Option<Arc<Source>>>,
}

/// What `pd_register` registers an allocation from: its export (mapped, or named by the
/// caller's address: `pd_register_dmabuf_at`) and that export's identity.
pub(crate) struct Source {
    pub(crate) source: DmaBufSource,
    pub(crate) export: ExportId,
}

/// Converts a C reference argument, refusing NULL.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` that nothing mutates for `'a`.
pub(crate) unsafe fn arg<'a, T>(
    function: &str,
    name: &str,
    ptr: *const T,
) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises `ptr` is NULL (refused by `as_ref`) or valid for `'a`.
    unsafe { ptr.as_ref() }.ok_or_else(|| Failure::null(function, name))
}

/// Writes an output argument, refusing NULL.
///
/// # Safety
///
/// `ptr` is NULL or valid for writing a `T` (alignment included).
pub(crate) unsafe fn put<T>(
    function: &str,
    name: &str,
    ptr: *mut T,
    value: T,
) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::null(function, name));
    }
    // SAFETY: not NULL, and the caller promises it is valid and aligned for a `T`. `write`
    // does not drop the old contents, which may be uninitialized.
    unsafe { ptr.write(value) };
    Ok(())
}
