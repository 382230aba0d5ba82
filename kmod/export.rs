// SPDX-License-Identifier: GPL-2.0

//! peerdirect's DMA-BUF exporter: a range of an allocation, offered to peer devices only.
//!
//! - attach refuses importers that cannot take device memory (no `peer2peer`) and those the
//!   kernel's P2P rules give no path to (`pci_p2pdma_distance_many`: the same verdict as
//!   `pci_p2pdma_map_type`, which modules cannot call), with one rate-limited log line;
//! - map hands out the BAR range in segments no longer than the importer's max segment size,
//!   never one per page, in a table of our own: bus addresses behind a shared switch;
//!   through the host bridge, the whole range mapped at once (through an IOMMU one IOVA
//!   range, in entries as long as an entry holds);
//! - a read-only export (no `PEERDIRECT_EXPORT_RDWR`) maps only `DMA_TO_DEVICE`: `EACCES` for
//!   a mapping that lets the peer write;
//! - the range never moves, so pinning costs nothing (EFA's pinned import works); pins are
//!   only recorded for debugfs, in the attachment's own exporter-private word: attach and
//!   detach allocate nothing and take no lock of ours;
//! - mmap maps the range write-combined for the CPU, filled at fault time (2 MiB and 1 GiB
//!   entries where aligned), so that revocation can close it without a race;
//! - vmap gives kernel importers (the test bed's rxe) the range as write-combined I/O memory,
//!   refused (`ENODEV`) once revoked; revocation undoes the mapping under the reservation
//!   lock, so an importer that copies under that lock never reaches a vanished BAR;
//! - release drops the allocation reference: the memory is reused only after the last dma-buf;
//! - on removal of the device every export is revoked (`Hbm::remove`).

use crate::{
    allocation::Allocation,
    hbm::{ExportRecord, Hbm},
    p2p,
    sys::{
        dma_buf::{Attaching, DataDirection, DmaBuf, Exporter, Locked, SgTable, Unrevoked},
        pci,
    },
};
use kernel::{
    fs::File,
    page::PAGE_SIZE,
    prelude::*,
    rbtree::RBTreeNodeReservation,
    sync::{aref::ARef, atomic::Relaxed, Arc},
};

struct Export {
    alloc: Arc<Allocation>,
    /// Start of the exported range inside the allocation.
    offset: u64,
    len: u64,
    /// Exported with `PEERDIRECT_EXPORT_RDWR`: peers and the CPU may write to it.
    writable: bool,
}

impl Export {
    fn hbm(&self) -> &Hbm {
        self.alloc.hbm()
    }

    /// CPU physical address of the exported range.
    fn phys_addr(&self) -> u64 {
        self.hbm().recorded().phys_addr + self.alloc.offset() + self.offset
    }
}

impl Exporter for Export {
    type Record = ExportRecord;

    // Inlined into the `attach` callback: one call less per attach.
    #[inline]
    fn attach(&self, attach: &Attaching<'_>) -> Result {
        if !attach.peer2peer() {
            return Err(EOPNOTSUPP);
        }
        let hbm = self.hbm();
        // Gone: ENODEV, from `live`: removal closes the verdict cache, so every lookup misses
        // and asks for the device as bound. An attach that passes while the device goes is
        // harmless: its maps fail (revocation marks the export under the reservation lock
        // `map` runs under) and revocation tells it to let go.
        let Some(route) = p2p::route(attach, &hbm.verdicts, || hbm.live())? else {
            attach.log_refused(
                hbm.pdev(),
                c"no peer-to-peer path to the HBM device (kernel P2P verdict: not supported)",
            );
            return Err(EOPNOTSUPP);
        };
        // For `map`, in the attachment's own exporter-private word (as is what debugfs shows
        // of it: see `Locked::set_pinned`), so attach allocates nothing and detach has
        // nothing to undo.
        attach.set_by_bus_address(route.by_bus_address);
        Ok(())
    }

    fn pin(&self, attach: &Locked<'_>) -> Result {
        attach.set_pinned(true);
        Ok(())
    }

    fn unpin(&self, attach: &Locked<'_>) {
        attach.set_pinned(false);
    }

