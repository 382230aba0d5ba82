// SPDX-License-Identifier: GPL-2.0

//! An HBM device as the rest of the module sees it: where its BAR is, and whether the device
//! is still bound.
//!
//! [`Hbm`] is shared (`Arc`) by the driver's per-device data and every open file, because
//! files outlive an unbind: after [`Hbm::remove`] they stay valid but every request on them
//! fails with `ENODEV`.

use crate::ffi::BarIndex;
use kernel::{
    prelude::*,
    sync::{
        atomic::{Acquire, Atomic, Release},
        Arc,
    },
};

/// A PCI address, `domain:bus:slot.func`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PciAddress {
    pub(crate) domain: u32,
    pub(crate) bus: u8,
    pub(crate) slot: u8,
    pub(crate) func: u8,
}

impl PciAddress {
    /// From the domain and the `bus << 8 | devfn` id of a PCI function.
    pub(crate) fn new(domain: u32, dev_id: u16) -> Self {
        let [bus, devfn] = dev_id.to_be_bytes();
        Self {
            domain,
            bus,
            slot: devfn >> 3,
            func: devfn & 0x7,
        }
    }
}

impl kernel::fmt::Display for PciAddress {
    fn fmt(&self, f: &mut kernel::fmt::Formatter<'_>) -> kernel::fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.slot, self.func
        )
    }
}

/// What peerdirect recorded of an HBM device when it bound it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HbmInfo {
    pub(crate) bar: BarIndex,
    pub(crate) bytes: u64,
    pub(crate) bus_addr: u64,
    pub(crate) phys_addr: u64,
    pub(crate) numa_node: Option<u32>,
    pub(crate) address: PciAddress,
    pub(crate) vendor_id: u16,
    pub(crate) device_id: u16,
    /// N of `/dev/peerdirectN`.
    pub(crate) index: u32,
}

/// A bound (or formerly bound) HBM device.
pub(crate) struct Hbm {
    info: HbmInfo,
    present: Atomic<bool>,
}

impl Hbm {
    pub(crate) fn new(info: HbmInfo) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                info,
                present: Atomic::new(true),
            },
            GFP_KERNEL,
        )?)
    }

    /// The device's description, or `ENODEV` once it is gone.
    pub(crate) fn info(&self) -> Result<&HbmInfo> {
        if self.present.load(Acquire) {
            Ok(&self.info)
        } else {
            Err(ENODEV)
        }
    }

    /// The description as recorded, whether or not the device is still there (for logs and
    /// fdinfo).
    pub(crate) fn recorded(&self) -> &HbmInfo {
        &self.info
    }

    pub(crate) fn is_present(&self) -> bool {
        self.present.load(Acquire)
    }

    /// Marks the device gone (unbind, removal): later requests fail with `ENODEV`.
    pub(crate) fn remove(&self) {
        self.present.store(false, Release);
    }
}
