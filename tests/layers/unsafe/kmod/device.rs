pub(crate) fn read() -> u32 {
    // SAFETY: this is the violation.
    unsafe { kernel::bindings::readl() }
}