    // Inlined into the `map_dma_buf` callback, as `attach` is.
    #[inline]
    fn map(
        &self,
        attach: &Locked<'_>,
        dir: DataDirection,
        unrevoked: &Unrevoked<'_>,
    ) -> Result<SgTable> {
        // A read-only export is read-only for peers too: no mapping that lets the device
        // write (what an IOMMU then enforces; behind a shared switch it is the importer's word).
        if !self.writable && dir != DataDirection::DMA_TO_DEVICE {
            return Err(EACCES);
        }
        // No live guard: removal revokes this export (under the reservation lock held here)
        // before the device's binding goes, and waits for the mapping made here to be undone.
        let hbm = self.hbm();
        // Nothing to reach while the BAR does not decode (a reset no one announced, an owner
        // that keeps decoding off: a VM's driver, through vfio), nor once it is no longer
        // where the device was found (resized, reassigned or moved since).
        if !pci::bar_in_place(hbm.pdev(), &hbm.recorded().place()) {
            return Err(EIO);
        }
        let page = PAGE_SIZE as u64;
        let seg = (attach.max_segment_size() & !(page - 1)).max(page);
        let bus_addr = attach.by_bus_address();
        // Our own table, for a companion's BAR (no p2pdma provider of ours) and ours alike:
        // the route attach recorded says bus address or host bridge (Documentation/exporter.md).
        let info = hbm.recorded();
        let bus_offset = info.bus_addr.wrapping_sub(info.phys_addr);
        let sgt = attach.map_table(
            unrevoked,
            self.phys_addr(),
            bus_offset,
            self.len,
            seg,
            dir,
            bus_addr,
        )?;
        hbm.mapped(attach.is_revocable());
        attach.count_mapping(sgt.entries(), true);
        Ok(sgt)
    }

    #[inline]
    fn unmap(&self, attach: &Locked<'_>, sgt: SgTable, dir: DataDirection) {
        let entries = sgt.entries();
        attach.unmap_table(sgt, dir);
        // Uncounted as it was counted: whether an attachment is revocable never changes, and
        // each of its mappings (an importer may hold several) was counted on its own.
        self.hbm().unmapped(attach.is_revocable());
        attach.count_mapping(entries, false);
    }

    fn mmap(&self) -> Result {
        self.hbm().info().map(|_| ())
    }

    fn begin_cpu_access(&self) -> Result {
        self.hbm().info().map(|_| ())
    }

    // Under the reservation lock: nothing here takes a lock of ours, which revocation holds
    // while it takes that one.
    fn vmap(&self, _unrevoked: &Unrevoked<'_>) -> Result {
        // Nothing to reach while the BAR does not decode or has moved, as for `map`.
        let hbm = self.hbm();
        if !pci::bar_in_place(hbm.pdev(), &hbm.recorded().place()) {
            return Err(EIO);
        }
        Ok(())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        self.hbm().exports.fetch_sub(1, Relaxed);
    }
}

/// Exports `len` bytes from `offset` inside `alloc` (validated by the caller) as a dma-buf;
/// returns its file, to be installed as an fd.
pub(crate) fn export(
    alloc: &Arc<Allocation>,
    offset: u64,
    len: u64,
    writable: bool,
) -> Result<ARef<File>> {
    let hbm = alloc.hbm();
    let index = hbm.info()?.index;
    let node = RBTreeNodeReservation::new(GFP_KERNEL)?;
    hbm.exports.fetch_add(1, Relaxed);
    // From here on, dropping the box (on any failure) undoes the count.
    let export = KBox::new(
        Export {
            alloc: alloc.clone(),
            offset,
            len,
            writable,
        },
        GFP_KERNEL,
    );
    let export = match export {
        Ok(export) => export,
        Err(e) => {
            hbm.exports.fetch_sub(1, Relaxed);
            return Err(e.into());
        }
    };
    let cpu_phys = export.phys_addr();
    // The export holds the allocation, which holds the device: the buffer's window may name it.
    let place = hbm.recorded().place();
    let dmabuf = DmaBuf::export(
        export,
        len,
        cpu_phys,
        hbm.pdev(),
        place,
        writable,
        &hbm.exported,
    )?;
    dmabuf.set_name(index, alloc.handle(), alloc.offset() + offset, len)?;
    // Recorded for revocation; fails if the device went away meanwhile.
    let record = ExportRecord {
        handle: alloc.handle(),
        offset: alloc.offset() + offset,
        len,
        pid: crate::sys::task::current_tgid(),
    };
    hbm.register_export(&dmabuf, record, node)?;
    Ok(dmabuf.into_file())
}
