// SPDX-License-Identifier: GPL-2.0

//! The status page of an HBM device: one page that userspace maps read-only from
//! `/dev/peerdirectN` (`PEERDIRECT_STATUS_OFFSET`) and reads without a system call. The module
//! sets `PEERDIRECT_STATUS_REVOKED` in it before it revokes the device's exports, so that a
//! registration cache can stop handing out registrations of them (userspace/peerdirect's
//! `RegCache` checks it on every hit), and counts the device's resets in it, each before the
//! exports made until then are revoked.

use crate::{
    sys,
    uapi::{peerdirect_status, PEERDIRECT_STATUS_OFFSET, PEERDIRECT_STATUS_VERSION},
};
use core::mem::offset_of;
use kernel::{
    mm::virt::{flags as vm_flags, VmaNew},
    page::{Page, PAGE_SIZE},
    prelude::*,
};

/// One device's status page; mapped pages hold their own reference, so a mapping outlives
/// the device (and shows it revoked).
pub(crate) struct StatusPage(Page);

impl StatusPage {
    pub(crate) fn new() -> Result<Self> {
        let page = Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?;
        sys::mm::page_set_bits(
            &page,
            offset_of!(peerdirect_status, version),
            PEERDIRECT_STATUS_VERSION,
        )?;
        Ok(Self(page))
    }

    /// Sets `bits` (`PEERDIRECT_STATUS_*`) in the state word; callers are serialized (only
    /// the device's removal sets any, under `Hbm`'s `revoked` lock).
    pub(crate) fn set(&self, bits: u32) {
        // The offset is a constant, aligned field of a struct much smaller than a page.
        let _ = sys::mm::page_set_bits(&self.0, offset_of!(peerdirect_status, state), bits);
    }

    /// Counts a reset of the device in `resets`; callers are serialized (`Hbm`'s `revoked`
    /// lock, which resets take: an owned device's under the device lock, a companion's not).
    pub(crate) fn count_reset(&self) {
        // As in `set`: a constant, aligned offset inside the page.
        let _ = sys::mm::page_count(&self.0, offset_of!(peerdirect_status, resets));
    }

    /// What the page says now, each word loaded as userspace loads it (acquire).
    pub(crate) fn read(&self) -> peerdirect_status {
        // As in `set`: constant, aligned offsets inside the page.
        let word = |offset| sys::mm::page_load(&self.0, offset).unwrap_or(0);
        peerdirect_status {
            version: word(offset_of!(peerdirect_status, version)),
            state: word(offset_of!(peerdirect_status, state)),
            resets: word(offset_of!(peerdirect_status, resets)),
        }
    }

    /// Maps the page into `vma`, which must be shared, read-only, not executable, one page
    /// long, at `PEERDIRECT_STATUS_OFFSET`.
    pub(crate) fn map(&self, vma: &VmaNew) -> Result {
        if sys::mm::vma_pgoff(vma) != PEERDIRECT_STATUS_OFFSET as usize
            || vma.end() - vma.start() != PAGE_SIZE
            || vma.flags() & vm_flags::MAYSHARE == 0
        {
            return Err(EINVAL);
        }
        if vma.writable() || vma.executable() {
            return Err(EPERM);
        }
        vma.try_clear_maywrite()?;
        vma.try_clear_mayexec()?;
        vma.set_dontexpand();
        vma.set_mixedmap().vm_insert_page(vma.start(), &self.0)
    }
}
