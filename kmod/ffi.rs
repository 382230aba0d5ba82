// SPDX-License-Identifier: GPL-2.0

//! The module's only raw FFI: the C helpers in `helpers.c` and raw access to `struct pci_dev`.
//!
//! Everything here is wrapped once in a safe function; no other file declares `extern "C"` or
//! touches a raw pointer.

use crate::uapi::PEERDIRECT_DRIVER_NAME_LEN;
use core::{marker::PhantomData, ptr::NonNull};
use kernel::{
    bindings, ffi::c_int, mm::virt::VmaNew, page::Page, pci, prelude::*, sync::aref::ARef,
};

mod raw {
    use kernel::{
        bindings,
        ffi::{c_char, c_int},
    };

    // Declared in helpers.h; the signatures must match it. `improper_ctypes` fires because
    // bindgen renders a flexible array inside `struct pci_dev` as a field-less struct; only
    // pointers to it cross the boundary, never values.
    #[allow(improper_ctypes)]
    extern "C" {
        pub(super) fn peerdirect_pci_bus_address(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
        pub(super) fn peerdirect_pci_domain(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn peerdirect_pci_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
        pub(super) fn peerdirect_pci_bar_is_mem(pdev: *mut bindings::pci_dev, bar: c_int) -> bool;
        pub(super) fn peerdirect_pci_reserve_wc(pdev: *mut bindings::pci_dev, bar: c_int) -> c_int;
        pub(super) fn peerdirect_pci_dev_id(pdev: *mut bindings::pci_dev) -> u16;
        pub(super) fn peerdirect_pci_upstream_bridge(
            pdev: *mut bindings::pci_dev,
        ) -> *mut bindings::pci_dev;
        pub(super) fn peerdirect_pci_acs_redirects(bridge: *mut bindings::pci_dev) -> bool;
        pub(super) fn peerdirect_pci_same_host_bridge(
            a: *mut bindings::pci_dev,
            b: *mut bindings::pci_dev,
        ) -> bool;
        pub(super) fn peerdirect_pci_host_bridge_ids(pdev: *mut bindings::pci_dev) -> u32;
        pub(super) fn peerdirect_pci_iommu_mapped(pdev: *mut bindings::pci_dev) -> bool;
        pub(super) fn peerdirect_pci_bound_to(
            pdev: *mut bindings::pci_dev,
            driver: *const c_char,
        ) -> bool;
        pub(super) fn peerdirect_pci_driver_name(
            pdev: *mut bindings::pci_dev,
            name: *mut u8,
            len: usize,
        );
        pub(super) fn peerdirect_pci_device_lock(pdev: *mut bindings::pci_dev);
        pub(super) fn peerdirect_pci_device_unlock(pdev: *mut bindings::pci_dev);
        pub(super) fn peerdirect_capable_sys_admin() -> bool;
        pub(super) fn peerdirect_pci_notifier_register() -> c_int;
        pub(super) fn peerdirect_pci_notifier_unregister();
        pub(super) fn peerdirect_file_replace_fops(
            file: *mut bindings::file,
            fops: *const bindings::file_operations,
        );
        pub(super) fn peerdirect_current_tgid() -> bindings::pid_t;
        pub(super) fn peerdirect_page_set_bits(page: *mut bindings::page, offset: usize, bits: u32);
        pub(super) fn peerdirect_vma_pgoff(vma: *mut bindings::vm_area_struct) -> usize;
        pub(super) fn peerdirect_pci_generation_register() -> c_int;
        pub(super) fn peerdirect_pci_generation_unregister();
        pub(super) fn peerdirect_map_table(
            attach: *mut bindings::dma_buf_attachment,
            paddr: bindings::phys_addr_t,
            bus_offset: u64,
            len: u64,
            seg: u64,
            dir: bindings::dma_data_direction,
            bus_addr: bool,
        ) -> *mut bindings::sg_table;
        pub(super) fn peerdirect_unmap_table(
            attach: *mut bindings::dma_buf_attachment,
            sgt: *mut bindings::sg_table,
            dir: bindings::dma_data_direction,
        );
        pub(super) fn peerdirect_to_pci_dev(dev: *mut bindings::device) -> *mut bindings::pci_dev;
        pub(super) fn peerdirect_dmabuf_mmap(
            dmabuf: *mut bindings::dma_buf,
            vma: *mut bindings::vm_area_struct,
        ) -> c_int;
        pub(super) fn peerdirect_dmabuf_set_name(
            dmabuf: *mut bindings::dma_buf,
            index: u32,
            handle: u32,
            offset: u64,
            len: u64,
        ) -> c_int;
        pub(super) fn peerdirect_dmabuf_revoke(dmabuf: *mut bindings::dma_buf) -> bool;
        #[cfg(CONFIG_LOCKDEP)]
        pub(super) fn peerdirect_assert_resv_held(attach: *mut bindings::dma_buf_attachment);
        pub(super) fn peerdirect_dmabuf_attachments(
            dmabuf: *mut bindings::dma_buf,
            out: *mut super::AttachInfo,
            max: usize,
        ) -> usize;
        pub(super) fn peerdirect_log_refused_attach(
            hbm: *mut bindings::pci_dev,
            importer: *mut bindings::device,
            reason: *const c_char,
        );
    }
}

/// Number of standard BARs of a PCI function (`PCI_STD_NUM_BARS`).
const PCI_STD_NUM_BARS: u32 = 6;

/// The `struct pci_dev` behind a [`pci::Device`].
///
/// `pci::Device::as_raw()` is private in this kernel; `pci::Device` is `#[repr(transparent)]`
/// over `Opaque<bindings::pci_dev>` (plus a zero-sized context marker), so a reference to it
/// is a pointer to the C struct. The pointer is valid for as long as the reference is.
fn raw_pci_dev(pdev: &pci::Device) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// The identity of a PCI device (the address of its `struct pci_dev`), only to compare with
/// what the bus notifier reports; never turned back into a pointer.
pub(crate) fn pci_dev_key(pdev: &pci::Device) -> usize {
    raw_pci_dev(pdev) as usize
}

/// Whether the calling task has `CAP_SYS_ADMIN` (in the initial user namespace).
pub(crate) fn capable_sys_admin() -> bool {
    // SAFETY: `capable` only reads the current task's credentials; any process context.
    unsafe { raw::peerdirect_capable_sys_admin() }
}

/// A PCI device's lock (`device_lock`), which the driver core holds across probe, remove and
/// bus notifications: while it is held, no driver binds to or unbinds from the device.
pub(crate) struct DeviceLock<'a>(&'a pci::Device);

impl<'a> DeviceLock<'a> {
    pub(crate) fn lock(pdev: &'a pci::Device) -> Self {
        // SAFETY: `raw_pci_dev` is valid while `pdev` is borrowed; process context (it may
        // sleep). Unlocked once, by `drop`.
        unsafe { raw::peerdirect_pci_device_lock(raw_pci_dev(pdev)) };
        Self(pdev)
    }

