//! In the floor, so that only the raw pointer rule speaks.
use kernel::bindings;

/// Exempt by name (ADDRESS_ONLY in scripts/layers) as reading only the pointer's address, but
/// it dereferences it.
fn from_err_ptr<T>(ptr: *mut T) -> Result<T, i32> {
    // SAFETY: none.
    Ok(unsafe { ptr.read() })
}
