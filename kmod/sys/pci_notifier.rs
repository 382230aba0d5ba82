// SPDX-License-Identifier: GPL-2.0

//! The notifier of `helpers/pci_notifier.c` on the PCI bus, registered while a
//! [`PciGeneration`] lives: it tells a [`PciBusEvents`], which the crate root implements, of
//! devices added and deleted; the C side is given the trampoline of that implementation at
//! registration. It never waits: whatever it calls runs under the bus's notifier lock, which
//! every device add, delete, bind and unbind on the host takes.

use super::raw;
use core::marker::PhantomData;
use kernel::{bindings, prelude::*};

/// What the PCI bus notifier tells the module. A device is named by an address, only to
/// compare with one the module kept; it is never turned back into a pointer.
pub(crate) trait PciBusEvents {
    /// The PCI device whose `struct device` is at `device` was added or is being deleted
    /// (before a deleted device can be freed). Must not sleep for long.
    fn device_changed(device: usize);
}

/// The callbacks of a [`PciBusEvents`] as the C notifier calls them.
struct Events<H>(PhantomData<H>);

impl<H: PciBusEvents> Events<H> {
    const TABLE: raw::PciEvents = raw::PciEvents {
        device_changed: Some(device_changed::<H>),
    };

    /// The table, for the whole life of the module.
    const fn table() -> &'static raw::PciEvents {
        &Self::TABLE
    }
}

/// Called by pci_notifier.c's PCI bus notifier for each PCI device added or deleted, with its
/// `struct device`, before a deleted device can be freed.
extern "C" fn device_changed<H: PciBusEvents>(dev: *mut bindings::device) {
    // Only the address is used: it names the device.
    H::device_changed(dev as usize);
}

/// Tells its [`PciBusEvents`] of every PCI device added or deleted while registered.
pub(crate) struct PciGeneration(());

impl PciGeneration {
    /// Registers the notifier, telling `H`; only the module initializer makes one.
    pub(crate) fn register<H: PciBusEvents>() -> Result<Self> {
        // SAFETY: registers pci_notifier.c's static notifier block, once (the only caller is the
        // module initializer), unregistered in `drop`; the callbacks it is given are static.
        kernel::error::to_result(unsafe {
            raw::peerdirect_pci_generation_register(Events::<H>::table())
        })?;
        Ok(Self(()))
    }
}

impl Drop for PciGeneration {
    fn drop(&mut self) {
        // SAFETY: registered by `register`; `bus_unregister_notifier` returns once no
        // notification is running, so none reaches the module after this.
        unsafe { raw::peerdirect_pci_generation_unregister() }
    }
}
