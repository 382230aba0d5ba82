// SPDX-License-Identifier: GPL-2.0

//! A device peerdirect serves, as it is bound: `/dev/peerdirectN` and its debugfs directory
//! and index, and the order in which they go ([`HbmDevice`]), for a device its driver binds
//! and for a companion alike; and the companions served (`companion.rs` adds and removes
//! them), which are also the one-provider-per-device claim the driver's probe checks.

use crate::{
    chardev::HbmMisc,
    debugfs::{self, DeviceFiles},
    hbm::{Hbm, PciAddress},
    index::DeviceIndex,
    sys::{self, pci::DeviceLock},
};
use kernel::{
    debugfs::Scope,
    pci,
    prelude::*,
    sync::{aref::ARef, Arc},
};

/// Per-device data while peerdirect serves an HBM device.
///
/// Fields drop in declaration order, which is the removal protocol: first the misc device
/// (`misc_deregister` waits for opens in progress, so none can reach a dying device), then
/// the device is marked gone and its exports revoked, then the debugfs directory goes, and
/// only then is the index (and with it the names `peerdirectN`) given back for another device.
#[pin_data]
pub(crate) struct HbmDevice {
    #[pin]
    misc: HbmMisc,
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
            bound: Bound(hbm.clone()),
            index,
            misc <- HbmMisc::register(name, hbm),
        })
    }

    /// The device's HBM.
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

/// One companion device.
pub(crate) struct Companion {
    /// The device's identity ([`sys::pci::pci_dev_key`]), as the bus notifier names it.
    pub(crate) key: usize,
    pub(crate) address: PciAddress,
    /// Dropping it removes the companion (see [`HbmDevice`]); only with the device's lock held
    /// ([`Companion::remove_locked`]), so that the owner cannot unbind, and tear the BAR down,
    /// before every export is revoked.
    pub(crate) device: Pin<KBox<HbmDevice>>,
    pub(crate) pdev: ARef<pci::Device>,
}

impl Companion {
    /// Removes the companion; the caller holds its device's lock.
    pub(crate) fn remove_locked(self, _lock: &DeviceLock<'_>) {
        drop(self.device);
    }
}

crate::sys::global::global_mutex! {
    /// The devices served as companions.
    pub(crate) static COMPANIONS: Mutex<KVec<Companion>> = KVec::new();
}

/// Whether `pdev` is served as a companion. Its owned probe calls this under the device lock,
/// which adding a companion holds too, so the answer holds until probe returns.
pub(crate) fn is_companion(pdev: &pci::Device) -> bool {
    let key = sys::pci::pci_dev_key(pdev);
    COMPANIONS.lock().iter().any(|c| c.key == key)
}
