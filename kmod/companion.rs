//! Companion devices: the HBM BAR of a PCI device that another driver owns (habanalabs on a
//! DL1 host), served as `/dev/peerdirectN` beside that driver (Documentation/companion.md).
//!
//! An administrator names the device and its BAR on the control device `/dev/peerdirect-ctl`
//! (`CAP_SYS_ADMIN`, and only when the module was loaded with `companion=1`); its owner driver
//! must be bound. peerdirect then holds a reference on the `pci_dev`, claims none of its
//! resources, and links a consumer device of its own to it ([`OwnerLink`]), so that the
//! driver core asks peerdirect before the owner unbinds. A companion goes when it is removed
//! (a wait its caller can end), when its owner driver unbinds (its unbind, unload, or the
//! device's removal: the driver core calls [`OwnerEvents`] first and waits, with the BAR still
//! there), or at unload; each way revokes everything exported from it, and the companion
//! leaves the list only once no importer maps its BAR ([`remove_companion`]). Rebinding the
//! owner brings nothing back: the companion must be named again, as a new `/dev/peerdirectN`.

use crate::{
    device::HbmDevice,
    hbm::{Hbm, HbmInfo, PciAddress, Wait},
    ids::table_hbm_bar,
    index::DEVICES,
    sys::{
        self,
        owner_link::{OwnerLink, OwnerUnbinds},
        pci::{BarIndex, DeviceLock, DriverName, PciDevRef},
    },
    uapi::{
        peerdirect_companion, Request, PEERDIRECT_COMPANION_BAR_DEFAULT,
        PEERDIRECT_IOC_COMPANION_ADD, PEERDIRECT_IOC_COMPANION_REMOVE,
        PEERDIRECT_IOC_COMPANION_RESET_DONE, PEERDIRECT_IOC_COMPANION_RESET_PREPARE,
    },
};
use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceOptions, MiscDeviceRegistration},
    page::PAGE_SIZE,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc,
    },
};

/// One companion device.
struct Companion {
    /// The device's identity ([`sys::pci::pci_dev_key`]), as its owner link names it.
    key: usize,
    address: PciAddress,
    /// Dropping it removes the companion (see [`HbmDevice`]).
    device: Pin<KBox<HbmDevice>>,
    /// Makes the owner's unbind wait for the companion's removal; dropped after `device`.
    _link: OwnerLink<OwnerEvents>,
}

crate::sys::global::global_mutex! {
    /// The devices served as companions.
    static COMPANIONS: Mutex<KVec<Companion>> = KVec::new();
}

/// Whether the module was loaded with `companion=1`: the control device refuses to add or
/// remove companions otherwise.
static ENABLED: Atomic<bool> = Atomic::new(false);

/// Call once, from the module initializer, with the `companion` module parameter.
pub(crate) fn init(enabled: bool) {
    ENABLED.store(enabled, Relaxed);
}

/// Revokes everything exported from the companion whose HBM is `hbm` and waits, as `wait`
/// says, until no importer maps its BAR; then takes it out of the list and returns it, to be
/// dropped outside the list's lock (which is quick now), or `None` if another way of removal
/// took it first (having waited the same). Until it leaves the list, an owner unbinding waits
/// for it ([`OwnerEvents`]): the BAR never goes back to its owner while a peer may reach it.
/// `EINTR` (a killable wait cut short) leaves the companion listed, its exports revoked.
fn remove_companion(hbm: &Arc<Hbm>, wait: Wait) -> Result<Option<Companion>> {
    hbm.revoke_for_removal();
    hbm.wait_pinned_released(wait)?;
    let mut companions = COMPANIONS.lock();
    let i = companions
        .iter()
        .position(|c| Arc::ptr_eq(c.device.hbm(), hbm));
    Ok(i.and_then(|i| companions.remove(i).ok()))
}

