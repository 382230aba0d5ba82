// SPDX-License-Identifier: GPL-2.0

//! Companion devices: the HBM BAR of a PCI device that another driver owns (habanalabs on a
//! DL1 host), served as `/dev/peerdirectN` beside that driver (Documentation/companion.md).
//!
//! An administrator names the device and its BAR on the control device `/dev/peerdirect-ctl`
//! (`CAP_SYS_ADMIN`, and only when the module was loaded with `companion=1`). peerdirect then
//! holds a reference on the `pci_dev` and claims none of its resources. A companion goes when
//! it is removed, when its owner driver unbinds (the PCI bus notifier, before the owner's
//! `remove()` runs: the BAR is still there), when the device is deleted, or at unload; each
//! removes it the way an owned device is removed ([`HbmDevice`]), which revokes everything
//! exported from it first. Rebinding the owner brings nothing back: the companion must be
//! named again, as a new `/dev/peerdirectN`.

use crate::{
    device::{Companion, HbmDevice, COMPANIONS},
    hbm::{Hbm, HbmInfo, PciAddress},
    ids::table_hbm_bar,
    index::DEVICES,
    sys::{
        self,
        pci::{BarIndex, DeviceLock, DriverName, PciDevRef},
    },
    uapi::{
        peerdirect_companion, Request, PEERDIRECT_COMPANION_BAR_DEFAULT,
        PEERDIRECT_IOC_COMPANION_ADD, PEERDIRECT_IOC_COMPANION_REMOVE,
    },
};
use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
    sync::atomic::{Atomic, Relaxed},
};

/// Whether the module was loaded with `companion=1`: the control device refuses to add or
/// remove companions otherwise.
static ENABLED: Atomic<bool> = Atomic::new(false);

/// Call once, from the module initializer, with the `companion` module parameter.
pub(crate) fn init(enabled: bool) {
    ENABLED.store(enabled, Relaxed);
}

/// Removes every companion; from module exit, after the control device and the bus notifier
/// are gone.
pub(crate) fn remove_all() {
    let companions = core::mem::take(&mut *COMPANIONS.lock());
    // Removed outside the lock (removal may wait for importers), each under its device's lock
    // (the bus notifier is gone: an owner's unbind would not wait for us otherwise).
    for companion in companions {
        let pdev = companion.pdev.clone();
        let lock = DeviceLock::lock(&pdev);
        companion.remove_locked(&lock);
    }
}

/// The bus notifier's report: `driver` is now bound to the device `key`. A companion that had
/// no owner has one now (a companion goes when its owner unbinds, so it has no other).
pub(crate) fn bound(key: usize, driver: DriverName) {
    if let Some(c) = COMPANIONS.lock().iter().find(|c| c.key == key) {
        c.device.hbm().set_owner_driver(driver);
    }
}

/// The bus notifier's report: the driver of the device `key` is about to unbind, or the
/// device is being deleted. Its companion, if any, goes now, while the BAR is still there.
pub(crate) fn gone(key: usize) {
    let companion = {
        let mut companions = COMPANIONS.lock();
        match companions.iter().position(|c| c.key == key) {
            Some(i) => companions.remove(i).ok(),
            None => None,
        }
    };
    if let Some(c) = companion {
        pr_info!(
            "companion {}: its driver unbinds or it is being removed: removing it\n",
            c.address
        );
        // Revokes every export, waiting for importers, before the owner's remove() runs. The
        // driver core holds the device's lock for the notification; taking it again would
        // deadlock, so the companion is dropped as it is.
        drop(c.device);
    }
}

