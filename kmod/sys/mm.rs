// SPDX-License-Identifier: GPL-2.0

//! Pages, VMAs and files.

use super::raw;
use kernel::{bindings, mm::virt::VmaNew, page::Page, prelude::*};

/// Sets `bits` in the `u32` at `offset` of `page` with release semantics, for readers that
/// map the page (the status page). `EINVAL` unless `offset` is a 4-byte aligned offset inside
/// the page.
pub(crate) fn page_set_bits(page: &Page, offset: usize, bits: u32) -> Result {
    check_word(offset)?;
    // The page is order 0 and always mapped in the kernel (no highmem where peerdirect runs);
    // userspace only reads it, and the caller serializes the kernel's writers.
    // SAFETY: `page` is live while borrowed; `offset` is an aligned `u32` inside it (checked).
    unsafe { raw::peerdirect_page_set_bits(page.as_ptr(), offset, bits) };
    Ok(())
}

/// Adds 1 to the `u32` at `offset` of `page`, as [`page_set_bits`] sets bits (same `EINVAL`).
pub(crate) fn page_count(page: &Page, offset: usize) -> Result {
    check_word(offset)?;
    // SAFETY: as in `page_set_bits`: `page` is live while borrowed, `offset` is an aligned
    // `u32` inside it (checked), and the caller serializes the kernel's writers.
    unsafe { raw::peerdirect_page_count(page.as_ptr(), offset) };
    Ok(())
}

/// The `u32` at `offset` of `page`, loaded with acquire semantics (as a reader of the
/// mapped page loads it); `EINVAL` as for [`page_set_bits`].
pub(crate) fn page_load(page: &Page, offset: usize) -> Result<u32> {
    check_word(offset)?;
    // SAFETY: `page` is live while borrowed and always mapped in the kernel (as in
    // `page_set_bits`); `offset` is an aligned `u32` inside it (checked).
    Ok(unsafe { raw::peerdirect_page_load(page.as_ptr(), offset) })
}

/// `EINVAL` unless `offset` is a 4-byte aligned offset of a `u32` inside a page.
fn check_word(offset: usize) -> Result {
    if offset % 4 != 0 || offset + 4 > kernel::page::PAGE_SIZE {
        return Err(EINVAL);
    }
    Ok(())
}

/// The page offset an `mmap` asked for (`vm_pgoff`).
pub(crate) fn vma_pgoff(vma: &VmaNew) -> usize {
    // SAFETY: `vma` is the area being set up by the current `mmap` call, valid while borrowed.
    unsafe { raw::peerdirect_vma_pgoff(vma.as_ptr()) }
}

/// Gives `file`, being opened, the operations `fops` from now on.
///
/// # Safety
///
/// `file` is being opened by this module's misc device (its open callback runs), and `fops`
/// belongs to this module and works on the file's private data as the misc device's own
/// operations do.
pub(super) unsafe fn file_replace_fops(
    file: &kernel::fs::File,
    fops: &'static bindings::file_operations,
) {
    // SAFETY: forwarded from the caller; `file` is valid for the call.
    unsafe { raw::peerdirect_file_replace_fops(file.as_ptr(), fops) }
}
