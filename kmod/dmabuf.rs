// SPDX-License-Identifier: GPL-2.0

//! A small DMA-BUF exporter abstraction: a `dma_buf_ops` table built from a Rust
//! [`Exporter`], and safe views of what the dma-buf core hands to it.
//!
//! Together with the floor (`sys/`) this is the only file that touches raw `struct dma_buf`,
//! `struct dma_buf_attachment` and `struct vm_area_struct` pointers; `export.rs` holds
//! peerdirect's exporter logic in safe code.

use crate::{
    hbm::Live,
    p2p::{Route, Verdicts},
    sys,
};
use core::{marker::PhantomData, ptr::NonNull};
use kernel::{
    bindings,
    error::{from_err_ptr, from_result},
    ffi::{c_int, c_void},
    fs::File,
    prelude::*,
    sync::aref::ARef,
    types::Opaque,
};

/// The direction of a DMA mapping, as the importer asked for it.
pub(crate) type DataDirection = bindings::dma_data_direction;

/// An importer's attachment to one of our dma-bufs, for the duration of a callback.
pub(crate) struct Attachment<'a> {
    raw: NonNull<bindings::dma_buf_attachment>,
    _callback: PhantomData<&'a bindings::dma_buf_attachment>,
}

impl Attachment<'_> {
    /// # Safety
    ///
    /// `raw` is an attachment the dma-buf core passed to a callback, valid for `'a`.
    unsafe fn from_raw(raw: *mut bindings::dma_buf_attachment) -> Option<Self> {
        Some(Self {
            raw: NonNull::new(raw)?,
            _callback: PhantomData,
        })
    }

    fn dev(&self) -> *mut bindings::device {
        // SAFETY: `raw` is valid for the callback (type invariant); `dev` is set at attach and
        // never changes.
        unsafe { (*self.raw.as_ptr()).dev }
    }

    /// Whether the importer accepts peer-to-peer (device memory) mappings.
    pub(crate) fn peer2peer(&self) -> bool {
        // SAFETY: as in `dev`; `peer2peer` is set by the core before `attach` is called.
        unsafe { (*self.raw.as_ptr()).peer2peer }
    }

    /// How the importer reaches the HBM device (by bus address or through the host bridge),
    /// `None` when the kernel's P2P rules give no path (or the importer is not a PCI
    /// device). `live` gives the HBM device while it is bound; it is asked only when
    /// `verdicts`, the device's cache, does not know the importer's device (the verdict reads
    /// the HBM device's p2pdma state, which goes with its binding).
    ///
    /// A hit is inlined into the `attach` callback and the miss is called: on a kernel whose
    /// Rust helpers are calls (a GCC-built distro kernel), each call is a large part of what
    /// a hit costs.
    #[inline(always)]
    pub(crate) fn p2p_route<'h>(
        &self,
        verdicts: &Verdicts,
        live: impl FnOnce() -> Result<Live<'h>>,
    ) -> Result<Option<Route>> {
        // Only PCI devices: the cache forgets what the PCI bus notifier tells it of.
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        if !unsafe { sys::pci::dev_is_pci(self.dev()) } {
            return Ok(None);
        }
        match verdicts.get(self.dev() as usize) {
            Some(route) => Ok(route),
            None => self.p2p_route_asked(verdicts, live),
        }
    }

    /// [`Attachment::p2p_route`] when `verdicts` does not know the importer's device: the
    /// kernel's verdict, kept for the next attach.
    #[cold]
    #[inline(never)]
    fn p2p_route_asked<'h>(
        &self,
        verdicts: &Verdicts,
        live: impl FnOnce() -> Result<Live<'h>>,
    ) -> Result<Option<Route>> {
        // Read before the kernel is asked: a device added or deleted from here on makes the
        // verdict asked now one the cache does not keep.
        let generation = verdicts.generation();
        let (device, live) = (self.dev() as usize, live()?);
        // Any distance is a path; how it goes is what map needs.
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        let distance = unsafe { sys::pci::p2p_distance(live.pci_device(), self.dev()) };
        let route = distance.map(|_| Route {
            by_bus_address: self
                .pci_device()
                .is_some_and(|peer| crate::p2p::by_bus_address(live.pci_device(), peer)),
        });
        verdicts.put(device, generation, route);
        Ok(route)
    }

    /// Logs (rate-limited) why an attach from this importer to `hbm` was refused.
    pub(crate) fn log_refused(&self, hbm: &kernel::pci::Device, reason: &CStr) {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { sys::pci::log_refused_attach(hbm, self.dev(), reason) };
    }

    /// Records whether the importer pinned the attachment (for debugfs and removal's log).
    ///
    /// # Safety
    ///
    /// Called from the `pin` or `unpin` callback (the reservation lock is held).
    pub(crate) unsafe fn set_pinned(&self, pinned: bool) {
        // SAFETY: an attachment to one of our dma-bufs (type invariant), lock held (caller).
        unsafe { sys::dma_buf::attach_set_pinned(self.raw.as_ptr(), pinned) }
    }

    /// Records how the importer reaches the HBM device, for `map` ([`Attachment::by_bus_address`]).
    ///
    /// # Safety
    ///
    /// Called from the `attach` callback: the core publishes the attachment (to the buffer's
    /// list, under the reservation lock) only after it returns, so nothing else reads or
    /// writes its word yet.
    pub(crate) unsafe fn set_route(&self, route: Route) {
        // SAFETY: as the caller promises, the word is ours alone for now.
        unsafe { sys::dma_buf::attach_set_by_bus_address(self.raw.as_ptr(), route.by_bus_address) }
    }

    /// Whether the importer reaches the HBM device by bus address, as recorded at attach.
    ///
    /// # Safety
    ///
    /// Called from the `map_dma_buf` or `unmap_dma_buf` callback (the reservation lock is
    /// held).
    pub(crate) unsafe fn by_bus_address(&self) -> bool {
        // SAFETY: as in `set_pinned`.
        unsafe { sys::dma_buf::attach_by_bus_address(self.raw.as_ptr()) }
    }

    /// Counts the DMA segments of a mapping made (`mapped`) or undone on the attachment, for
    /// debugfs: the attachment may hold more than one mapping.
    ///
    /// # Safety
    ///
    /// Called from the `map_dma_buf` or `unmap_dma_buf` callback (the reservation lock is
    /// held).
    pub(crate) unsafe fn count_mapping(&self, entries: u32, mapped: bool) {
        // SAFETY: as in `set_pinned`.
        unsafe { sys::dma_buf::attach_count_mapping(self.raw.as_ptr(), entries, mapped) }
    }

    /// Whether the importer drops its mappings when told to (`dma_buf_attach_revocable`):
    /// false for pinned importers such as EFA memory registrations. Fixed for the
    /// attachment's life (its importer ops are set at attach), so a mapping is uncounted at
    /// unmap as it was counted at map.
    pub(crate) fn is_revocable(&self) -> bool {
        // SAFETY: `raw` is an attachment passed to the callback this runs in (type invariant).
        unsafe { sys::dma_buf::attach_revocable(self.raw.as_ptr()) }
    }

    /// The largest DMA segment the importer's device handles.
    pub(crate) fn max_segment_size(&self) -> u64 {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        u64::from(unsafe { sys::pci::dma_max_seg_size(self.dev()) })
    }

    /// Maps `len` bytes of a BAR at CPU physical address `paddr` (bus address
    /// `paddr + bus_offset`), in segments of at most `seg` bytes (through an IOMMU: as long as
    /// an entry holds), in a table of our own: by bus address when `bus_addr`, else through
    /// the host bridge. `_unrevoked`: the BAR stays while the buffer is not revoked (removal
    /// revokes a device's exports before it returns).
    #[expect(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn map_table(
        &self,
        _unrevoked: &Unrevoked<'_>,
        paddr: u64,
        bus_offset: u64,
        len: u64,
        seg: u64,
        dir: DataDirection,
        bus_addr: bool,
    ) -> Result<SgTable> {
        // The max segment is an `unsigned int`, page aligned by the caller: at most 4 GiB
        // less a page, as an entry's 32-bit length needs.
        debug_assert!(seg > 0 && seg <= u64::from(u32::MAX));
        // The core holds the reservation lock while it maps (map_dma_buf's contract), and the
        // buffer is not revoked (`_unrevoked`), so the BAR stays.
        // SAFETY: so `map_table`'s contract holds; `seg` is non-zero and fits an entry (above).
        unsafe {
            sys::dma_buf::map_table(
                self.raw.as_ptr(),
                paddr,
                bus_offset,
                len,
                seg,
                dir,
                bus_addr,
            )
        }
        .map(SgTable)
    }

    /// Undoes [`Attachment::map_table`].
    #[inline]
    pub(crate) fn unmap_table(&self, sgt: SgTable, dir: DataDirection) {
        // SAFETY: `sgt` came from `map_table` on this attachment, under the reservation lock
        // (unmap_dma_buf's contract).
        unsafe { sys::dma_buf::unmap_table(self.raw.as_ptr(), sgt.0.as_ptr(), dir) }
    }

    /// The importer's PCI device, if it is one.
    pub(crate) fn pci_device(&self) -> Option<sys::pci::PciDev<'_>> {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { sys::pci::pci_dev_of(self.dev()) }
    }
}

