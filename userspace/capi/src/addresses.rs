//! What `pd_register_addr` finds on every call in the crate's `AddressTable` (no lock taken,
//! nothing written by a lookup): where the bytes of each dma-buf registered at the caller's
//! addresses (`pd_register_dmabuf_at`) are, and its export. The table holds
//! `AddressTable::SLOTS` of them; `pd_register_addr` finds others under the lock of the map
//! it mirrors.

use pd::cache::ExportId;

/// A dma-buf registered at the caller's addresses: bytes `[base, base + size)` there, and the
/// export they are registered under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub(crate) base: u64,
    pub(crate) size: u64,
    pub(crate) export: ExportId,
}

impl At {
    /// Whether bytes `[addr, end)` are among its bytes.
    #[inline]
    pub(crate) fn covers(&self, addr: u64, end: u64) -> bool {
        self.base <= addr && end <= self.base.saturating_add(self.size)
    }
}
