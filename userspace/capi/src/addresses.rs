//! Where the dma-bufs registered at the caller's addresses (`pd_register_dmabuf_at`) are, as
//! `pd_register_addr` finds them on every call: the crate's `AddressTable` (no lock taken,
//! nothing written by a lookup) of where each one's bytes are and its export. The table holds
//! `AddressTable::SLOTS` of them; `pd_register_addr` finds others under the lock of the map
//! it mirrors.

use pd::cache::{AddressTable, ExportId};

/// A dma-buf registered at the caller's addresses: bytes `[base, base + size)` there, and the
/// export they are registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) export: ExportId,
}

/// The table.
#[derive(Default)]
pub(crate) struct Addresses(AddressTable<At>);

impl Addresses {
    /// The entry whose bytes include `[addr, end)`, if the table holds it.
    #[inline]
    pub(crate) fn find(&self, addr: u64, end: u64) -> Option<At> {
        self.0
            .find(|at| at.base <= addr && end <= at.base.saturating_add(at.size))
    }

    /// Makes the table hold `wanted` (the first `AddressTable::SLOTS`). Called under the lock
    /// of the map it mirrors.
    pub(crate) fn set(&self, wanted: &[At]) {
        self.0.set(wanted);
    }
}
