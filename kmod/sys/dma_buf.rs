// SPDX-License-Identifier: GPL-2.0

//! A DMA-BUF exporter abstraction: a `dma_buf_ops` table built from a Rust [`Exporter`], safe
//! views of what the dma-buf core hands to its callbacks, typed by what each callback may do
//! ([`Attaching`] in `attach`, [`Locked`] under the buffer's reservation lock), and our
//! dma-bufs as the C helpers handle them: the peer and host-bridge tables of a mapping, the CPU
//! mapping (a window filled at fault time and closed by [`Listed::revoke`]), naming, the
//! [`Registry`] of an exporter's buffers that are not released yet (through which they are
//! revoked and their attachments listed), and the exporter-private word of an attachment.
//!
//! It knows nothing of peerdirect's types: `export.rs` implements [`Exporter`] in safe code,
//! and `p2p.rs` decides an importer's route from what [`Attachment`] tells of its device.

use super::{pci, raw, util::from_err_ptr};
use core::{marker::PhantomData, ops::Deref, ptr::NonNull};
use kernel::{
    bindings,
    error::from_result,
    ffi::{c_int, c_void},
    fs::File,
    new_mutex,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
    sync::{aref::ARef, Arc, Mutex, MutexGuard},
    types::Opaque,
    ThisModule,
};

/// The module this code is built into (C's `THIS_MODULE`), as `module!` makes the crate
/// root's: the floor cannot name the root, which names everything above the floor.
fn this_module() -> &'static ThisModule {
    #[cfg(MODULE)]
    static THIS: ThisModule = {
        let this = core::ptr::addr_of!(bindings::__this_module).cast_mut();
        // SAFETY: `__this_module` is this module's `struct module` (modpost defines it in the
        // module's `.mod.c`), made at load and freed only once its code is gone.
        unsafe { ThisModule::from_ptr(this) }
    };
    #[cfg(not(MODULE))]
    static THIS: ThisModule = {
        // SAFETY: built into the kernel, the code has no module: NULL, as C's `THIS_MODULE`.
        unsafe { ThisModule::from_ptr(core::ptr::null_mut()) }
    };
    &THIS
}

pub(crate) use super::raw::AttachInfo;

/// The direction of a DMA mapping, as the importer asked for it.
pub(crate) type DataDirection = bindings::dma_data_direction;

/// An importer's attachment to one of our dma-bufs, for the duration of a callback.
///
/// # Invariants
///
/// `raw` is an attachment to one of our dma-bufs that the dma-buf core passed to the callback
/// this value lives in: it, its buffer and the importer's device are valid for `'a`.
pub(crate) struct Attachment<'a> {
    raw: NonNull<bindings::dma_buf_attachment>,
    _callback: PhantomData<&'a bindings::dma_buf_attachment>,
}

impl Attachment<'_> {
    /// # Safety
    ///
    /// `raw` is an attachment to one of our dma-bufs that the core passed to a callback, valid
    /// for `'a`.
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

    /// The importer's device as a key: the address of its `struct device`, the same for
    /// every attachment of that device while it exists; a multiple of
    /// [`IMPORTER_KEY_ALIGN`].
    pub(crate) fn importer_key(&self) -> usize {
        self.dev() as usize
    }

    /// Whether the importer is a PCI device.
    pub(crate) fn importer_is_pci(&self) -> bool {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { pci::dev_is_pci(self.dev()) }
    }

    /// The kernel's P2P distance between the PCI device `provider` and the importer
    /// (`pci_p2pdma_distance_many`); `None` when its rules give no path.
    pub(crate) fn p2p_distance_from(&self, provider: &kernel::pci::Device) -> Option<u32> {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { pci::p2p_distance(provider, self.dev()) }
    }

    /// Logs (rate-limited) why an attach from this importer to `hbm` was refused.
    pub(crate) fn log_refused(&self, hbm: &kernel::pci::Device, reason: &CStr) {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { pci::log_refused_attach(hbm, self.dev(), reason) };
    }

    /// Whether the importer drops its mappings when told to (`dma_buf_attach_revocable`):
    /// false for pinned importers such as EFA memory registrations. Fixed for the
    /// attachment's life (its importer ops are set at attach), so a mapping is uncounted at
    /// unmap as it was counted at map.
    pub(crate) fn is_revocable(&self) -> bool {
        // SAFETY: `raw` is an attachment passed to the callback this runs in (type invariant).
        unsafe { attach_revocable(self.raw.as_ptr()) }
    }

    /// The largest DMA segment the importer's device handles.
    pub(crate) fn max_segment_size(&self) -> u64 {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        u64::from(unsafe { pci::dma_max_seg_size(self.dev()) })
    }

    /// The importer's PCI device, if it is one.
    pub(crate) fn pci_device(&self) -> Option<pci::PciDev<'_>> {
        // SAFETY: the importer's device is valid while the attachment is (type invariant).
        unsafe { pci::pci_dev_of(self.dev()) }
    }
}

