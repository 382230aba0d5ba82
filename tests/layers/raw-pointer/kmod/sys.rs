//! The floor: `unsafe` is allowed here, and still no safe fn takes a raw pointer.
use kernel::bindings;

pub(crate) struct Hbm;

/// Reads `dev`'s bus, trusting its callers to pass a live device: unsound, since it is safe.
pub(crate) fn bus_of(
    dev: *mut bindings::device,
) -> *const bindings::bus_type {
    // SAFETY: none: the callers vouch for `dev`, which a safe fn cannot ask of them.
    unsafe { (*dev).bus }
}

impl Hbm {
    /// A pointer inside a parameter's type is one too.
    pub(crate) fn first<'a, T: Copy>(&self,
                                     pages: &[Option<*const T>]) -> Option<T> {
        // SAFETY: none either.
        pages.first().copied().flatten().map(|p| unsafe { *p })
    }
}

mod util;
