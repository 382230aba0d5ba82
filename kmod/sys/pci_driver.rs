// SPDX-License-Identifier: GPL-2.0

//! A PCI driver that hears of its devices' resets: [`ResetAware`] registers a
//! [`pci::Driver`] as the kernel crate's [`pci::Adapter`] does, with the error handlers of
//! `helpers/pci_driver.c` (the kernel crate's adapter of this kernel registers none), which
//! call the driver's [`ResetDriver`] methods with its data for the device.

use super::raw;
use core::marker::PhantomData;
use kernel::{
    bindings,
    device::CoreInternal,
    driver::{DriverLayout, RegistrationOps},
    pci,
    prelude::*,
    types::Opaque,
    ThisModule,
};

/// A PCI driver whose devices can be reset while it is bound: a function level or bus reset
/// (sysfs `reset`, vfio, a sibling's reset), or AER/DPC recovery.
pub(crate) trait ResetDriver: pci::Driver + 'static {
    /// The device `data` was bound with is about to be reset, or an error was found on it:
    /// nothing may reach its BARs until [`ResetDriver::reset_done`]. Cannot fail: the reset
    /// goes on. Called with the device lock held.
    fn reset_prepare(data: Pin<&Self::Data<'_>>);

    /// The reset (or the recovery) is over; the device works again. Not called when the
    /// device is removed instead. Called with the device lock held.
    fn reset_done(data: Pin<&Self::Data<'_>>);
}

/// Registers `T` as [`pci::Adapter<T>`] does, with error handlers that tell
/// [`ResetDriver`]: `kernel::driver::Registration<ResetAware<T>>`.
pub(crate) struct ResetAware<T>(PhantomData<T>);

impl<T: ResetDriver> ResetAware<T> {
    const EVENTS: raw::PciResetEvents = raw::PciResetEvents {
        prepare: Some(reset_prepare::<T>),
        done: Some(reset_done::<T>),
    };
}

// SAFETY: the layout is `pci::Adapter<T>`'s (the same `struct pci_driver`, with its
// `struct device_driver` at the same offset), and so is the driver data: `register` lets the
// adapter's probe store it.
unsafe impl<T: ResetDriver> DriverLayout for ResetAware<T> {
    type DriverType = bindings::pci_driver;
    type DriverData<'bound> = T::Data<'bound>;
    const DEVICE_DRIVER_OFFSET: usize = core::mem::offset_of!(bindings::pci_driver, driver);
}

// SAFETY: `register` and `unregister` are `pci::Adapter<T>`'s, which pair as the trait
// requires; the only addition is the error handler table, set before registration.
unsafe impl<T: ResetDriver> RegistrationOps for ResetAware<T> {
    unsafe fn register(
        pdrv: &Opaque<bindings::pci_driver>,
        name: &'static CStr,
        module: &'static ThisModule,
    ) -> Result {
        // The adapter's `register` below sets only the name, probe, remove and ID table, so
        // the handlers set here stay.
        // SAFETY: `pdrv` is a valid `struct pci_driver` not registered yet, which nothing else
        // writes meanwhile; the events table is a constant.
        unsafe { raw::peerdirect_pci_driver_set_reset_events(pdrv.get(), &Self::EVENTS) };
        // SAFETY: as this function's own contract: `pdrv` stays pinned and valid until
        // `unregister`.
        unsafe { <pci::Adapter<T> as RegistrationOps>::register(pdrv, name, module) }
    }

    unsafe fn unregister(pdrv: &Opaque<bindings::pci_driver>) {
        // SAFETY: registered by `register` above, through the adapter.
        unsafe { <pci::Adapter<T> as RegistrationOps>::unregister(pdrv) }
    }
}

/// The driver data of `pdev`, for an error handler.
///
/// # Safety
///
/// Called only from an error handler of a driver registered by [`ResetAware<T>`]: the PCI core
/// calls those only while that driver is bound to `pdev` (probe returned success, so
/// `pci::Adapter<T>`'s probe stored a `Pin<KBox<T::Data>>` as its driver data), and holds the
/// device lock across the call, so the data stays until it returns.
unsafe fn data<'a, T: ResetDriver>(pdev: *mut bindings::pci_dev) -> Pin<&'a T::Data<'a>> {
    // SAFETY: `pdev` is valid for the call, and its lock is held: the context the adapter's
    // own callbacks give their `Device<CoreInternal>`.
    let pdev = unsafe { &*pdev.cast::<pci::Device<CoreInternal<'a>>>() };
    // SAFETY: the adapter's probe stored a `Pin<KBox<T::Data>>` with `set_drvdata`, and the
    // device is bound until the lock is released (this function's contract).
    unsafe { pdev.as_ref().drvdata_borrow::<T::Data<'a>>() }
}

/// # Safety
///
/// Only `helpers/pci_driver.c`'s error handlers call it, for a device bound to `T`, with its
/// lock held.
unsafe extern "C" fn reset_prepare<T: ResetDriver>(pdev: *mut bindings::pci_dev) {
    // SAFETY: called from an error handler of `T`'s registration (this function's contract).
    T::reset_prepare(unsafe { data::<T>(pdev) });
}

/// # Safety
///
/// As [`reset_prepare`].
unsafe extern "C" fn reset_done<T: ResetDriver>(pdev: *mut bindings::pci_dev) {
    // SAFETY: called from an error handler of `T`'s registration (this function's contract).
    T::reset_done(unsafe { data::<T>(pdev) });
}