/// An attachment in the exporter's `attach` callback. The core publishes it (to the buffer's
/// list, under the reservation lock) only after the callback returns, so its exporter-private
/// word is the callback's alone.
pub(crate) struct Attaching<'a>(Attachment<'a>);

impl<'a> Deref for Attaching<'a> {
    type Target = Attachment<'a>;

    fn deref(&self) -> &Attachment<'a> {
        &self.0
    }
}

impl Attaching<'_> {
    /// Records whether the importer reaches the HBM device by bus address, for `map`
    /// ([`Locked::by_bus_address`]).
    pub(crate) fn set_by_bus_address(&self, by_bus_address: bool) {
        // SAFETY: an attachment to one of our dma-bufs (type invariant) in its `attach`
        // callback: not yet published, its word is ours alone.
        unsafe { attach_set_by_bus_address(self.raw.as_ptr(), by_bus_address) }
    }
}

/// An attachment in a callback the core runs under its buffer's reservation lock (`pin`,
/// `unpin`, `map_dma_buf`, `unmap_dma_buf`).
pub(crate) struct Locked<'a>(Attachment<'a>);

impl<'a> Deref for Locked<'a> {
    type Target = Attachment<'a>;

    fn deref(&self) -> &Attachment<'a> {
        &self.0
    }
}

