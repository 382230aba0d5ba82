// SPDX-License-Identifier: GPL-2.0

//! The HBM devices peerdirect knows by ID, and which BAR holds each one's HBM: Habana Gaudi
//! (the driver's ID table, and a companion's default BAR) and the stand-ins bound only through
//! `driver_override`.

use crate::sys;
use kernel::pci;

/// The BAR that holds a device's HBM.
#[derive(Clone, Copy)]
pub(crate) struct HbmBar(pub(crate) u32);

const PCI_VENDOR_ID_HABANALABS: u32 = 0x1da3;

/// A Habana device ID; `pci::Vendor` has no constant for Habana and no public constructor.
pub(crate) const fn habana(device: u32) -> pci::DeviceId {
    sys::pci::device_id(PCI_VENDOR_ID_HABANALABS, device)
}

/// Habana devices and their HBM BAR: Gaudi, Gaudi (secured) and Gaudi2 expose their HBM
/// through BAR 4 (`HBM_BAR_ID` / `DRAM_BAR_ID` in habanalabs). The driver's ID table and the
/// companion default both come from here.
pub(crate) const GAUDI: [(u32, u32); 3] = [(0x1000, 4), (0x1010, 4), (0x1020, 4)];

/// Devices bound only through `driver_override`: (vendor, device, HBM BAR).
const OVERRIDE_ONLY: [(u16, u16, u32); 1] = [
    // QEMU ivshmem-plain: BAR2 is the shared memory backend.
    (0x1af4, 0x1110, 2),
];

/// The HBM BAR of a device in the ID table (Gaudi), for a companion whose BAR is not given.
pub(crate) fn table_hbm_bar(pdev: &pci::Device) -> Option<u32> {
    if u32::from(pdev.vendor_id().as_raw()) != PCI_VENDOR_ID_HABANALABS {
        return None;
    }
    GAUDI
        .iter()
        .find(|&&(d, _)| d == u32::from(pdev.device_id()))
        .map(|&(_, bar)| bar)
}

/// The HBM BAR of a device bound through `driver_override`, if it is one peerdirect knows.
pub(crate) fn override_hbm_bar(pdev: &pci::Device) -> Option<u32> {
    let vendor = pdev.vendor_id().as_raw();
    OVERRIDE_ONLY
        .iter()
        .find(|&&(v, d, _)| v == vendor && d == pdev.device_id())
        .map(|&(_, _, bar)| bar)
}
