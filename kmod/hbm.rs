// SPDX-License-Identifier: GPL-2.0

//! An HBM device as the rest of the module sees it: where its BAR is, and whether the device
//! is still bound.
//!
//! [`Hbm`] is shared (`Arc`) by the driver's per-device data and every open file, because
//! files outlive an unbind: after [`Hbm::remove`] they stay valid but every request on them
//! fails with `ENODEV`.

use crate::{
    dmabuf::{self, DmaBufId},
    ffi::{BarIndex, P2pProvider},
    memory::{self, HbmMemory},
    status::StatusPage,
    uapi::PEERDIRECT_STATUS_REVOKED,
};
use kernel::{
    new_condvar, new_mutex, pci,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    sync::{
        aref::ARef,
        atomic::{Acquire, Atomic, Relaxed, Release},
        Arc, CondVar, Mutex,
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

/// An export as debugfs lists it.
pub(crate) struct ExportRecord {
    pub(crate) id: DmaBufId,
    pub(crate) handle: u32,
    /// Offset of the exported range in the BAR.
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

/// An importer's attachment as debugfs lists it.
pub(crate) struct AttachRecord {
    /// The export's key in [`Hbm::register_export`].
    pub(crate) export: usize,
    /// The importer's device name, NUL-padded.
    pub(crate) importer: [u8; 32],
    pub(crate) revocable: bool,
    pub(crate) pinned: bool,
    /// DMA segments of its current mapping, 0 when unmapped.
    pub(crate) entries: u32,
}

/// Mappings handed to importers that unmap when told to (they provide `invalidate_mappings`),
/// counted so that removal can wait for them. Pinned ones are counted in [`HbmMemory`].
#[derive(Default)]
pub(crate) struct Mappings {
    pub(crate) revocable: u64,
}

/// Allocation handles of a device: counted up, never 0, and never one the caller still uses.
/// After 2^32 allocations the count wraps; a handle still held then is skipped instead of
/// being handed out twice.
pub(crate) struct Handles(Atomic<u32>);

impl Handles {
    pub(crate) const fn new(first: u32) -> Self {
        Self(Atomic::new(first))
    }

    /// The next handle for which `taken` is false. `taken` must be false for some handle (a
    /// file holds far fewer than 2^32 allocations: each needs memory).
    pub(crate) fn next(&self, taken: impl Fn(u32) -> bool) -> u32 {
        loop {
            let handle = self.0.fetch_add(1, Relaxed);
            if handle != 0 && !taken(handle) {
                return handle;
            }
        }
    }
}

/// A bound (or formerly bound) HBM device.
#[pin_data]
pub(crate) struct Hbm {
    info: HbmInfo,
    present: Atomic<bool>,
    pdev: ARef<pci::Device>,
    provider: P2pProvider,
    /// What userspace maps from the device file to see the device go.
    pub(crate) status: StatusPage,
    pub(crate) memory: Arc<HbmMemory>,
    pub(crate) handles: Handles,
    /// Live dma-bufs exported from this device.
    pub(crate) exports: Atomic<u64>,
    /// The live exports, by the address of their exporter state, to revoke on removal.
    #[pin]
    pub(crate) exported: Mutex<RBTree<usize, ExportRecord>>,
    /// Attachments to this device's exports, by attachment. Taken under a dma-buf's
    /// reservation lock (map), so never held while taking one.
    #[pin]
    pub(crate) attachments: Mutex<RBTree<usize, AttachRecord>>,
    #[pin]
    pub(crate) mappings: Mutex<Mappings>,
    /// Signalled when a revocable mapping goes away.
    #[pin]
    unmapped: CondVar,
}

impl Hbm {
    pub(crate) fn new(
        info: HbmInfo,
        pdev: ARef<pci::Device>,
        provider: P2pProvider,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                memory: memory::of_bar(info.phys_addr, info.bytes)?,
                info,
                present: Atomic::new(true),
                pdev,
                provider,
                status: StatusPage::new()?,
                handles: Handles::new(1),
                exports: Atomic::new(0),
                exported <- new_mutex!(RBTree::new()),
                attachments <- new_mutex!(RBTree::new()),
                mappings <- new_mutex!(Mappings::default()),
                unmapped <- new_condvar!(),
            }),
            GFP_KERNEL,
        )
    }

    /// The device's description, or `ENODEV` once it is gone.
    pub(crate) fn info(&self) -> Result<&HbmInfo> {
        if self.present.load(Acquire) {
            Ok(&self.info)
        } else {
            Err(ENODEV)
        }
    }

    /// The BAR's P2P provider, or `ENODEV` once the device is gone.
    pub(crate) fn provider(&self) -> Result<&P2pProvider> {
        self.info().map(|_| &self.provider)
    }

    pub(crate) fn pci_device(&self) -> &pci::Device {
        &self.pdev
    }

    /// The description as recorded, whether or not the device is still there (for logs and
    /// fdinfo).
    pub(crate) fn recorded(&self) -> &HbmInfo {
        &self.info
    }

    pub(crate) fn is_present(&self) -> bool {
        self.present.load(Acquire)
    }

    /// Records a new export, unless the device is gone (`ENODEV`): a removal revokes every
    /// export recorded before it.
    pub(crate) fn register_export(
        &self,
        key: usize,
        record: ExportRecord,
        node: RBTreeNodeReservation<usize, ExportRecord>,
    ) -> Result {
        let mut exported = self.exported.lock();
        self.info()?;
        exported.insert(node.into_node(key, record));
        Ok(())
    }

    /// Records an importer's attachment.
    pub(crate) fn attached(
        &self,
        key: usize,
        record: AttachRecord,
        node: RBTreeNodeReservation<usize, AttachRecord>,
    ) {
        self.attachments.lock().insert(node.into_node(key, record));
    }

    /// Forgets an importer's attachment.
    pub(crate) fn detached(&self, key: usize) {
        self.attachments.lock().remove(&key);
    }

    /// Updates an attachment's record.
    pub(crate) fn update_attachment(&self, key: usize, f: impl FnOnce(&mut AttachRecord)) {
        if let Some(record) = self.attachments.lock().get_mut(&key) {
            f(record);
        }
    }

    /// Counts a mapping made for an importer.
    pub(crate) fn mapped(&self, revocable: bool) {
        if revocable {
            self.mappings.lock().revocable += 1;
        } else {
            self.memory.pinned_mappings.fetch_add(1, Relaxed);
        }
    }

    /// Counts a mapping undone by an importer.
    pub(crate) fn unmapped(&self, revocable: bool) {
        if revocable {
            let mut mappings = self.mappings.lock();
            mappings.revocable -= 1;
            if mappings.revocable == 0 {
                self.unmapped.notify_all();
            }
        } else {
            self.memory.pinned_mappings.fetch_sub(1, Relaxed);
        }
    }

    /// Forgets an export, from its release.
    pub(crate) fn unregister_export(&self, key: usize) {
        self.exported.lock().remove(&key);
    }

    /// Marks the device gone (unbind, removal) and revokes its exports: later requests and
    /// maps fail with `ENODEV`, importers are told to drop their mappings, CPU mappings are
    /// zapped. Pinned importers that cannot be revoked keep their (now dead) mappings until
    /// they let go; the range is never handed out again meanwhile.
    pub(crate) fn remove(&self) {
        self.present.store(false, Release);
        // Before any export is revoked: caches stop handing out registrations of them.
        self.status.set(PEERDIRECT_STATUS_REVOKED);
        // No export is recorded after this point (`register_export`), so this is all of them.
        {
            let exported = self.exported.lock();
            for id in exported.values().map(|r| r.id) {
                // SAFETY: a recorded buffer's release unregisters it under `exported`, which we
                // hold, so its release has not completed; its reservation lock is not ours.
                unsafe { dmabuf::revoke(id) };
            }
        }
        // Revocable importers unmap in bounded time once invalidated (the dma-buf contract);
        // the BAR must not go away under their DMA.
        let mut mappings = self.mappings.lock();
        while mappings.revocable > 0 {
            self.unmapped.wait(&mut mappings);
        }
        let pinned = self.memory.pinned_mappings.load(Relaxed);
        if pinned > 0 {
            dev_warn!(
                self.pdev.as_ref(),
                "{} pinned importer mapping(s) cannot be revoked and still reference HBM; their ranges stay reserved until released\n",
                pinned
            );
        }
    }
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_handles)]
mod tests {
    use super::*;

    #[test]
    fn handles_skip_zero_and_taken_after_wrapping() {
        let handles = Handles::new(u32::MAX - 1);
        assert_eq!(handles.next(|_| false), u32::MAX - 1);
        // u32::MAX is still held, 0 is never a handle, 1 is still held.
        assert_eq!(handles.next(|h| h == u32::MAX || h == 1), 2);
        assert_eq!(handles.next(|_| false), 3);
    }
}
