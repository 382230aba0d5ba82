// SPDX-License-Identifier: GPL-2.0

//! Small helpers of the floor.

use core::ptr::NonNull;
use kernel::{bindings, ffi::c_int, prelude::*};

/// The kernel's `IS_ERR()` and `PTR_ERR()` of `ptr`, read here rather than through the two
/// calls `kernel::error::from_err_ptr` makes (map and unmap are hot paths); `ENOMEM` for NULL.
pub(super) fn from_err_ptr<T>(ptr: *mut T) -> Result<NonNull<T>> {
    // An error pointer is the errno's two's complement: the last `MAX_ERRNO` addresses.
    let value = ptr.addr() as isize;
    if value < 0 && value >= -(bindings::MAX_ERRNO as isize) {
        // In [-MAX_ERRNO, -1], so it fits.
        return Err(Error::from_errno(value as c_int));
    }
    NonNull::new(ptr).ok_or(ENOMEM)
}