    /// The name of the driver bound to the device, NUL-padded (all NULs if none).
    pub(crate) fn driver_name(&self) -> DriverName {
        // SAFETY: the device's lock is held, which the helper needs.
        unsafe { driver_name(raw_pci_dev(self.0)) }
    }

    /// Whether the driver named `driver` is bound to the device.
    pub(crate) fn bound_to(&self, driver: &CStr) -> bool {
        // SAFETY: the device is valid while borrowed and its lock is held, as the helper needs
        // (its driver cannot change); `driver` is a NUL-terminated string.
        unsafe { raw::peerdirect_pci_bound_to(raw_pci_dev(self.0), driver.as_char_ptr()) }
    }
}

impl Drop for DeviceLock<'_> {
    fn drop(&mut self) {
        // SAFETY: locked in `lock` by this guard, unlocked once here.
        unsafe { raw::peerdirect_pci_device_unlock(raw_pci_dev(self.0)) }
    }
}

/// peerdirect's notifier on the PCI bus (helpers.c), registered while this value lives: it
/// tells [`crate::companion`] when a device's driver unbinds or the device goes away.
pub(crate) struct PciBusNotifier(());

impl PciBusNotifier {
    /// Registers the notifier; only the module initializer makes one.
    pub(crate) fn register() -> Result<Self> {
        // SAFETY: registers helpers.c's static notifier block, once (the only caller is the
        // module initializer), unregistered in `drop`.
        kernel::error::to_result(unsafe { raw::peerdirect_pci_notifier_register() })?;
        Ok(Self(()))
    }
}

