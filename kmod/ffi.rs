// SPDX-License-Identifier: GPL-2.0

//! The module's only raw FFI: the C helpers in `helpers.c` and raw access to `struct pci_dev`.
//!
//! Everything here is wrapped once in a safe function; no other file declares `extern "C"` or
//! touches a raw pointer.

use kernel::{bindings, ffi::c_int, pci, prelude::*};

mod raw {
    use kernel::{bindings, ffi::c_int};

    // Declared in helpers.h; the signatures must match it. `improper_ctypes` fires because
    // bindgen renders a flexible array inside `struct pci_dev` as a field-less struct; only
    // pointers to it cross the boundary, never values.
    #[allow(improper_ctypes)]
    extern "C" {
        pub(super) fn peerdirect_pci_bus_address(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
        pub(super) fn peerdirect_pci_domain(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn peerdirect_pci_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn peerdirect_pci_bar_is_mem(pdev: *mut bindings::pci_dev, bar: c_int) -> bool;
    }
}

/// Number of standard BARs of a PCI function (`PCI_STD_NUM_BARS`).
const PCI_STD_NUM_BARS: u32 = 6;

/// The `struct pci_dev` behind a [`pci::Device`].
///
/// `pci::Device::as_raw()` is private in this kernel; `pci::Device` is `#[repr(transparent)]`
/// over `Opaque<bindings::pci_dev>` (plus a zero-sized context marker), so a reference to it
/// is a pointer to the C struct. The pointer is valid for as long as the reference is.
fn raw_pci_dev(pdev: &pci::Device) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// A standard BAR index, `0..PCI_STD_NUM_BARS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BarIndex(u32);

impl BarIndex {
    pub(crate) const fn new(bar: u32) -> Result<Self> {
        if bar < PCI_STD_NUM_BARS {
            Ok(Self(bar))
        } else {
            Err(EINVAL)
        }
    }

    pub(crate) const fn get(self) -> u32 {
        self.0
    }

    fn as_c_int(self) -> c_int {
        // CAST: `self.0 < PCI_STD_NUM_BARS`, which fits any `c_int`.
        self.0 as c_int
    }
}

/// The PCI bus address of `bar`: what a peer device puts on the bus to reach it.
pub(crate) fn bar_bus_address(pdev: &pci::Device, bar: BarIndex) -> u64 {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed, and `bar`
    // indexes the device's standard resources, so `pci_bus_address` reads within bounds.
    unsafe { raw::peerdirect_pci_bus_address(raw_pci_dev(pdev), bar.as_c_int()) }
}

/// Whether `bar` is a memory BAR (as opposed to I/O ports or unimplemented).
pub(crate) fn bar_is_mem(pdev: &pci::Device, bar: BarIndex) -> bool {
    // SAFETY: as in `bar_bus_address`.
    unsafe { raw::peerdirect_pci_bar_is_mem(raw_pci_dev(pdev), bar.as_c_int()) }
}

/// The PCI domain (segment) of the device.
pub(crate) fn domain(pdev: &pci::Device) -> u32 {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed, and a device
    // that the PCI core handed to a driver always has its `bus` set.
    let domain = unsafe { raw::peerdirect_pci_domain(raw_pci_dev(pdev)) };
    // CAST: PCI domains are non-negative (the C type is `int` for historical reasons).
    domain as u32
}

/// The NUMA node of the device, `None` when it has none.
pub(crate) fn numa_node(pdev: &pci::Device) -> Option<u32> {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed.
    let node = unsafe { raw::peerdirect_pci_numa_node(raw_pci_dev(pdev)) };
    u32::try_from(node).ok()
}

/// Claims `bar` for this driver until it unbinds (`pcim_request_region`, device-managed).
pub(crate) fn request_bar(pdev: &pci::Device<kernel::device::Core<'_>>, bar: BarIndex) -> Result {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed; the `Core`
    // context means we are in probe, where device-managed resources may be added. The name is
    // a static C string.
    kernel::error::to_result(unsafe {
        bindings::pcim_request_region(
            raw_pci_dev(pdev),
            bar.as_c_int(),
            c"peerdirect".as_char_ptr(),
        )
    })
}
