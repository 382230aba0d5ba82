use kernel::bindings;

pub(crate) struct Pci(*mut bindings::pci_dev);

unsafe extern "C" {
    safe fn peerdirect_pci_count() -> u32;
    fn peerdirect_pci_lock(pdev: *mut bindings::pci_dev);
}

impl Pci {
    pub(crate) fn read(&self) -> u32 {
        // SAFETY: nothing.
        unsafe { super::super::sys::read_raw(self.0) }
    }

    /// # Safety
    ///
    /// `self`'s device is valid, and stays locked while the guard lives.
    pub(crate) unsafe fn lock_with<T, F: FnOnce(*mut bindings::pci_dev) -> T>(&self,
                                                                            also: *const u8,
                                                                            f: F) -> T {
        // SAFETY: the caller's contract.
        unsafe { peerdirect_pci_lock(self.0) };
        f(self.0)
    }
}