impl Drop for PciBusNotifier {
    fn drop(&mut self) {
        // SAFETY: registered by `register`; `bus_unregister_notifier` returns once no
        // notification is running, so none reaches the module after this.
        unsafe { raw::peerdirect_pci_notifier_unregister() }
    }
}

/// Tells the P2P verdict caches of every PCI device added or deleted while registered (a
/// second PCI bus notifier in helpers.c, through [`peerdirect_pci_device_changed`]).
/// Registered from module initialization until every device is unbound, so that no attach
/// runs while it is not.
pub(crate) struct PciGeneration(());

impl PciGeneration {
    /// Registers the counting notifier; only the module initializer makes one.
    pub(crate) fn register() -> Result<Self> {
        // SAFETY: registers helpers.c's static notifier block, once (the only caller is the
        // module initializer), unregistered in `drop`.
        kernel::error::to_result(unsafe { raw::peerdirect_pci_generation_register() })?;
        Ok(Self(()))
    }
}

impl Drop for PciGeneration {
    fn drop(&mut self) {
        // SAFETY: registered by `register`.
        unsafe { raw::peerdirect_pci_generation_unregister() }
    }
}

/// Called by helpers.c's PCI bus notifier for each PCI device added or deleted, with its
/// `struct device`, before a deleted device can be freed.
#[no_mangle]
extern "C" fn peerdirect_pci_device_changed(dev: *mut bindings::device) {
    // Only the address is used: it names the device in the caches.
    crate::p2p::pci_device_changed(dev as usize);
}

/// Called by helpers.c's PCI bus notifier when `pdev`'s driver is about to unbind or `pdev` is
/// being deleted.
///
/// # Safety
///
/// Only the notifier calls it, with a valid `pdev` the driver core holds for the call.
#[no_mangle]
unsafe extern "C" fn peerdirect_companion_gone(pdev: *mut bindings::pci_dev) {
    crate::companion::gone(pdev as usize);
}

/// Called by helpers.c's PCI bus notifier once a driver is bound to `pdev`.
///
/// # Safety
///
/// Only the notifier calls it, with a valid `pdev` the driver core holds, and whose device
/// lock it holds, for the call.
#[no_mangle]
unsafe extern "C" fn peerdirect_companion_bound(pdev: *mut bindings::pci_dev) {
    // SAFETY: `pdev` is valid and its lock held for the notification, as the function's
    // contract says.
    let name = unsafe { driver_name(pdev) };
    crate::companion::bound(pdev as usize, name);
}

/// A PCI driver's name as `PEERDIRECT_IOC_INFO` reports it: NUL-padded, at most 31 bytes.
pub(crate) type DriverName = [u8; PEERDIRECT_DRIVER_NAME_LEN as usize];

/// The name of the driver bound to `pdev`.
///
/// # Safety
///
/// `pdev` is valid, and its device lock is held (or a bus notification of it is running).
unsafe fn driver_name(pdev: *mut bindings::pci_dev) -> DriverName {
    let mut name = [0; PEERDIRECT_DRIVER_NAME_LEN as usize];
    // SAFETY: `pdev` is valid and its driver cannot change (the caller's contract); `name` is
    // writable for its length.
    unsafe { raw::peerdirect_pci_driver_name(pdev, name.as_mut_ptr(), name.len()) };
    name
}

/// A standard BAR index, `0..PCI_STD_NUM_BARS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BarIndex(u32);

impl BarIndex {
    pub(crate) const fn new(bar: u32) -> Result<Self> {
        if bar < PCI_STD_NUM_BARS {
            Ok(Self(bar))
        } else {
            Err(EINVAL)
        }
    }

    pub(crate) const fn get(self) -> u32 {
        self.0
    }