impl Locked<'_> {
    /// Records whether the importer pinned the attachment (for debugfs and removal's log).
    pub(crate) fn set_pinned(&self, pinned: bool) {
        // SAFETY: an attachment to one of our dma-bufs (type invariant), its reservation lock
        // held (this type's).
        unsafe { attach_set_pinned(self.raw.as_ptr(), pinned) }
    }

    /// Whether the importer reaches the HBM device by bus address, as recorded at attach.
    pub(crate) fn by_bus_address(&self) -> bool {
        // SAFETY: as in `set_pinned`.
        unsafe { attach_by_bus_address(self.raw.as_ptr()) }
    }

    /// Counts the DMA segments of a mapping made (`mapped`) or undone on the attachment, for
    /// debugfs: the attachment may hold more than one mapping.
    pub(crate) fn count_mapping(&self, entries: u32, mapped: bool) {
        // SAFETY: as in `set_pinned`.
        unsafe { attach_count_mapping(self.raw.as_ptr(), entries, mapped) }
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
        // The reservation lock is held (this type's) and the buffer is not revoked
        // (`_unrevoked`), so the BAR stays.
        // SAFETY: so `map_table`'s contract holds; `seg` is non-zero and fits an entry (above).
        unsafe {
            map_table(
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

    /// Undoes [`Locked::map_table`].
    #[inline]
    pub(crate) fn unmap_table(&self, sgt: SgTable, dir: DataDirection) {
        // SAFETY: `sgt` came from `map_table` on this attachment (it is made nowhere else), and
        // the reservation lock is held (this type's).
        unsafe { unmap_table(self.raw.as_ptr(), sgt.0.as_ptr(), dir) }
    }
}

/// A scatter-gather table made by [`Locked::map_table`].
pub(crate) struct SgTable(NonNull<bindings::sg_table>);

impl SgTable {
    /// Number of DMA segments.
    pub(crate) fn entries(&self) -> u32 {
        // The table was returned by `peerdirect_map_table`, and is freed only through
        // `Locked::unmap_table`, which consumes this.
        // SAFETY: so it is live while this value exists.
        unsafe { (*self.0.as_ptr()).nents }
    }
}

/// The head of every dma-buf's private data, mirrored by `struct peerdirect_cpu_window` in
/// `helpers.h`: the CPU physical range user mappings reach, filled at fault time by the C
/// fault handler and closed by [`Listed::revoke`].
#[repr(C)]
struct CpuWindow {
    phys: u64,
    len: u64,
    /// The device whose BAR the range is in: a fault maps nothing while it does not decode
    /// memory. The exporter holds a reference on it for as long as the buffer lives.
    pdev: *mut bindings::pci_dev,
    /// Where the BAR the range is in was found: a fault maps nothing once it is elsewhere.
    place: pci::BarPlace,
    /// Written and read by C only, under the buffer's reservation lock.
    revoked: Opaque<bool>,
    /// The kernel's mapping of the range (vmap), made by C at the first vmap and undone at
    /// revocation or release; written and read by C only, under the reservation lock.
    kmap: Opaque<*mut c_void>,
}

// The layout `struct peerdirect_cpu_window` has (helpers/dma_buf.c asserts the same numbers).
const _: () = assert!(core::mem::offset_of!(CpuWindow, place) == 24);
const _: () = assert!(core::mem::offset_of!(CpuWindow, revoked) == 56);
const _: () = assert!(core::mem::offset_of!(CpuWindow, kmap) == 64);

/// A dma-buf's private data: the window C reads first, then the exporter and the registry
/// that lists the buffer until its release.
#[repr(C)]
struct Exported<T: Exporter> {
    window: CpuWindow,
    registry: Arc<Registry<T::Record>>,
    exporter: KBox<T>,
}

/// What a dma-buf exporter does; [`DmaBuf::export`] builds the `dma_buf_ops` from it.
pub(crate) trait Exporter: Send + Sync + Sized {
    /// What the exporter's [`Registry`] keeps of each buffer.
    type Record: Send + Unpin;
    /// An importer attaches: refuse what cannot work.
    fn attach(&self, attach: &Attaching<'_>) -> Result;
    /// A pinned importer pins.
    fn pin(&self, _attach: &Locked<'_>) -> Result {
        Ok(())
    }
    /// A pinned importer unpins.
    fn unpin(&self, _attach: &Locked<'_>) {}
    /// Map for the importer's device; never called once the buffer is revoked (`ENODEV`).
    fn map(
        &self,
        attach: &Locked<'_>,
        dir: DataDirection,
        unrevoked: &Unrevoked<'_>,
    ) -> Result<SgTable>;
    /// Undo [`Exporter::map`].
    fn unmap(&self, attach: &Locked<'_>, sgt: SgTable, dir: DataDirection);
    /// May the buffer be mapped for the CPU now? Its window is mapped at fault time, and
    /// [`Listed::revoke`] closes it.
    fn mmap(&self) -> Result;
    /// The CPU is about to access the buffer (`DMA_BUF_IOCTL_SYNC` start).
    fn begin_cpu_access(&self) -> Result;
    /// May the kernel map the buffer now (`vmap`, under the reservation lock)? Never asked
    /// once the buffer is revoked (`ENODEV`); the mapping itself is the floor's, undone by
    /// [`Listed::revoke`] or at release.
    fn vmap(&self, unrevoked: &Unrevoked<'_>) -> Result;
}

/// Proof, for the length of a `map_dma_buf` callback, that the buffer is not revoked and will
/// not be before the callback returns: the core holds the buffer's reservation lock across the
/// callback, and [`Listed::revoke`] marks the buffer under that lock. So whatever the exporter tears
/// down only after revoking the buffer is still there while this exists.
pub(crate) struct Unrevoked<'a>(PhantomData<&'a ()>);

/// A dma-buf we exported, holding the one reference to its file until [`DmaBuf::into_file`].
pub(crate) struct DmaBuf {
    raw: NonNull<bindings::dma_buf>,
    /// The registry its release leaves ([`Registry::key`]).
    registry: usize,
}

impl DmaBuf {
    /// Exports `exporter` as a dma-buf of `size` bytes, backed for the CPU by the physical
    /// range from `cpu_phys` in a BAR of `device` (which `exporter` keeps a reference on)
    /// found at `place` (CPU faults map nothing once it is elsewhere), writable through mmap
    /// if `writable`, to be listed in `registry`
    /// ([`RegistryGuard::insert`]), which its release leaves. The buffer holds the module
    /// this code is built into, whose code its ops are, while it exists.
    pub(crate) fn export<T: Exporter>(
        exporter: KBox<T>,
        size: u64,
        cpu_phys: u64,
        device: &kernel::pci::Device,
        place: pci::BarPlace,
        writable: bool,
        registry: &Arc<Registry<T::Record>>,
    ) -> Result<Self> {
        let exported = KBox::new(
            Exported {
                window: CpuWindow {
                    phys: cpu_phys,
                    len: size,
                    pdev: pci::raw_pci_dev(device),
                    place,
                    revoked: Opaque::new(false),
                    kmap: Opaque::new(core::ptr::null_mut()),
                },
                registry: registry.clone(),
                exporter,
            },
            GFP_KERNEL,
        )?;
        let priv_ = KBox::into_raw(exported);
        let info = bindings::dma_buf_export_info {
            exp_name: c"peerdirect".as_char_ptr(),
            owner: this_module().as_ptr(),
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
        // unpin, `priv_` is non-null, and `owner` is the module whose code `ops` runs.
        let raw = unsafe { bindings::dma_buf_export(&info) };
        match from_err_ptr(raw) {
            Ok(raw) => Ok(Self {
                raw,
                registry: registry.key(),
            }),
            Err(e) => {
                // SAFETY: the export failed, so the core did not take `priv_`: it is still the
                // box we leaked above, and nothing else refers to it.
                drop(unsafe { KBox::from_raw(priv_) });
                Err(e)
            }
        }
    }

    /// Names the buffer after its device, handle and range (fdinfo's `name:`, debugfs).
    pub(crate) fn set_name(&self, index: u32, handle: u32, offset: u64, len: u64) -> Result {
        // SAFETY: we hold a reference to the dma-buf, and its name is set under its name lock.
        kernel::error::to_result(unsafe {
            dmabuf_set_name(self.raw.as_ptr(), index, handle, offset, len)
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
        vmap: Some(Self::vmap),
        vunmap: Some(Self::vunmap),
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
            // Not yet published: the core adds it to the buffer's list once this returns.
            exporter.attach(&Attaching(attach.ok_or(EINVAL)?))?;
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
        // The core pins under the reservation lock (`dma_buf_pin`).
        from_result(|| {
            exporter.pin(&Locked(attachment.ok_or(EINVAL)?))?;
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
        // The core unpins under the reservation lock (`dma_buf_unpin`).
        if let Some(attachment) = attachment {
            exporter.unpin(&Locked(attachment));
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
        match exporter.map(&Locked(attachment), dir, &unrevoked) {
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
        // The core unmaps under the reservation lock, as it maps.
        if let (Some(attachment), Some(sgt)) = (attachment, NonNull::new(sgt)) {
            exporter.unmap(&Locked(attachment), SgTable(sgt), dir);
        }
    }

    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.release`: the core passes one of our dma-bufs after its last reference is
    /// gone; no other callback runs for it afterwards.
    unsafe extern "C" fn release(dmabuf: *mut bindings::dma_buf) {
        // SAFETY: `release` is the last callback for our dma-buf: its `priv_` is the
        // `KBox<Exported<T>>` leaked at export, and nothing uses it after this.
        let exported = unsafe { KBox::from_raw((*dmabuf).priv_.cast::<Exported<T>>()) };
        // SAFETY: the buffer is ours (its `priv_` starts with its `CpuWindow`, still allocated
        // in `exported`) and nothing maps it any more: its last reference is gone.
        unsafe { raw::peerdirect_dmabuf_kmap_release(dmabuf) };
        // Out of the registry before the core frees the buffer: what the registry lists, under
        // its lock, is still allocated (`Listed`).
        exported.registry.buffers.lock().remove(&(dmabuf as usize));
        drop(exported);
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
        // SAFETY: our live dma-buf, whose `priv_` starts with its `CpuWindow`; no lock held.
        if unsafe { raw::peerdirect_dmabuf_revoked(dmabuf) } {
            return ENODEV.to_errno();
        }
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
            kernel::error::to_result(unsafe { dmabuf_mmap(dmabuf, vma) })?;
            Ok(0)
        })
    }
}

impl<T: Exporter> Ops<T> {
    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.vmap`: the core passes one of our live
    /// dma-bufs, with its reservation lock held, and the map to fill.
    unsafe extern "C" fn vmap(
        dmabuf: *mut bindings::dma_buf,
        map: *mut bindings::iosys_map,
    ) -> c_int {
        // SAFETY: the core calls this on our live dma-buf.
        let exporter = unsafe { Self::exporter(dmabuf) };
        // The core holds the reservation lock across this callback (`dma_buf_vmap`).
        // SAFETY: the buffer is ours, so its `priv_` starts with a `CpuWindow`, whose
        // `revoked` is written only under that lock.
        let revoked = unsafe {
            let exported = (*dmabuf).priv_.cast::<Exported<T>>();
            *(*exported).window.revoked.get()
        };
        if revoked {
            return ENODEV.to_errno();
        }
        // Revocation waits for the lock the core holds until we return, and undoes the
        // mapping under it.
        let unrevoked = Unrevoked(PhantomData);
        from_result(|| {
            exporter.vmap(&unrevoked)?;
            // SAFETY: our live, unrevoked dma-buf under its reservation lock (above); `map` is
            // the core's to fill.
            kernel::error::to_result(unsafe { raw::peerdirect_dmabuf_vmap(dmabuf, map) })?;
            Ok(0)
        })
    }

    // The kernel mapping stays until revocation or release (`peerdirect_dmabuf_vmap`): an
    // importer that vmaps around every copy does not remap the range each time.
    /// # Safety
    ///
    /// Only called by the dma-buf core as `dma_buf_ops.vunmap`: the core passes one of our live
    /// dma-bufs, with its reservation lock held.
    unsafe extern "C" fn vunmap(_dmabuf: *mut bindings::dma_buf, _map: *mut bindings::iosys_map) {}
}

/// What every [`Attachment::importer_key`] is a multiple of (the alignment of a
/// `struct device`): its low bits are free for a user's tag.
// Used in build-time assertions (`const _`), which rustc 1.85's dead-code lint does not count.
#[allow(dead_code)]
pub(crate) const IMPORTER_KEY_ALIGN: usize = core::mem::align_of::<bindings::device>();

/// An exporter's dma-bufs that are not released yet, each with a record: a buffer exported
/// for this registry ([`DmaBuf::export`]) enters when [`RegistryGuard::insert`] records it,
/// and leaves in its release, under this lock, before the dma-buf core frees it. So under the
/// lock every buffer listed is still allocated (its file may be being released): it can be
/// revoked and its attachments read ([`Listed`]).
#[pin_data]
pub(crate) struct Registry<V> {
    #[pin]
    buffers: Mutex<RBTree<usize, V>>,
}

impl<V> Registry<V> {
    /// What tells a registry from another: its address, kept alive by every buffer exported
    /// for it (its `Exported` holds an `Arc`), so no other registry has it while such a buffer
    /// exists.
    fn key(&self) -> usize {
        core::ptr::from_ref(self) as usize
    }

    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            buffers <- new_mutex!(RBTree::new(), "dma_buf::Registry::buffers"),
        })
    }

    /// Locks the registry: while the guard lives no listed buffer is freed.
    pub(crate) fn lock(&self) -> RegistryGuard<'_, V> {
        RegistryGuard {
            buffers: self.buffers.lock(),
            key: self.key(),
        }
    }
}

/// A locked [`Registry`].
pub(crate) struct RegistryGuard<'a, V> {
    buffers: MutexGuard<'a, RBTree<usize, V>>,
    /// The registry's [`Registry::key`].
    key: usize,
}

impl<V: Unpin> RegistryGuard<'_, V> {
    /// Lists `buf` with `record` (`node` holds its place); `EINVAL` for a buffer exported for
    /// another registry, whose release would not take it out of this one.
    pub(crate) fn insert(
        &mut self,
        buf: &DmaBuf,
        record: V,
        node: RBTreeNodeReservation<usize, V>,
    ) -> Result {
        if buf.registry != self.key {
            return Err(EINVAL);
        }
        self.buffers
            .insert(node.into_node(buf.raw.as_ptr() as usize, record));
        Ok(())
    }

    /// The buffers listed, with their records.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Listed<'_, V>> {
        self.buffers
            .iter()
            .map(|(&buf, record)| Listed { buf, record })
    }
}

/// A buffer of a locked [`Registry`]: allocated, and not freed while the borrow lasts.
pub(crate) struct Listed<'a, V> {
    /// The `struct dma_buf`'s address.
    buf: usize,
    record: &'a V,
}

impl<V> Listed<'_, V> {
    /// What the exporter recorded of the buffer.
    pub(crate) fn record(&self) -> &V {
        self.record
    }

    /// Closes the buffer's CPU window, makes later maps of it fail with `ENODEV`, invalidates
    /// every importer mapping of it and zaps its CPU mappings. A buffer whose release is under
    /// way is left alone (nothing holds it any more): then `false`. Takes the buffer's
    /// reservation lock: not to be called under it (that would deadlock).
    pub(crate) fn revoke(&self) -> bool {
        // SAFETY: the buffer is allocated while the registry is locked (`Registry`), which
        // the borrow of its guard ensures.
        unsafe { dmabuf_revoke(self.buf as *mut bindings::dma_buf) }
    }

    /// Describes up to `out.len()` of the importers attached to the buffer; returns how many
    /// there are. Takes the buffer's reservation lock, as [`Listed::revoke`] does.
    pub(crate) fn attachments(&self, out: &mut [AttachInfo]) -> usize {
        // SAFETY: as in `revoke`.
        unsafe { dmabuf_attachments(self.buf as *mut bindings::dma_buf, out) }
    }
}

// The C helpers' side: what the abstraction above calls.

/// Whether `attach`'s importer drops its mappings when told to (the kernel's
/// `dma_buf_attach_revocable()`, read here rather than through a call: map asks it every
/// time).
///
/// # Safety
///
/// `attach` is an attachment passed to one of our callbacks, during that callback.
unsafe fn attach_revocable(attach: *mut bindings::dma_buf_attachment) -> bool {
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
/// 4 GiB less a page; the BAR stays (the buffer is not revoked: [`Unrevoked`]).
unsafe fn map_table(
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
unsafe fn unmap_table(
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
unsafe fn dmabuf_mmap(dmabuf: *mut bindings::dma_buf, vma: *mut bindings::vm_area_struct) -> c_int {
    // SAFETY: forwarded from the caller.
    unsafe { raw::peerdirect_dmabuf_mmap(dmabuf, vma) }
}

/// Names a dma-buf.
///
/// # Safety
///
/// The caller holds a reference to `dmabuf`.
unsafe fn dmabuf_set_name(
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
/// release had begun (then it is left alone). Takes its reservation lock (a caller holding it
/// would deadlock).
///
/// # Safety
///
/// `dmabuf` is one of ours whose memory is valid for the call (see [`Registry`]).
unsafe fn dmabuf_revoke(dmabuf: *mut bindings::dma_buf) -> bool {
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
unsafe fn attach_set_pinned(attach: *mut bindings::dma_buf_attachment, pinned: bool) {
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
unsafe fn attach_set_by_bus_address(
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
unsafe fn attach_by_bus_address(attach: *mut bindings::dma_buf_attachment) -> bool {
    // SAFETY: as in `update_attach_word`.
    unsafe { (*attach).priv_.addr() & ATTACH_BUS_ADDR != 0 }
}

/// Adds (`mapped`) or takes away the DMA segments of one of `attach`'s mappings to or from
/// those its word counts.
///
/// # Safety
///
/// As for [`attach_set_pinned`], from the `map_dma_buf` or `unmap_dma_buf` callback.
unsafe fn attach_count_mapping(
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
/// Takes its reservation lock, as [`dmabuf_revoke`] does.
///
/// # Safety
///
/// As for [`dmabuf_revoke`]: `dmabuf` is one of ours whose memory is valid for the call.
unsafe fn dmabuf_attachments(dmabuf: *mut bindings::dma_buf, out: &mut [AttachInfo]) -> usize {
    // SAFETY: forwarded from the caller; `out` is valid for writes of `out.len()` entries,
    // whose layout `AttachInfo` mirrors.
    unsafe { raw::peerdirect_dmabuf_attachments(dmabuf, out.as_mut_ptr(), out.len()) }
}
