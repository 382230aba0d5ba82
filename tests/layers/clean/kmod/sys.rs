//! The floor: `unsafe` and `bindings` are allowed here. A comment naming crate::device
//! is no dependency, nor is "crate::device::Device" in a string, nor r#"crate::device"#.
pub(crate) mod pci;

pub(crate) fn init() {
    let _quote = '"';
    let _s = "crate::device::Device \" crate::device";
    // SAFETY: nothing.
    unsafe { kernel::bindings::init() };
}
