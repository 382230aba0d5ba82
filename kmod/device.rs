// SPDX-License-Identifier: GPL-2.0

//! A device peerdirect serves, as it is bound: `/dev/peerdirectN` and its debugfs directory
//! and index, and the order in which they go ([`HbmDevice`]), for a device its driver binds
//! and for a companion alike.

use crate::{
    chardev::HbmMisc,
    debugfs::{self, DeviceFiles},
    hbm::Hbm,
    index::DeviceIndex,
};
use kernel::{debugfs::Scope, prelude::*, sync::Arc};

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