/// A scatter-gather table made by [`Attachment::map_table`].
pub(crate) struct SgTable(NonNull<bindings::sg_table>);

impl SgTable {
    /// Number of DMA segments.
    pub(crate) fn entries(&self) -> u32 {
        // The table was returned by `peerdirect_map_table`, and is freed only through
        // `Attachment::unmap_table`, which consumes this.
        // SAFETY: so it is live while this value exists.
        unsafe { (*self.0.as_ptr()).nents }
    }
}

/// The head of every dma-buf's private data, mirrored by `struct peerdirect_cpu_window` in
/// `helpers.h`: the CPU physical range user mappings reach, filled at fault time by the C
/// fault handler and closed by [`revoke`].
#[repr(C)]
struct CpuWindow {
    phys: u64,
    len: u64,
    /// Written and read by C only, under the buffer's reservation lock.
    revoked: Opaque<bool>,
}

/// A dma-buf's private data: the window C reads first, then the exporter.
#[repr(C)]
struct Exported<T> {
    window: CpuWindow,
    exporter: KBox<T>,
}

/// What a dma-buf exporter does; [`DmaBuf::export`] builds the `dma_buf_ops` from it.
pub(crate) trait Exporter: Send + Sync + Sized {
    /// An importer attaches: refuse what cannot work.
    fn attach(&self, attach: &Attachment<'_>) -> Result;
    /// A pinned importer pins (reservation lock held).
    fn pin(&self, _attach: &Attachment<'_>) -> Result {
        Ok(())
    }
    /// A pinned importer unpins (reservation lock held).
    fn unpin(&self, _attach: &Attachment<'_>) {}
    /// Map for the importer's device (reservation lock held); never called once the buffer
    /// is revoked (`ENODEV`).
    fn map(
        &self,
        attach: &Attachment<'_>,
        dir: DataDirection,
        unrevoked: &Unrevoked<'_>,
    ) -> Result<SgTable>;
    /// Undo [`Exporter::map`] (reservation lock held).
    fn unmap(&self, attach: &Attachment<'_>, sgt: SgTable, dir: DataDirection);
    /// May the buffer be mapped for the CPU now? Its window is mapped at fault time, and
    /// [`revoke`] closes it.
    fn mmap(&self) -> Result;
    /// The CPU is about to access the buffer (`DMA_BUF_IOCTL_SYNC` start).
    fn begin_cpu_access(&self) -> Result;
}

/// Proof, for the length of a `map_dma_buf` callback, that the buffer is not revoked and will
/// not be before the callback returns: the core holds the buffer's reservation lock across the
/// callback, and [`revoke`] marks the buffer under that lock. So whatever the exporter tears
/// down only after revoking the buffer is still there while this exists.
pub(crate) struct Unrevoked<'a>(PhantomData<&'a ()>);

/// A dma-buf we exported, holding the one reference to its file until [`DmaBuf::into_file`].
pub(crate) struct DmaBuf {
    raw: NonNull<bindings::dma_buf>,
}

impl DmaBuf {
    /// Exports `exporter` as a dma-buf of `size` bytes, backed for the CPU by the physical
    /// range from `cpu_phys`, writable through mmap if `writable`.
    pub(crate) fn export<T: Exporter>(
        exporter: KBox<T>,
        size: u64,
        cpu_phys: u64,
        writable: bool,
    ) -> Result<Self> {
        let exported = KBox::new(
            Exported {
                window: CpuWindow {
                    phys: cpu_phys,
                    len: size,
                    revoked: Opaque::new(false),
                },
                exporter,
            },
            GFP_KERNEL,
        )?;
        let priv_ = KBox::into_raw(exported);
        let info = bindings::dma_buf_export_info {
            exp_name: c"peerdirect".as_char_ptr(),
            owner: kernel::module::this_module::<crate::LocalModule>().as_ptr(),
            ops: &Ops::<T>::OPS,
            size: usize::try_from(size)?,
            flags: if writable {
                bindings::O_RDWR as c_int
            } else {
                bindings::O_RDONLY as c_int
            },
            resv: core::ptr::null_mut(),
            priv_: priv_.cast::<c_void>(),
        };
        // SAFETY: `info` is fully initialised: ops has map, unmap, release and both pin and
        // unpin, `priv_` is non-null, and the module owning `ops` is ours.
        let raw = unsafe { bindings::dma_buf_export(&info) };
        match from_err_ptr(raw) {
            Ok(raw) => Ok(Self {
                raw: NonNull::new(raw).ok_or(ENOMEM)?,
            }),
            Err(e) => {
                // SAFETY: the export failed, so the core did not take `priv_`: it is still the
                // box we leaked above, and nothing else refers to it.
                drop(unsafe { KBox::from_raw(priv_) });
                Err(e)
            }
        }
    }

    /// An identity for the buffer, for [`revoke`]; valid until its release.
    pub(crate) fn id(&self) -> DmaBufId {
        DmaBufId(self.raw.as_ptr() as usize)
    }

    /// Names the buffer after its device, handle and range (fdinfo's `name:`, debugfs).
    pub(crate) fn set_name(&self, index: u32, handle: u32, offset: u64, len: u64) -> Result {
        // SAFETY: we hold a reference to the dma-buf, and its name is set under its name lock.
        kernel::error::to_result(unsafe {
            sys::dma_buf::dmabuf_set_name(self.raw.as_ptr(), index, handle, offset, len)
        })
    }

    /// The dma-buf's file, carrying the reference this `DmaBuf` held (for `fd_install`).
    pub(crate) fn into_file(self) -> ARef<File> {
        // SAFETY: `raw` is live (we hold a reference) and its `file` is set by `dma_buf_export`.
        let file = unsafe { (*self.raw.as_ptr()).file };
        core::mem::forget(self);
        // A dma-buf's reference is a reference on its file (`dma_buf_put` is `fput`).
        // SAFETY: ours moves into the `ARef`; `File` transparently wraps a non-NULL `file`.
        unsafe { ARef::from_raw(NonNull::new_unchecked(file.cast::<File>())) }
    }
}

impl Drop for DmaBuf {
    fn drop(&mut self) {
        // SAFETY: we hold one reference to the dma-buf (type invariant); this drops it.
        unsafe { bindings::dma_buf_put(self.raw.as_ptr()) };
    }
}

struct Ops<T>(PhantomData<T>);

impl<T: Exporter> Ops<T> {
    const OPS: bindings::dma_buf_ops = bindings::dma_buf_ops {
        attach: Some(Self::attach),
        detach: None,
        pin: Some(Self::pin),
        unpin: Some(Self::unpin),
        map_dma_buf: Some(Self::map),
        unmap_dma_buf: Some(Self::unmap),
        release: Some(Self::release),
        begin_cpu_access: Some(Self::begin_cpu_access),
        end_cpu_access: Some(Self::end_cpu_access),
        mmap: Some(Self::mmap),
        ..pin_init::zeroed()
    };

    /// # Safety
    ///
    /// `dmabuf` is one of ours (made by [`DmaBuf::export`] with these ops) and not released.
    unsafe fn exporter<'a>(dmabuf: *mut bindings::dma_buf) -> &'a T {
        // SAFETY: by the function's contract, `priv_` is the `KBox<Exported<T>>` we leaked at
        // export, freed only in `release`.
        unsafe { &(*(*dmabuf).priv_.cast::<Exported<T>>()).exporter }
    }

    /// # Safety
    ///
    /// `attach` is an attachment to one of our dma-bufs, passed to a callback.
    unsafe fn of_attachment<'a>(attach: *mut bindings::dma_buf_attachment) -> &'a T {
        // SAFETY: an attachment's `dmabuf` is the buffer it is attached to, live while
        // attached.
        unsafe { Self::exporter((*attach).dmabuf) }
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.attach`: the core passes one of our
    /// dma-bufs and a new attachment to it.
    unsafe extern "C" fn attach(
        dmabuf: *mut bindings::dma_buf,
        attach: *mut bindings::dma_buf_attachment,
    ) -> c_int {
        from_result(|| {
            let (exporter, attach) =
                // SAFETY: the core calls `attach` on our dma-buf with a valid attachment.
                unsafe { (Self::exporter(dmabuf), Attachment::from_raw(attach)) };
            exporter.attach(&attach.ok_or(EINVAL)?)?;
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.pin`: the core passes an attachment to
    /// one of our dma-bufs.
    unsafe extern "C" fn pin(attach: *mut bindings::dma_buf_attachment) -> c_int {
        let (exporter, attachment) =
            // SAFETY: the core calls `pin` with an attachment to our dma-buf.
            unsafe { (Self::of_attachment(attach), Attachment::from_raw(attach)) };
        from_result(|| {
            exporter.pin(&attachment.ok_or(EINVAL)?)?;
            Ok(0)
        })
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.unpin`: the core passes an attachment
    /// to one of our dma-bufs.
    unsafe extern "C" fn unpin(attach: *mut bindings::dma_buf_attachment) {
        let (exporter, attachment) =
            // SAFETY: the core calls `unpin` with an attachment to our dma-buf.
            unsafe { (Self::of_attachment(attach), Attachment::from_raw(attach)) };
        if let Some(attachment) = attachment {
            exporter.unpin(&attachment);
        }
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.map_dma_buf`: the core passes an attachment to one of our dma-bufs, with
    /// its reservation lock held.
    unsafe extern "C" fn map(
        attach: *mut bindings::dma_buf_attachment,
        dir: DataDirection,
    ) -> *mut bindings::sg_table {
        let (exporter, attachment) =
            // SAFETY: the core calls `map_dma_buf` with an attachment to our dma-buf.
            unsafe { (Self::of_attachment(attach), Attachment::from_raw(attach)) };
        let Some(attachment) = attachment else {
            return EINVAL.to_ptr();
        };
        // The core holds the reservation lock across this callback.
        // SAFETY: the attachment's buffer is ours, so its `priv_` starts with a `CpuWindow`,
        // whose `revoked` is written only under that lock.
        let revoked = unsafe {
            let exported = (*(*attach).dmabuf).priv_.cast::<Exported<T>>();
            *(*exported).window.revoked.get()
        };
        if revoked {
            return ENODEV.to_ptr();
        }
        // Revocation waits for the lock the core holds until we return.
        let unrevoked = Unrevoked(PhantomData);
        match exporter.map(&attachment, dir, &unrevoked) {
            Ok(sgt) => sgt.0.as_ptr(),
            Err(e) => e.to_ptr(),
        }
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.unmap_dma_buf`: the core passes an attachment to one of our dma-bufs and a
    /// table `map` returned for it, with the reservation lock held.
    unsafe extern "C" fn unmap(
        attach: *mut bindings::dma_buf_attachment,
        sgt: *mut bindings::sg_table,
        dir: DataDirection,
    ) {
        let (exporter, attachment) =
            // SAFETY: the core unmaps an attachment to our dma-buf, with a table `map` made.
            unsafe { (Self::of_attachment(attach), Attachment::from_raw(attach)) };
        if let (Some(attachment), Some(sgt)) = (attachment, NonNull::new(sgt)) {
            exporter.unmap(&attachment, SgTable(sgt), dir);
        }
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.release`: the core passes one of our dma-bufs after its last reference is
    /// gone; no other callback runs for it afterwards.
    unsafe extern "C" fn release(dmabuf: *mut bindings::dma_buf) {
        // SAFETY: `release` is the last callback for our dma-buf: its `priv_` is the
        // `KBox<Exported<T>>` leaked at export, and nothing uses it after this.
        drop(unsafe { KBox::from_raw((*dmabuf).priv_.cast::<Exported<T>>()) });
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.begin_cpu_access`: the core passes one of our live dma-bufs.
    unsafe extern "C" fn begin_cpu_access(
        dmabuf: *mut bindings::dma_buf,
        _dir: DataDirection,
    ) -> c_int {
        // SAFETY: the core calls this on our live dma-buf.
        let exporter = unsafe { Self::exporter(dmabuf) };
        from_result(|| exporter.begin_cpu_access().map(|()| 0))
    }

    // A write-combined BAR mapping has no CPU cache to write back.
    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.end_cpu_access`: the core passes one of our live dma-bufs.
    unsafe extern "C" fn end_cpu_access(
        _dmabuf: *mut bindings::dma_buf,
        _dir: DataDirection,
    ) -> c_int {
        0
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.mmap`: the core passes one of our live dma-bufs and the VMA being set up.
    unsafe extern "C" fn mmap(
        dmabuf: *mut bindings::dma_buf,
        vma: *mut bindings::vm_area_struct,
    ) -> c_int {
        // SAFETY: the core calls this on our live dma-buf with the VMA being set up.
        let exporter = unsafe { Self::exporter(dmabuf) };
        from_result(|| {
            exporter.mmap()?;
            // SAFETY: `dmabuf` is ours (its `priv_` starts with a `CpuWindow`) and `vma` is
            // being set up under the mmap lock for it.
            kernel::error::to_result(unsafe { sys::dma_buf::dmabuf_mmap(dmabuf, vma) })?;
            Ok(0)
        })
    }
}

/// Names one of our dma-bufs without holding a reference (its address).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct DmaBufId(usize);

/// Closes the CPU window of the buffer `id`, makes later maps of it fail with `ENODEV`,
/// invalidates every importer mapping of it and zaps its CPU mappings. A buffer whose release
/// is under way is left alone (nothing holds it any more): then `false`.
///
/// # Safety
///
/// `id` names a dma-buf we exported whose release has not completed: the caller holds the
/// lock under which the buffer's release unregisters it, so its memory stays valid (even if
/// its file is already being released).
/// The caller does not hold the buffer's reservation lock.
pub(crate) unsafe fn revoke(id: DmaBufId) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { sys::dma_buf::dmabuf_revoke(id.0 as *mut bindings::dma_buf) }
}

/// Describes up to `out.len()` of the importers attached to the dma-buf `id`; returns how many
/// there are.
///
/// # Safety
///
/// As for [`revoke`].
pub(crate) unsafe fn attachments(id: DmaBufId, out: &mut [sys::dma_buf::AttachInfo]) -> usize {
    // SAFETY: forwarded from the caller.
    unsafe { sys::dma_buf::dmabuf_attachments(id.0 as *mut bindings::dma_buf, out) }
}
