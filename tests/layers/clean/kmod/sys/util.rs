/// The kernel's `IS_ERR()` and `PTR_ERR()`: only the pointer's address is read, so it is
/// safe (ADDRESS_ONLY in scripts/layers).
fn from_err_ptr<T>(ptr: *mut T) -> Result<core::ptr::NonNull<T>, i32> {
    let value = ptr.addr() as isize;
    if value < 0 && value >= -4095 {
        return Err(value as i32);
    }
    core::ptr::NonNull::new(ptr).ok_or(-12)
}
