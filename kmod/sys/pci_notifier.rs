// SPDX-License-Identifier: GPL-2.0

//! The two notifiers of `helpers/pci_notifier.c` on the PCI bus, each registered while a value
//! of this file lives: [`PciGeneration`] for devices added and deleted, [`PciBusNotifier`] for
//! drivers bound and unbinding. Both dispatch to a [`PciBusEvents`], which the crate root
//! implements; the C side is given the trampolines of that implementation at registration.

use super::{
    pci::{driver_name, DriverName},
    raw,
};
use core::marker::PhantomData;
use kernel::{bindings, prelude::*};

/// What the PCI bus notifiers tell the module. A device is named by an address, only to
/// compare with one the module kept; it is never turned back into a pointer.
pub(crate) trait PciBusEvents {
    /// The PCI device whose `struct device` is at `device` was added or is being deleted
    /// (before a deleted device can be freed). [`PciGeneration`] calls it.
    fn device_changed(device: usize);

    /// The driver of the PCI device `key` ([`super::pci::pci_dev_key`]) is about to unbind
    /// (before its `remove()`, with the device lock held, so its BARs are still there), or the
    /// device is being deleted. [`PciBusNotifier`] calls it.
    fn driver_unbinding_or_gone(key: usize);

    /// The driver named `driver` was bound to the PCI device `key`
    /// ([`super::pci::pci_dev_key`]). [`PciBusNotifier`] calls it, with the device lock held.
    fn driver_bound(key: usize, driver: DriverName);
}

/// The callbacks of a [`PciBusEvents`] as the C notifiers call them.
struct Events<H>(PhantomData<H>);

impl<H: PciBusEvents> Events<H> {
    const TABLE: raw::PciEvents = raw::PciEvents {
        device_changed: Some(device_changed::<H>),
        driver_unbinding_or_gone: Some(driver_unbinding_or_gone::<H>),
        driver_bound: Some(driver_bound::<H>),
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

/// Called by pci_notifier.c's PCI bus notifier when `pdev`'s driver is about to unbind or `pdev` is
/// being deleted.
///
/// # Safety
///
/// Only the notifier calls it, with a valid `pdev` the driver core holds for the call.
unsafe extern "C" fn driver_unbinding_or_gone<H: PciBusEvents>(pdev: *mut bindings::pci_dev) {
    H::driver_unbinding_or_gone(pdev as usize);
}

/// Called by pci_notifier.c's PCI bus notifier once a driver is bound to `pdev`.
///
/// # Safety
///
/// Only the notifier calls it, with a valid `pdev` the driver core holds, and whose device
/// lock it holds, for the call.
unsafe extern "C" fn driver_bound<H: PciBusEvents>(pdev: *mut bindings::pci_dev) {
    // SAFETY: `pdev` is valid and its lock held for the notification, as the function's
    // contract says.
    let name = unsafe { driver_name(pdev) };
    H::driver_bound(pdev as usize, name);
}

/// peerdirect's notifier on the PCI bus (pci_notifier.c), registered while this value lives: it
/// tells its [`PciBusEvents`] when a device's driver is bound or unbinds, or the device goes
/// away.
pub(crate) struct PciBusNotifier(());

impl PciBusNotifier {
    /// Registers the notifier, telling `H`; only the module initializer makes one.
    pub(crate) fn register<H: PciBusEvents>() -> Result<Self> {
        // SAFETY: registers pci_notifier.c's static notifier block, once (the only caller is the
        // module initializer), unregistered in `drop`; the callbacks it is given are static.
        kernel::error::to_result(unsafe {
            raw::peerdirect_pci_notifier_register(Events::<H>::table())
        })?;
        Ok(Self(()))
    }
}

impl Drop for PciBusNotifier {
    fn drop(&mut self) {
        // SAFETY: registered by `register`; `bus_unregister_notifier` returns once no
        // notification is running, so none reaches the module after this.
        unsafe { raw::peerdirect_pci_notifier_unregister() }
    }
}

/// Tells its [`PciBusEvents`] of every PCI device added or deleted while registered (a second
/// PCI bus notifier in pci_notifier.c, through [`PciBusEvents::device_changed`]).
pub(crate) struct PciGeneration(());

impl PciGeneration {
    /// Registers the counting notifier, telling `H`; only the module initializer makes one.
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
        // SAFETY: registered by `register`.
        unsafe { raw::peerdirect_pci_generation_unregister() }
    }
}