    fn as_c_int(self) -> c_int {
        // CAST: `self.0 < PCI_STD_NUM_BARS`, which fits any `c_int`.
        self.0 as c_int
    }
}

/// The PCI bus address of `bar`: what a peer device puts on the bus to reach it.
pub(crate) fn bar_bus_address(pdev: &pci::Device, bar: BarIndex) -> u64 {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed, and `bar`
    // indexes the device's standard resources, so `pci_bus_address` reads within bounds.
    unsafe { raw::peerdirect_pci_bus_address(raw_pci_dev(pdev), bar.as_c_int()) }
}

/// Whether `bar` is a memory BAR (as opposed to I/O ports or unimplemented).
pub(crate) fn bar_is_mem(pdev: &pci::Device, bar: BarIndex) -> bool {
    // SAFETY: as in `bar_bus_address`.
    unsafe { raw::peerdirect_pci_bar_is_mem(raw_pci_dev(pdev), bar.as_c_int()) }
}

/// The PCI domain (segment) of the device.
pub(crate) fn domain(pdev: &pci::Device) -> u32 {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed, and a device
    // that the PCI core handed to a driver always has its `bus` set.
    let domain = unsafe { raw::peerdirect_pci_domain(raw_pci_dev(pdev)) };
    // CAST: PCI domains are non-negative (the C type is `int` for historical reasons).
    domain as u32
}

/// The NUMA node of the device, `None` when it has none.
pub(crate) fn numa_node(pdev: &pci::Device) -> Option<u32> {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed.
    let node = unsafe { raw::peerdirect_pci_numa_node(raw_pci_dev(pdev)) };
    u32::try_from(node).ok()
}

/// Claims `bar` for this driver until it unbinds (`pcim_request_region`, device-managed).
pub(crate) fn request_bar(pdev: &pci::Device<kernel::device::Core<'_>>, bar: BarIndex) -> Result {
    // The `Core` context means we are in probe, where device-managed resources may be added.
    // SAFETY: `raw_pci_dev` is valid while `pdev` is borrowed; the name is a static C string.
    kernel::error::to_result(unsafe {
        bindings::pcim_request_region(
            raw_pci_dev(pdev),
            bar.as_c_int(),
            c"peerdirect".as_char_ptr(),
        )
    })
}

/// Reserves write-combining as the CPU's memory type of `bar` while the driver is bound
/// (device-managed; helpers.c says why CPU mappings need it).
pub(crate) fn reserve_wc(pdev: &pci::Device<kernel::device::Core<'_>>, bar: BarIndex) -> Result {
    // The `Core` context means we are in probe, where device-managed resources may be added.
    // SAFETY: `raw_pci_dev` is valid while `pdev` is borrowed; `bar` is a standard BAR index.
    kernel::error::to_result(unsafe {
        raw::peerdirect_pci_reserve_wc(raw_pci_dev(pdev), bar.as_c_int())
    })
}

/// Sets up the device's P2P DMA bookkeeping (`pcim_p2pdma_init`, device-managed).
pub(crate) fn p2pdma_init(pdev: &pci::Device<kernel::device::Core<'_>>) -> Result {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed; `Core` means
    // we are in probe, where device-managed resources may be added.
    kernel::error::to_result(unsafe { bindings::pcim_p2pdma_init(raw_pci_dev(pdev)) })
}

/// The kernel's peer-to-peer distance from `hbm` to the device `dev`
/// (`pci_p2pdma_distance_many`), `None` when there is no P2P path.
///
/// # Safety
///
/// `dev` is a valid `struct device` for the call (an attachment's, or a PCI device's own).
pub(crate) unsafe fn p2p_distance(hbm: &pci::Device, dev: *mut bindings::device) -> Option<u32> {
    // `pci_p2pdma_map_type`, which decides the same thing, is not exported to modules.
    let mut clients = [dev];
    // SAFETY: `hbm` is borrowed; `clients` holds one device, valid (the caller's contract),
    // and outlives the call.
    let distance = unsafe {
        bindings::pci_p2pdma_distance_many(raw_pci_dev(hbm), clients.as_mut_ptr(), 1, false)
    };
    u32::try_from(distance).ok()
}

