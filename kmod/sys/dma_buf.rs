// SPDX-License-Identifier: GPL-2.0

//! Our dma-bufs as the C helpers handle them: the peer and host-bridge tables of a mapping,
//! the CPU mapping, naming, revocation, the listing of attachments, and the exporter-private
//! word of an attachment.

use super::{raw, util::from_err_ptr};
use core::ptr::NonNull;
use kernel::{bindings, ffi::c_int, prelude::*};

pub(crate) use super::raw::AttachInfo;

/// Whether `attach`'s importer drops its mappings when told to (the kernel's
/// `dma_buf_attach_revocable()`, read here rather than through a call: map asks it every
/// time).
///
/// # Safety
///
/// `attach` is an attachment passed to one of our callbacks, during that callback.
pub(crate) unsafe fn attach_revocable(attach: *mut bindings::dma_buf_attachment) -> bool {
    // `importer_ops` is set at attach and never changed.
    // SAFETY: `attach` is valid (the caller's contract); its `importer_ops` is NULL or the
    // importer's operations, which outlive its attachments.
    unsafe {
        let ops = (*attach).importer_ops;
        !ops.is_null() && (*ops).invalidate_mappings.is_some()
    }
}

/// Maps `len` bytes of a BAR at `paddr` for `attach`'s device in a table filled by
/// `helpers/dma_buf.c`: by bus address (`paddr + bus_offset`) when `bus_addr`, else through the
/// host bridge (one IOVA range through an IOMMU, else one `dma_map_phys` of the whole range).
///
/// # Safety
///
/// `attach` is being mapped under its buffer's reservation lock; `seg` is non-zero and at most
/// 4 GiB less a page; the BAR stays (the buffer is not revoked: `dmabuf::Unrevoked`).
pub(crate) unsafe fn map_table(
    attach: *mut bindings::dma_buf_attachment,
    paddr: u64,
    bus_offset: u64,
    len: u64,
    seg: u64,
    dir: bindings::dma_data_direction,
    bus_addr: bool,
) -> Result<NonNull<bindings::sg_table>> {
    // SAFETY: forwarded from the caller.
    from_err_ptr(unsafe {
        raw::peerdirect_map_table(attach, paddr, bus_offset, len, seg, dir, bus_addr)
    })
}

/// Undoes [`map_table`].
///
/// # Safety
///
/// `sgt` was returned by [`map_table`] for `attach`, whose reservation lock is held.
pub(crate) unsafe fn unmap_table(
    attach: *mut bindings::dma_buf_attachment,
    sgt: *mut bindings::sg_table,
    dir: bindings::dma_data_direction,
) {
    // SAFETY: forwarded from the caller.
    unsafe { raw::peerdirect_unmap_table(attach, sgt, dir) }
}

/// Sets up a user mapping of `dmabuf`'s CPU window, to be filled at fault time.
///
/// # Safety
///
/// `dmabuf` is one of ours (its `priv` starts with a `struct peerdirect_cpu_window`) and `vma`
/// is being set up by its `mmap` callback.
pub(crate) unsafe fn dmabuf_mmap(
    dmabuf: *mut bindings::dma_buf,
    vma: *mut bindings::vm_area_struct,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { raw::peerdirect_dmabuf_mmap(dmabuf, vma) }
}

/// Names a dma-buf.
///
/// # Safety
///
/// The caller holds a reference to `dmabuf`.
pub(crate) unsafe fn dmabuf_set_name(
    dmabuf: *mut bindings::dma_buf,
    index: u32,
    handle: u32,
    offset: u64,
    len: u64,
) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { raw::peerdirect_dmabuf_set_name(dmabuf, index, handle, offset, len) }
}

/// Invalidates importers' mappings of `dmabuf` and zaps its CPU mappings; `false` if its
/// release had begun (then it is left alone).
///
/// # Safety
///
/// `dmabuf`'s memory is valid for the call (see `dmabuf::revoke`), and the caller does not
/// hold its reservation lock.
pub(crate) unsafe fn dmabuf_revoke(dmabuf: *mut bindings::dma_buf) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { raw::peerdirect_dmabuf_revoke(dmabuf) }
}

/// The exporter-private word of an attachment (helpers.h's `PEERDIRECT_ATTACH_*`): pinned,
/// the importer reaching the BAR by bus address, and above them the DMA segments of all its
/// current mappings (an importer may map one attachment more than once).
const ATTACH_PINNED: usize = 1;
const ATTACH_BUS_ADDR: usize = 2;
const ATTACH_ENTRIES_SHIFT: u32 = 2;