/// The HBM of the first companion `is_it` picks.
fn find(is_it: impl Fn(&Companion) -> bool) -> Option<Arc<Hbm>> {
    COMPANIONS
        .lock()
        .iter()
        .find(|c| is_it(c))
        .map(|c| c.device.hbm().clone())
}

/// Removes every companion; from module exit, after the control device is gone. Nothing is
/// exported from them any more: every file and dma-buf holds the module.
pub(crate) fn remove_all() {
    while let Some(hbm) = find(|_| true) {
        // Cannot fail: not killable.
        if let Ok(Some(companion)) = remove_companion(&hbm, Wait::Uninterruptible) {
            drop(companion);
        }
    }
    // The list's memory: it is a static, never dropped.
    drop(core::mem::take(&mut *COMPANIONS.lock()));
}

/// What a companion's [`OwnerLink`] tells.
pub(crate) struct OwnerEvents;

impl OwnerUnbinds for OwnerEvents {
    /// The owner driver of the companion `key` is about to unbind (its unbind, unload, or the
    /// device's removal): the companion goes now, while the BAR is still there. The unbind
    /// waits for this, which waits, uninterruptibly, for importers that cannot be revoked.
    fn owner_unbinds(key: usize) {
        let Some(hbm) = find(|c| c.key == key) else {
            return;
        };
        pr_info!(
            "companion {}: its driver unbinds or it is being removed: removing it\n",
            hbm.recorded().address
        );
        if let Ok(Some(companion)) = remove_companion(&hbm, Wait::Uninterruptible) {
            drop(companion);
        }
    }
}

