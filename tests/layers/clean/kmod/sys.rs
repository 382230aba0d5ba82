//! The floor: `unsafe` and `bindings` are allowed here. A comment naming crate::device
//! is no dependency, nor is "crate::device::Device" in a string, nor r#"crate::device"#.
pub(crate) mod pci;
mod util;

use kernel::bindings;

extern "C" {
    fn peerdirect_pci_read(pdev: *mut bindings::pci_dev, offset: u32) -> u32;
}

pub(crate) fn init() {
    let _quote = '"';
    let _s = "crate::device::Device \" crate::device";
    // SAFETY: nothing.
    unsafe { kernel::bindings::init() };
}

/// The first word of `pdev`'s config space.
///
/// # Safety
///
/// `pdev` is a valid `struct pci_dev` for the call.
pub(crate) unsafe fn read_raw(
    pdev: *mut bindings::pci_dev,
) -> u32 {
    // SAFETY: `pdev` is valid (the caller's contract).
    unsafe { peerdirect_pci_read(pdev, 0) }
}

/// Called by C with each device added: only the address is used.
#[no_mangle]
extern "C" fn peerdirect_pci_changed(dev: *mut bindings::device) {
    let _ = dev as usize;
}

/// Takes callbacks that take pointers, and pointers only in a comment: no raw pointer itself.
pub(crate) fn register<'a, F: Fn(*mut u8) -> u32>(
    notify: Option<unsafe extern "C" fn(*mut bindings::device) -> *mut u8>,
    each: fn(*const u8, usize),
    visit: &'a dyn Fn(*mut u8),
    count: F, /* not a *mut u8 */
) -> *mut u8 {
    let _ = (notify, each, visit, count);
    core::ptr::null_mut()
}
