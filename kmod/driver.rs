// SPDX-License-Identifier: GPL-2.0

//! The PCI driver of HBM devices (the owned provider: peerdirect drives a device whose BAR is
//! HBM), and the order in which a device is taken down.
//!
//! Habana Gaudi devices are matched by ID. Stand-ins for HBM (QEMU's `ivshmem-plain`, whose
//! BAR2 is host memory) are never bound by default: only when an administrator names this
//! driver in the device's `driver_override`, the kernel's usual way (as for vfio-pci).

use crate::{
    chardev::HbmFile,
    debugfs::{self, DeviceFiles},
    hbm::{Hbm, HbmInfo, PciAddress},
    index::{DeviceIndex, DEVICES},
    sys::{self, pci::BarIndex},
};
use kernel::{
    bindings, container_of,
    debugfs::Scope,
    device::Core,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    pci,
    prelude::*,
    sync::{aref::ARef, Arc},
};

/// The BAR that holds a device's HBM.
#[derive(Clone, Copy)]
pub(crate) struct HbmBar(u32);

const PCI_VENDOR_ID_HABANALABS: u32 = 0x1da3;

/// A Habana device ID; `pci::Vendor` has no constant for Habana and no public constructor.
const fn habana(device: u32) -> pci::DeviceId {
    let id = bindings::pci_device_id {
        vendor: PCI_VENDOR_ID_HABANALABS,
        device,
        subvendor: !0,
        subdevice: !0,
        class: 0,
        class_mask: 0,
        driver_data: 0,
        override_only: 0,
    };
    // SAFETY: `pci::DeviceId` is `#[repr(transparent)]` over `bindings::pci_device_id` and adds
    // no invariant beyond it (its own constructors build one field by field, as here).
    unsafe { core::mem::transmute::<bindings::pci_device_id, pci::DeviceId>(id) }
}

/// Habana devices and their HBM BAR: Gaudi, Gaudi (secured) and Gaudi2 expose their HBM
/// through BAR 4 (`HBM_BAR_ID` / `DRAM_BAR_ID` in habanalabs). The ID table and the companion
/// default both come from here.
const GAUDI: [(u32, u32); 3] = [(0x1000, 4), (0x1010, 4), (0x1020, 4)];

kernel::pci_device_table!(
    PCI_TABLE,
    <HbmDriver as pci::Driver>::IdInfo,
    [
        (habana(GAUDI[0].0), HbmBar(GAUDI[0].1)),
        (habana(GAUDI[1].0), HbmBar(GAUDI[1].1)),
        (habana(GAUDI[2].0), HbmBar(GAUDI[2].1)),
    ]
);

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

fn override_hbm_bar(pdev: &pci::Device) -> Option<u32> {
    let vendor = pdev.vendor_id().as_raw();
    OVERRIDE_ONLY
        .iter()
        .find(|&&(v, d, _)| v == vendor && d == pdev.device_id())
        .map(|&(_, _, bar)| bar)
}

/// Per-device data while peerdirect is bound to an HBM device.
///
/// Fields drop in declaration order, which is the removal protocol: first the misc device
/// (`misc_deregister` waits for opens in progress, so none can reach a dying device), then
/// the device is marked gone and its exports revoked, then the debugfs directory goes, and
/// only then is the index (and with it the names `peerdirectN`) given back for another device.
#[pin_data]
pub(crate) struct HbmDevice {
    #[pin]
    misc: MiscDeviceRegistration<HbmFile>,
    bound: Bound,
    #[pin]
    debugfs: Scope<DeviceFiles>,
    index: DeviceIndex,
}

impl HbmDevice {
    /// `/dev/peerdirectN` (N from `index`) for `hbm`, with its debugfs directory: for a device
    /// peerdirect binds, and for a companion device.
    pub(crate) fn new(index: DeviceIndex, hbm: Arc<Hbm>) -> impl PinInit<Self, Error> {
        let name = index.name();
        // The misc device registers last: an open may come at once.
        try_pin_init!(HbmDevice {
            debugfs <- debugfs::device_dir(name, hbm.clone()),
            bound: Bound(hbm),
            index,
            misc <- MiscDeviceRegistration::register(MiscDeviceOptions { name }),
        })
    }

    /// The device whose misc device `misc` is.
    ///
    /// Every `MiscDeviceRegistration<HbmFile>` is the `misc` field of an `HbmDevice`: it is
    /// created nowhere else.
    pub(crate) fn of_registration(misc: &MiscDeviceRegistration<HbmFile>) -> &Self {
        let misc = core::ptr::from_ref(misc);
        // The returned reference borrows from `misc`, which the caller holds, so the
        // containing struct outlives it.
        // SAFETY: by the above, `misc` is the `misc` field of a live, pinned `HbmDevice`.
        unsafe { &*container_of!(misc, Self, misc) }
    }

    /// The device's HBM. Open runs only while `misc` is registered, so before [`Bound`]
    /// drops: the `Arc` is always live here.
    pub(crate) fn hbm(&self) -> &Arc<Hbm> {
        &self.bound.0
    }
}

/// The device as bound: dropping it removes the device (see [`HbmDevice`] for when).
struct Bound(Arc<Hbm>);

impl Drop for Bound {
    fn drop(&mut self) {
        // Open files keep `Hbm` alive; from here on they see ENODEV.
        self.0.remove();
        pr_info!(
            "peerdirect{}: removed {}\n",
            self.0.recorded().index,
            self.0.recorded().address
        );
    }
}

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
            // Served as a companion already (probe runs under the device lock, which adding a
            // companion takes too): one provider per device.
            if crate::companion::is_companion(pdev) {
                dev_err!(pdev, "is a peerdirect companion device: remove it first\n");
                return Err(EBUSY);
            }

            pdev.enable_device_mem()?;
            pdev.set_master();

            let index = DEVICES.take()?;
            let info = record_hbm(pdev, bar, index.get())?;
            sys::pci::p2pdma_init(pdev)?;
            let pci_dev: &pci::Device = pdev;
            let hbm = Hbm::new(info, ARef::from(pci_dev), false)?;
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
