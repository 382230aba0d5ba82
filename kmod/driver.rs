// SPDX-License-Identifier: GPL-2.0

//! The PCI driver of HBM devices (the owned provider: peerdirect drives a device whose BAR is
//! HBM).
//!
//! Habana Gaudi devices are matched by ID. Stand-ins for HBM (QEMU's `ivshmem-plain`, whose
//! BAR2 is host memory) are never bound by default: only when an administrator names this
//! driver in the device's `driver_override`, the kernel's usual way (as for vfio-pci). What a
//! bound device is, and the order in which it goes, is `device.rs`'s.

use crate::{
    device::HbmDevice,
    hbm::{Hbm, HbmInfo, PciAddress},
    ids::{habana, override_hbm_bar, HbmBar, GAUDI},
    index::DEVICES,
    sys::{self, pci::BarIndex, pci_driver::ResetDriver},
};
use kernel::{device::Core, pci, prelude::*, sync::aref::ARef};

kernel::pci_device_table!(
    PCI_TABLE,
    <HbmDriver as pci::Driver>::IdInfo,
    [
        (habana(GAUDI[0].0), HbmBar(GAUDI[0].1)),
        (habana(GAUDI[1].0), HbmBar(GAUDI[1].1)),
        (habana(GAUDI[2].0), HbmBar(GAUDI[2].1)),
    ]
);

/// Records what peerdirect needs to know of the device's HBM BAR and claims it.
fn record_hbm(pdev: &pci::Device<Core<'_>>, bar: BarIndex, index: u32) -> Result<HbmInfo> {
    let bytes = pdev.resource_len(bar.get())?;
    if bytes == 0 || !sys::pci::bar_is_mem(pdev, bar) {
        dev_err!(
            pdev,
            "BAR{} is not a memory BAR: not an HBM device\n",
            bar.get()
        );
        return Err(ENODEV);
    }
    sys::pci::request_bar(pdev, bar)?;
    // Without it, CPU mappings of the BAR would be uncached (UC-) however mmap asks; with a
    // conflicting reservation already made, they stay so, and say so.
    if let Err(err) = sys::pci::reserve_wc(pdev, bar) {
        dev_warn!(
            pdev,
            "BAR{}: cannot reserve write-combining ({:?}): CPU mappings of it will be uncached\n",
            bar.get(),
            err
        );
    }
    Ok(HbmInfo {
        bar,
        bytes,
        bus_addr: sys::pci::bar_bus_address(pdev, bar),
        phys_addr: pdev.resource_start(bar.get())?,
        numa_node: sys::pci::numa_node(pdev),
        address: PciAddress::new(sys::pci::domain(pdev), pdev.dev_id()),
        vendor_id: pdev.vendor_id().as_raw(),
        device_id: pdev.device_id(),
        index,
    })
}

pub(crate) struct HbmDriver;

impl pci::Driver for HbmDriver {
    type IdInfo = HbmBar;
    type Data<'bound> = HbmDevice;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<Core<'_>>,
        info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        pin_init::pin_init_scope(move || {
            // Matched by ID, or bound on request through driver_override.
            let bar = match info {
                Some(&HbmBar(bar)) => bar,
                None => override_hbm_bar(pdev).ok_or_else(|| {
                    dev_err!(
                        pdev,
                        "{:04x}:{:04x} is not a known HBM device\n",
                        pdev.vendor_id().as_raw(),
                        pdev.device_id()
                    );
                    ENODEV
                })?,
            };
            let bar = BarIndex::new(bar)?;
            // Not a companion: a companion's owner driver is bound until the companion is gone
            // (it goes first when the owner unbinds), so this probe cannot run meanwhile.

            pdev.enable_device_mem()?;
            pdev.set_master();

            let index = DEVICES.take()?;
            let info = record_hbm(pdev, bar, index.get())?;
            sys::pci::p2pdma_init(pdev)?;
            let pci_dev: &pci::Device = pdev;
            let hbm = Hbm::new(info, ARef::from(pci_dev), None)?;
            dev_info!(
                pdev,
                "{}: HBM BAR{} {} MiB at bus address {:#x}\n",
                index.name().to_str().unwrap_or("peerdirect"),
                info.bar.get(),
                info.bytes >> 20,
                info.bus_addr
            );
            Ok(HbmDevice::new(index, hbm))
        })
    }
}

/// A reset of a bound device (sysfs `reset`, vfio, a bus reset, AER recovery) revokes every
/// export made before it, and refuses new ones until it is done (`Hbm::reset_prepare`).
impl ResetDriver for HbmDriver {
    fn reset_prepare(data: Pin<&HbmDevice>) {
        // Cannot fail: the device is bound (its removal takes the device lock, which the PCI
        // core holds around the reset).
        let _ = data.hbm().reset_prepare();
    }

    fn reset_done(data: Pin<&HbmDevice>) {
        // Cannot fail: the PCI core calls it after its `reset_prepare`.
        let _ = data.hbm().reset_done();
    }
}
