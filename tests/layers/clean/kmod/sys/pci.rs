pub(crate) struct Pci;

impl Pci {
    pub(crate) fn read(&self) -> u32 {
        // SAFETY: nothing.
        unsafe { super::super::sys::read_raw() }
    }
}