/// A PCI device looked up by address, with a reference held until it is dropped
/// (`pci_get_domain_bus_and_slot` / `pci_dev_put`).
///
/// # Invariants
///
/// Points to a `struct pci_dev` on which this value holds one reference.
pub(crate) struct PciDevRef(NonNull<bindings::pci_dev>);

impl PciDevRef {
    /// The device at `domain`:`bus`:`devfn`, `None` if there is none.
    pub(crate) fn get(domain: u32, bus: u8, devfn: u8) -> Option<Self> {
        let domain = c_int::try_from(domain).ok()?;
        // SAFETY: a lookup by value; it returns a referenced device or NULL, from process
        // context (it takes the PCI bus semaphore).
        let raw = unsafe {
            bindings::pci_get_domain_bus_and_slot(domain, u32::from(bus), u32::from(devfn))
        };
        // INVARIANT: a non-NULL result carries a reference for us.
        NonNull::new(raw).map(Self)
    }

    /// The device, borrowed for as long as the reference is held.
    pub(crate) fn as_dev(&self) -> PciDev<'_> {
        PciDev(self.0, PhantomData)
    }

    /// The device as the kernel crate's reference-counted `pci::Device`, which takes over
    /// this reference.
    pub(crate) fn into_device(self) -> ARef<pci::Device> {
        // `pci::Device` is `#[repr(transparent)]` over `struct pci_dev` and counts references
        // with `pci_dev_get`/`pci_dev_put`, as `PciDevRef` does.
        let raw = core::mem::ManuallyDrop::new(self).0.cast::<pci::Device>();
        // SAFETY: so the reference we hold (type invariant) moves into the `ARef`.
        unsafe { ARef::from_raw(raw) }
    }
}

impl Drop for PciDevRef {
    fn drop(&mut self) {
        // SAFETY: by the type invariant we hold one reference, dropped once here.
        unsafe { bindings::pci_dev_put(self.0.as_ptr()) }
    }
}

/// A PCI device borrowed for `'a`: one the caller holds a reference on (a bound
/// [`pci::Device`], a [`PciDevRef`]) or a bridge above one, which that reference keeps alive
/// (as the p2pdma core relies on too).
#[derive(Clone, Copy)]
pub(crate) struct PciDev<'a>(NonNull<bindings::pci_dev>, PhantomData<&'a ()>);

impl<'a> PciDev<'a> {
    /// The bound device `pdev`.
    pub(crate) fn of(pdev: &'a pci::Device) -> Self {
        // Same pointer as `raw_pci_dev` (see there), from a reference, so never NULL.
        Self(NonNull::from(pdev).cast(), PhantomData)
    }

    fn raw(self) -> *mut bindings::pci_dev {
        self.0.as_ptr()
    }

    /// Whether `self` and `other` are the same device.
    pub(crate) fn is(self, other: PciDev<'_>) -> bool {
        self.0 == other.0
    }

    /// `bus << 8 | devfn`.
    pub(crate) fn id(self) -> u16 {
        // SAFETY: the device is alive for `'a` (type invariant).
        unsafe { raw::peerdirect_pci_dev_id(self.raw()) }
    }