/// Replaces `attach`'s exporter-private word by `f` of it.
///
/// # Safety
///
/// `attach` is an attachment to one of our dma-bufs, whose word no one else reads or writes
/// meanwhile: the caller holds its reservation lock, or the core has not published it yet.
unsafe fn replace_attach_word(
    attach: *mut bindings::dma_buf_attachment,
    f: impl FnOnce(usize) -> usize,
) {
    // SAFETY: the word is the exporter's (ours), a number, never a pointer, and the caller's
    // alone for the call.
    unsafe { (*attach).priv_ = core::ptr::without_provenance_mut(f((*attach).priv_.addr())) };
}

/// [`replace_attach_word`] under the reservation lock, which lockdep kernels check.
///
/// # Safety
///
/// `attach` is an attachment to one of our dma-bufs, whose reservation lock the caller holds.
unsafe fn update_attach_word(
    attach: *mut bindings::dma_buf_attachment,
    f: impl FnOnce(usize) -> usize,
) {
    #[cfg(CONFIG_LOCKDEP)]
    // SAFETY: `attach` is live (the caller's callback).
    unsafe {
        raw::peerdirect_assert_resv_held(attach)
    };
    // SAFETY: the lock the caller holds keeps everyone else off the word.
    unsafe { replace_attach_word(attach, f) };
}

/// Records whether the importer pinned `attach`.
///
/// # Safety
///
/// `attach` is an attachment to one of our dma-bufs, whose reservation lock the caller holds
/// (it is in the `pin` or `unpin` callback).
pub(crate) unsafe fn attach_set_pinned(attach: *mut bindings::dma_buf_attachment, pinned: bool) {
    let update = |word| {
        if pinned {
            word | ATTACH_PINNED
        } else {
            word & !ATTACH_PINNED
        }
    };
    // SAFETY: forwarded from the caller.
    unsafe { update_attach_word(attach, update) }
}

/// Records whether `attach`'s importer reaches the BAR by bus address.
///
/// # Safety
///
/// `attach` is an attachment to one of our dma-bufs in its `attach` callback: the core has not
/// published it yet, so nothing else reads or writes its word.
pub(crate) unsafe fn attach_set_by_bus_address(
    attach: *mut bindings::dma_buf_attachment,
    by_bus_address: bool,
) {
    let bit = if by_bus_address { ATTACH_BUS_ADDR } else { 0 };
    // SAFETY: unpublished, the word is no one else's yet (caller).
    unsafe { replace_attach_word(attach, |word| word & !ATTACH_BUS_ADDR | bit) };
}

/// Whether `attach`'s importer reaches the BAR by bus address ([`attach_set_by_bus_address`]).
///
/// # Safety
///
/// As for [`attach_set_pinned`], from the `map_dma_buf` callback.
pub(crate) unsafe fn attach_by_bus_address(attach: *mut bindings::dma_buf_attachment) -> bool {
    // SAFETY: as in `update_attach_word`.
    unsafe { (*attach).priv_.addr() & ATTACH_BUS_ADDR != 0 }
}

/// Adds (`mapped`) or takes away the DMA segments of one of `attach`'s mappings to or from
/// those its word counts.
///
/// # Safety
///
/// As for [`attach_set_pinned`], from the `map_dma_buf` or `unmap_dma_buf` callback.
pub(crate) unsafe fn attach_count_mapping(
    attach: *mut bindings::dma_buf_attachment,
    entries: u32,
    mapped: bool,
) {
    let flags = ATTACH_PINNED | ATTACH_BUS_ADDR;
    let update = |word: usize| {
        let counted = word >> ATTACH_ENTRIES_SHIFT;
        let counted = if mapped {
            counted.saturating_add(entries as usize)
        } else {
            counted.saturating_sub(entries as usize)
        };
        word & flags | counted << ATTACH_ENTRIES_SHIFT
    };
    // SAFETY: forwarded from the caller.
    unsafe { update_attach_word(attach, update) }
}

/// Describes up to `out.len()` of `dmabuf`'s attachments in `out`; returns how many it has.
///
/// # Safety
///
/// As for [`dmabuf_revoke`]: `dmabuf`'s memory is valid for the call and the caller does not
/// hold its reservation lock.
pub(crate) unsafe fn dmabuf_attachments(
    dmabuf: *mut bindings::dma_buf,
    out: &mut [AttachInfo],
) -> usize {
    // SAFETY: forwarded from the caller; `out` is valid for writes of `out.len()` entries,
    // whose layout `AttachInfo` mirrors.
    unsafe { raw::peerdirect_dmabuf_attachments(dmabuf, out.as_mut_ptr(), out.len()) }
}
