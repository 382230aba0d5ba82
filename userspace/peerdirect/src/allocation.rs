//! A range of HBM allocated through an open device file, and its export as DMA-BUF.

use std::mem::ManuallyDrop;

use crate::error::Operation;
use crate::sys::{RawAlloc, RawExport};
use crate::{Device, DmaBuf, Error, ExportFlags};

/// HBM allocated with [`Device::alloc`]: freed when dropped (errors ignored) or with
/// [`Allocation::free`], and in any case when its file is closed.
///
/// Dma-bufs exported from it keep the memory for as long as they exist, freed or not.
#[derive(Debug)]
pub struct Allocation<'d> {
    device: &'d Device,
    handle: u32,
    hbm_offset: u64,
    length: u64,
}

impl<'d> Allocation<'d> {
    pub(crate) fn new(device: &'d Device, handle: u32, hbm_offset: u64, length: u64) -> Self {
        Self {
            device,
            handle,
            hbm_offset,
            length,
        }
    }

    /// The device file it belongs to.
    pub fn device(&self) -> &'d Device {
        self.device
    }

    /// Names the allocation in commands on its file; never 0.
    pub fn handle(&self) -> u32 {
        self.handle
    }

    /// Where the allocation starts in the HBM BAR.
    pub fn hbm_offset(&self) -> u64 {
        self.hbm_offset
    }

    /// Its length in bytes: what was asked for, rounded up to the page size.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Exports bytes `offset..offset + length` of the allocation as a dma-buf
    /// (`PEERDIRECT_IOC_EXPORT`). Both must be multiples of the page size; `length` 0 means up
    /// to the end.
    pub fn export(&self, offset: u64, length: u64, flags: ExportFlags) -> Result<DmaBuf, Error> {
        let mut raw = RawExport::<0>::new();
        raw.export.handle = self.handle;
        raw.export.offset = offset;
        raw.export.length = length;
        raw.export.flags = flags.bits();
        self.device.export_raw(&mut raw)
    }

    /// Frees the allocation (`PEERDIRECT_IOC_FREE`). Dma-bufs exported from it keep working;
    /// the module reuses the memory once they are gone too.
    pub fn free(self) -> Result<(), Error> {
        let this = ManuallyDrop::new(self);
        this.device.free_handle(this.handle)
    }

    /// Gives up ownership without freeing: the allocation lives until its file is closed, or
    /// until someone frees `handle` on that file ([`Device::free_raw`]).
    pub fn into_handle(self) -> u32 {
        ManuallyDrop::new(self).handle
    }
}

// Here rather than in device.rs: an `Allocation` borrows its `Device`, so this file is above
// that one, and only it may name both.
impl Device {
    /// Allocates `length` bytes of HBM (`PEERDIRECT_IOC_ALLOC`), rounded up to the page size,
    /// aligned to `align` in the BAR (a power of two of at least the page size; `None` for the
    /// module's default, 2 MiB).
    ///
    /// The allocation belongs to this open file: it is freed when the [`Allocation`] is dropped
    /// or freed, or at the latest when the file is closed. Its memory goes back to the module
    /// once every dma-buf exported from it is gone too.
    pub fn alloc(&self, length: u64, align: Option<u64>) -> Result<Allocation<'_>, Error> {
        let mut raw = RawAlloc::<0>::new();
        raw.alloc.length = length;
        raw.alloc.align = align.unwrap_or(0);
        self.alloc_raw(&mut raw)?;
        if raw.alloc.handle == 0 {
            return Err(self.invalid_reply(Operation::Alloc, "handle", 0));
        }
        Ok(Allocation::new(
            self,
            raw.alloc.handle,
            raw.alloc.hbm_offset,
            raw.alloc.length,
        ))
    }
}

impl Drop for Allocation<'_> {
    fn drop(&mut self) {
        // Closing the file frees it anyway; nothing better to do with an error here.
        let _ = self.device.free_handle(self.handle);
    }
}