/// Adds the device at `domain`:`bus`:`devfn` as a companion whose HBM is BAR `bar`
/// (`PEERDIRECT_COMPANION_BAR_DEFAULT`: from the ID table); returns its HBM, whose recorded
/// index is N of `/dev/peerdirectN`.
fn add(domain: u32, bus: u8, devfn: u8, bar: u8) -> Result<Arc<Hbm>> {
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
    // the owner's unbind waits for the link made below.
    let lock = DeviceLock::lock(&pdev);
    if lock.bound_to(c"peerdirect") {
        return Err(EBUSY);
    }
    let bytes = pdev.resource_len(bar.get())?;
    // A BAR smaller than a page (a register BAR) has no range EXPORT_RANGE could serve.
    if bytes < PAGE_SIZE as u64 || !sys::pci::bar_is_mem(&pdev, bar) {
        return Err(EINVAL);
    }
    let driver = lock.driver_name();
    // A companion serves a BAR beside the driver that owns it, and goes before it unbinds;
    // with no driver, the BAR could be resized or reassigned under it.
    if driver == DriverName::default() {
        return Err(ENODEV);
    }
    let key = sys::pci::pci_dev_key(&pdev);
    if COMPANIONS.lock().iter().any(|c| c.key == key) {
        return Err(EEXIST);
    }
    // Before the list's lock: its consumer device probes under its own lock, which the
    // owner's unbind holds while it calls us (and we take the list's lock). `ENODEV` if the
    // owner has begun to unbind.
    let link = OwnerLink::new(&lock, key)?;
    let mut companions = COMPANIONS.lock();
    if companions.iter().any(|c| c.key == key) {
        return Err(EEXIST);
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
    let hbm = Hbm::new(info, pdev.clone(), Some(driver))?;
    let device = KBox::pin_init(HbmDevice::new(index, hbm.clone()), GFP_KERNEL)?;
    companions
        .push_within_capacity(Companion {
            key,
            address: info.address,
            device,
            _link: link,
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
    Ok(hbm)
}

/// Takes back the companion whose HBM is `hbm`, which [`add`] made for a caller that cannot
/// learn its index (its argument was made unwritable during the call). It goes as on REMOVE:
/// exports revoked first; a fatal signal ends the wait, leaving it in place. Meanwhile only
/// `CAP_SYS_ADMIN` can have acted on it (EXPORT_RANGE, the control device, the owner's
/// unbind), as on any companion. Named by its HBM, not its address: if another removal took
/// it first, a companion added since for the same device stays.
fn withdraw(hbm: &Arc<Hbm>) {
    let address = hbm.recorded().address;
    pr_info!(
        "companion {}: its index could not be written back to the caller: removing it\n",
        address
    );
    if let Ok(Some(companion)) = remove_companion(hbm, Wait::Killable) {
        drop(companion);
    }
}

/// Stops serving the companion at `domain`:`bus`:`devfn`; `ENOENT` if it is none. Waits until
/// no importer maps its BAR, or returns `EINTR` when the caller is sent a fatal signal: the
/// companion then stays, listed, its exports revoked, and goes at the next remove or when
/// its owner unbinds.
fn remove(domain: u32, bus: u8, devfn: u8) -> Result {
    let hbm = at(domain, bus, devfn)?;
    let address = hbm.recorded().address;
    pr_info!("companion {}: removing it on request\n", address);
    match remove_companion(&hbm, Wait::Killable) {
        Ok(Some(companion)) => {
            pr_info!("companion {}: removed on request\n", address);
            drop(companion);
        }
        // Its owner's unbind removed it meanwhile.
        Ok(None) => (),
        Err(e) => {
            pr_info!(
                "companion {}: removal cut short by a signal: it stays, its exports revoked, until it is removed again or its driver unbinds\n",
                address
            );
            return Err(e);
        }
    }
    Ok(())
}

/// The HBM of the companion at `domain`:`bus`:`devfn`; `ENOENT` if it is none.
fn at(domain: u32, bus: u8, devfn: u8) -> Result<Arc<Hbm>> {
    find(|c| {
        c.address.domain == domain
            && c.address.bus == bus
            && (c.address.slot << 3 | c.address.func) == devfn
    })
    .ok_or(ENOENT)
}

/// The owner of the companion at `domain`:`bus`:`devfn` is about to reset the device
/// (`prepare`) or has reset it: its runtime or its operator says so, since the PCI core tells
/// only the driver bound to the device. As for an owned device's reset
/// ([`Hbm::reset_prepare`]): every export revoked first, new ones refused until it is done.
fn reset(domain: u32, bus: u8, devfn: u8, prepare: bool) -> Result {
    let hbm = at(domain, bus, devfn)?;
    if prepare {
        hbm.reset_prepare()
    } else {
        hbm.reset_done()
    }
}

/// An open `/dev/peerdirect-ctl`.
pub(crate) struct ControlFile;

impl ControlFile {
    /// `PEERDIRECT_IOC_COMPANION_ADD`, `_REMOVE`, `_RESET_PREPARE` and `_RESET_DONE`.
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
        // Answered before acting: a caller whose argument cannot be written gets EFAULT with
        // nothing done, not an error for a command that happened (uapi.md). The answer of
        // REMOVE and the resets is the request; ADD's holds the new index, written once known.
        req.write_back()?;
        match cmd {
            PEERDIRECT_IOC_COMPANION_ADD => {
                let hbm = add(v.pci_domain, v.pci_bus, devfn, v.bar)?;
                req.value.index = hbm.recorded().index;
                // Fails only if the caller's memory changed under the call (another thread's
                // munmap or mprotect): a companion it cannot name goes again.
                req.write_back().inspect_err(|_| withdraw(&hbm))
            }
            PEERDIRECT_IOC_COMPANION_REMOVE => remove(v.pci_domain, v.pci_bus, devfn),
            _ => reset(
                v.pci_domain,
                v.pci_bus,
                devfn,
                cmd == PEERDIRECT_IOC_COMPANION_RESET_PREPARE,
            ),
        }
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
            PEERDIRECT_IOC_COMPANION_ADD
            | PEERDIRECT_IOC_COMPANION_REMOVE
            | PEERDIRECT_IOC_COMPANION_RESET_PREPARE
            | PEERDIRECT_IOC_COMPANION_RESET_DONE => Self::companion(cmd, arg)?,
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