    /// The bridge directly above, `None` on a root bus. Held alive by the reference on the
    /// device below it, so it is borrowed for the same `'a`.
    pub(crate) fn upstream_bridge(self) -> Option<PciDev<'a>> {
        // SAFETY: the device is alive for `'a`; the child's reference on its parent bridge
        // keeps the result alive as long.
        let raw = unsafe { raw::peerdirect_pci_upstream_bridge(self.raw()) };
        NonNull::new(raw).map(|b| PciDev(b, PhantomData))
    }

    /// Whether this bridge redirects peer-to-peer requests upstream (ACS RR, CR or EC).
    pub(crate) fn acs_redirects(self) -> bool {
        // SAFETY: the device is alive for `'a`; reading its config space is allowed from
        // process context.
        unsafe { raw::peerdirect_pci_acs_redirects(self.raw()) }
    }

    /// Whether `self` and `other` are below the same host bridge.
    pub(crate) fn same_host_bridge(self, other: PciDev<'_>) -> bool {
        // SAFETY: both devices are alive for the call; a live device's bus and host bridge are
        // set.
        unsafe { raw::peerdirect_pci_same_host_bridge(self.raw(), other.raw()) }
    }

    /// Vendor and device ID of function 00.0 of the root bus above, `None` if it has none.
    pub(crate) fn host_bridge_ids(self) -> Option<(u16, u16)> {
        // SAFETY: the device is alive for `'a`; the helper takes and drops its own reference
        // on the host bridge function.
        let ids = unsafe { raw::peerdirect_pci_host_bridge_ids(self.raw()) };
        // CAST: the helper packs two 16-bit IDs into one `u32`.
        (ids != 0).then_some(((ids >> 16) as u16, ids as u16))
    }

    /// Whether the device's DMA goes through an IOMMU.
    pub(crate) fn iommu_mapped(self) -> bool {
        // SAFETY: the device is alive for `'a`.
        unsafe { raw::peerdirect_pci_iommu_mapped(self.raw()) }
    }

    /// The kernel's peer-to-peer distance from `hbm` to this device
    /// (`pci_p2pdma_distance_many`), `None` when its P2P rules give no path.
    pub(crate) fn p2p_distance_from(self, hbm: &pci::Device) -> Option<u32> {
        // SAFETY: the device is alive for `'a`, so is its embedded `struct device`, which is
        // therefore valid for the call as `p2p_distance` requires.
        unsafe { p2p_distance(hbm, &raw mut (*self.raw()).dev) }
    }
}

/// Sets `bits` in the `u32` at `offset` of `page` with release semantics, for readers that
/// map the page (the status page). `EINVAL` unless `offset` is a 4-byte aligned offset inside
/// the page.
pub(crate) fn page_set_bits(page: &Page, offset: usize, bits: u32) -> Result {
    if offset % 4 != 0 || offset + 4 > kernel::page::PAGE_SIZE {
        return Err(EINVAL);
    }
    // The page is order 0 and always mapped in the kernel (no highmem where peerdirect runs);
    // userspace only reads it, and the caller serializes the kernel's writers.
    // SAFETY: `page` is live while borrowed; `offset` is an aligned `u32` inside it (checked).
    unsafe { raw::peerdirect_page_set_bits(page.as_ptr(), offset, bits) };
    Ok(())
}

/// The page offset an `mmap` asked for (`vm_pgoff`).
pub(crate) fn vma_pgoff(vma: &VmaNew) -> usize {
    // SAFETY: `vma` is the area being set up by the current `mmap` call, valid while borrowed.
    unsafe { raw::peerdirect_vma_pgoff(vma.as_ptr()) }
}

/// The calling process's id, as its PID namespace sees it.
/// Gives `file`, being opened, the operations `fops` from now on.
///
/// # Safety
///
/// `file` is being opened by this module's misc device (its open callback runs), and `fops`
/// belongs to this module and works on the file's private data as the misc device's own
/// operations do.
pub(crate) unsafe fn file_replace_fops(
    file: &kernel::fs::File,
    fops: &'static bindings::file_operations,
) {
    // SAFETY: forwarded from the caller; `file` is valid for the call.
    unsafe { raw::peerdirect_file_replace_fops(file.as_ptr(), fops) }
}

pub(crate) fn current_tgid() -> i32 {
    // SAFETY: `task_tgid_vnr(current)` may be called from any process context.
    unsafe { raw::peerdirect_current_tgid() }
}

/// Whether `dev` is a PCI device (the kernel's `dev_is_pci()`, read here rather than through
/// a call: attach asks it every time).
///
/// # Safety
///
/// `dev` is a valid `struct device` for the call (an attachment's).
pub(crate) unsafe fn dev_is_pci(dev: *mut bindings::device) -> bool {
    // SAFETY: `dev` is valid (the caller's contract), so its `bus` may be read; of the PCI
    // core's static `pci_bus_type` only the address is taken.
    unsafe { core::ptr::eq((*dev).bus, core::ptr::addr_of!(bindings::pci_bus_type)) }
}