/// Adds the device at `domain`:`bus`:`devfn` as a companion whose HBM is BAR `bar`
/// (`PEERDIRECT_COMPANION_BAR_DEFAULT`: from the ID table); returns N of `/dev/peerdirectN`.
fn add(domain: u32, bus: u8, devfn: u8, bar: u8) -> Result<u32> {
    let pdev = PciDevRef::get(domain, bus, devfn)
        .ok_or(ENXIO)?
        .into_device();
    let bar = if u32::from(bar) == PEERDIRECT_COMPANION_BAR_DEFAULT {
        table_hbm_bar(&pdev).ok_or(EINVAL)?
    } else {
        u32::from(bar)
    };
    let bar = BarIndex::new(bar)?;
    // No driver binds or unbinds meanwhile: an owned probe of the device cannot race us, and
    // the notifier for its owner's unbind comes only after the companion is recorded.
    let lock = DeviceLock::lock(&pdev);
    if lock.bound_to(c"peerdirect") {
        return Err(EBUSY);
    }
    let key = sys::pci::pci_dev_key(&pdev);
    let driver = lock.driver_name();
    let mut companions = COMPANIONS.lock();
    if companions.iter().any(|c| c.key == key) {
        return Err(EEXIST);
    }
    let bytes = pdev.resource_len(bar.get())?;
    if bytes == 0 || !sys::pci::bar_is_mem(&pdev, bar) {
        return Err(EINVAL);
    }
    companions.reserve(1, GFP_KERNEL)?;
    let index = DEVICES.take()?;
    let info = HbmInfo {
        bar,
        bytes,
        bus_addr: sys::pci::bar_bus_address(&pdev, bar),
        phys_addr: pdev.resource_start(bar.get())?,
        numa_node: sys::pci::numa_node(&pdev),
        address: PciAddress::new(sys::pci::domain(&pdev), pdev.dev_id()),
        vendor_id: pdev.vendor_id().as_raw(),
        device_id: pdev.device_id(),
        index: index.get(),
    };
    let hbm = Hbm::new(info, pdev.clone(), true)?;
    hbm.set_owner_driver(driver);
    let device = KBox::pin_init(HbmDevice::new(index, hbm), GFP_KERNEL)?;
    companions
        .push_within_capacity(Companion {
            key,
            address: info.address,
            device,
            pdev: pdev.clone(),
        })
        .map_err(|_| ENOMEM)?;
    drop(companions);
    drop(lock);
    pr_info!(
        "peerdirect{}: companion {}: HBM BAR{} {} MiB at bus address {:#x}, beside its own driver\n",
        info.index,
        info.address,
        info.bar.get(),
        info.bytes >> 20,
        info.bus_addr
    );
    Ok(info.index)
}

/// Stops serving the companion at `domain`:`bus`:`devfn`; `ENOENT` if it is none.
fn remove(domain: u32, bus: u8, devfn: u8) -> Result {
    let is_it = |c: &Companion| {
        c.address.domain == domain
            && c.address.bus == bus
            && (c.address.slot << 3 | c.address.func) == devfn
    };
    let pdev = COMPANIONS
        .lock()
        .iter()
        .find(|c| is_it(c))
        .map(|c| c.pdev.clone())
        .ok_or(ENOENT)?;
    // The device's lock first (the order the bus notifier imposes), then the list again: the
    // owner's unbind waits until the companion's exports are revoked; if it came first, the
    // notifier removed the companion already.
    let lock = DeviceLock::lock(&pdev);
    let companion = {
        let mut companions = COMPANIONS.lock();
        let i = companions.iter().position(is_it).ok_or(ENOENT)?;
        companions.remove(i).map_err(|_| ENOENT)?
    };
    pr_info!("companion {}: removed on request\n", companion.address);
    companion.remove_locked(&lock);
    Ok(())
}

/// An open `/dev/peerdirect-ctl`.
pub(crate) struct ControlFile;

impl ControlFile {
    /// `PEERDIRECT_IOC_COMPANION_ADD` and `_REMOVE`.
    fn companion(cmd: u32, arg: usize) -> Result {
        if !ENABLED.load(Relaxed) {
            return Err(EOPNOTSUPP);
        }
        if !sys::task::capable_sys_admin() {
            return Err(EPERM);
        }
        let mut req = Request::<peerdirect_companion>::read(arg)?;
        let v = req.value;
        if v.flags != 0 {
            return Err(EOPNOTSUPP);
        }
        if v.__reserved0 != 0 {
            return Err(EINVAL);
        }
        let devfn = sys::pci::devfn(v.pci_slot, v.pci_func)?;
        if cmd == PEERDIRECT_IOC_COMPANION_ADD {
            req.value.index = add(v.pci_domain, v.pci_bus, devfn, v.bar)?;
        } else {
            remove(v.pci_domain, v.pci_bus, devfn)?;
        }
        req.answer()
    }
}

#[vtable]
impl MiscDevice for ControlFile {
    type Ptr = KBox<Self>;

    fn open(_file: &File, _misc: &MiscDeviceRegistration<Self>) -> Result<KBox<Self>> {
        Ok(KBox::new(ControlFile, GFP_KERNEL)?)
    }

    fn ioctl(_me: &Self, _file: &File, cmd: u32, arg: usize) -> Result<isize> {
        match cmd {
            PEERDIRECT_IOC_COMPANION_ADD | PEERDIRECT_IOC_COMPANION_REMOVE => {
                Self::companion(cmd, arg)?
            }
            _ => return Err(ENOTTY),
        }
        Ok(0)
    }
}

/// The control device `/dev/peerdirect-ctl`.
pub(crate) fn control_device() -> impl PinInit<MiscDeviceRegistration<ControlFile>, Error> {
    MiscDeviceRegistration::register(MiscDeviceOptions {
        name: c"peerdirect-ctl",
    })
}
