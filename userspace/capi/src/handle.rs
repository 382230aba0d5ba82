//! The handles that the C functions of the crate root and of `regcache` share, `pd_device`
//! and `pd_allocation`, and the checks of pointer arguments every C function makes. Below
//! both, so that neither needs the other's.

use std::sync::{Arc, Mutex, OnceLock};

use pd::cache::ExportId;
use pd::registrar::libfabric::DmaBufSource;
use pd::Device;

use crate::error::Failure;

/// The `fork` generation a handle was made in ([`pd::fork_generation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Born(u64);

impl Born {
    pub(crate) fn now() -> Self {
        Self(pd::fork_generation())
    }

    /// Whether the handle is its parent's: made before this process was forked from it.
    pub(crate) fn inherited(self) -> bool {
        self.0 != pd::fork_generation()
    }
}

/// A C handle, which knows the process it was made in.
pub(crate) trait Handle {
    fn born(&self) -> Born;
}

/// The failure of a call on a handle this process inherited across `fork`: `-ECHILD`.
pub(crate) fn inherited(function: &str, name: &str) -> Failure {
    Failure::new(
        pd::Errno::CHILD,
        format!(
            "{function}: {name} was made by the parent of this forked process; libfabric and \
             ibverbs objects and the library's threads do not survive fork: open the device \
             and make the cache and domains anew in the child"
        ),
    )
}

/// `pd_device`: an open `/dev/peerdirectN`. Allocations share it, so the file stays open until
/// the device handle is closed and every allocation made through it is freed.
pub struct PdDevice {
    pub(crate) device: Arc<Device>,
    pub(crate) born: Born,
}

impl Handle for PdDevice {
    fn born(&self) -> Born {
        self.born
    }
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
    pub(crate) source: OnceSource,
    pub(crate) born: Born,
}

impl Handle for PdAllocation {
    fn born(&self) -> Born {
        self.born
    }
}

/// What `pd_register` registers an allocation from: its export (mapped, or named by the
/// caller's address: `pd_register_dmabuf_at`) and that export's identity.
pub(crate) struct Source {
    pub(crate) source: DmaBufSource,
    pub(crate) export: ExportId,
}

/// A [`Source`] made once, on first use, and read without a lock after that: every
/// `pd_register` of an allocation reads its export, from any number of threads at once, and a
/// hit must not write a line the others read (no lock, no reference count).
#[derive(Default)]
pub(crate) struct OnceSource {
    source: OnceLock<Source>,
    /// Held while the source is made, so that two first calls make one export.
    making: Mutex<()>,
}

impl OnceSource {
    /// The source, made by `make` if this is the first call (or the first calls failed).
    pub(crate) fn get_or_make(
        &self,
        make: impl FnOnce() -> Result<Source, Failure>,
    ) -> Result<&Source, Failure> {
        if let Some(source) = self.source.get() {
            return Ok(source);
        }
        let _making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(source) = self.source.get() {
            return Ok(source);
        }
        let source = make()?;
        // Only calls holding `making` set it, and it was empty when this one took it.
        Ok(self.source.get_or_init(|| source))
    }
}

/// Converts a C handle argument, refusing NULL and a handle inherited across `fork`.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` that nothing mutates for `'a`.
pub(crate) unsafe fn arg<'a, T: Handle>(
    function: &str,
    name: &str,
    ptr: *const T,
) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises `ptr` is NULL (refused by `as_ref`) or valid for `'a`.
    let handle = unsafe { ptr.as_ref() }.ok_or_else(|| Failure::null(function, name))?;
    if handle.born().inherited() {
        return Err(inherited(function, name));
    }
    Ok(handle)
}

/// Takes back a handle `Box::into_raw` made, to release it; a handle inherited across `fork`
/// is left alone instead (its parent's objects must not be closed from the child), with
/// `-ECHILD`. `None` for NULL.
///
/// # Safety
///
/// `ptr` is NULL or a pointer from `Box::into_raw` not released yet; it is not used after.
pub(crate) unsafe fn take<T: Handle>(
    function: &str,
    name: &str,
    ptr: *mut T,
) -> Result<Option<Box<T>>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL; the caller promises a live handle, not used by anything else now.
    if unsafe { &*ptr }.born().inherited() {
        return Err(inherited(function, name));
    }
    // SAFETY: the caller hands back a pointer from `Box::into_raw`, once.
    Ok(Some(unsafe { Box::from_raw(ptr) }))
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