/// The device's DMA max segment size (the kernel's `dma_get_max_seg_size()`, read here rather
/// than through a call: map asks it every time).
///
/// # Safety
///
/// `dev` is a valid `struct device` for the call (an attachment's).
pub(crate) unsafe fn dma_max_seg_size(dev: *mut bindings::device) -> u32 {
    // The device's bus or driver sets `dma_parms` before it maps, as the dma-buf core reads it.
    // SAFETY: `dev` is valid (the caller's contract); its `dma_parms`, when set, points to
    // parameters that live as long as the device.
    let set = unsafe {
        let parms = (*dev).dma_parms;
        if parms.is_null() {
            0
        } else {
            (*parms).max_segment_size
        }
    };
    if set != 0 {
        set
    } else {
        // What a device that never set one gets (`SZ_64K`).
        64 << 10
    }
}

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

/// Rate-limited log line on `hbm`'s device naming the refused importer `dev` and why.
///
/// # Safety
///
/// `dev` is a valid `struct device` for the call (an attachment's).
pub(crate) unsafe fn log_refused_attach(
    hbm: &pci::Device,
    dev: *mut bindings::device,
    reason: &CStr,
) {
    // SAFETY: `hbm` is borrowed, `dev` is valid (the caller's contract), `reason` is a
    // NUL-terminated string.
    unsafe { raw::peerdirect_log_refused_attach(raw_pci_dev(hbm), dev, reason.as_char_ptr()) }
}

/// The kernel's `IS_ERR()` and `PTR_ERR()` of `ptr`, read here rather than through the two
/// calls `kernel::error::from_err_ptr` makes (map and unmap are hot paths); `ENOMEM` for NULL.
fn from_err_ptr<T>(ptr: *mut T) -> Result<NonNull<T>> {
    // An error pointer is the errno's two's complement: the last `MAX_ERRNO` addresses.
    let value = ptr.addr() as isize;
    if value < 0 && value >= -(bindings::MAX_ERRNO as isize) {
        // In [-MAX_ERRNO, -1], so it fits.
        return Err(Error::from_errno(value as c_int));
    }
    NonNull::new(ptr).ok_or(ENOMEM)
}

/// Maps `len` bytes of a BAR at `paddr` for `attach`'s device in a table filled by
/// `helpers.c`: by bus address (`paddr + bus_offset`) when `bus_addr`, else through the host
/// bridge (one IOVA range through an IOMMU, else one `dma_map_phys` of the whole range).
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

/// The PCI device of `dev`, if it is one, borrowed for as long as `dev` is.
///
/// # Safety
///
/// `dev` is a valid `struct device` for `'a`.
pub(crate) unsafe fn pci_dev_of<'a>(dev: *mut bindings::device) -> Option<PciDev<'a>> {
    // SAFETY: `dev` is valid (the caller's contract), as `dev_is_pci` needs.
    if !unsafe { dev_is_pci(dev) } {
        return None;
    }
    // SAFETY: `dev` is a PCI device's embedded `struct device`, valid for `'a`.
    NonNull::new(unsafe { raw::peerdirect_to_pci_dev(dev) }).map(|p| PciDev(p, PhantomData))
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

/// One importer's attachment as `peerdirect_dmabuf_attachments` describes it (mirrors
/// `struct peerdirect_attach_info` in `helpers.h`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct AttachInfo {
    /// The importer's device name, NUL-terminated and NUL-padded.
    pub(crate) importer: [u8; 32],
    /// DMA segments of its current mapping, 0 when unmapped.
    pub(crate) entries: u32,
    /// Whether it drops its mappings when told to (else it is a pinned importer).
    pub(crate) revocable: bool,
    pub(crate) pinned: bool,
}

impl AttachInfo {
    pub(crate) const EMPTY: Self = Self {
        importer: [0; 32],
        entries: 0,
        revocable: false,
        pinned: false,
    };

    /// The importer's device name.
    pub(crate) fn importer(&self) -> &str {
        let end = self.importer.iter().position(|&b| b == 0).unwrap_or(32);
        core::str::from_utf8(&self.importer[..end]).unwrap_or("?")
    }
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
