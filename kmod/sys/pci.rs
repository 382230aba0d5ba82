// SPDX-License-Identifier: GPL-2.0

//! PCI devices: the `struct pci_dev` behind a [`pci::Device`], devices looked up by address
//! ([`PciDevRef`]) and borrowed ([`PciDev`]) with their bridges, ACS, host bridges, IOMMU and
//! the kernel's P2P distance, the device lock and the bound driver's name, BAR facts, and the
//! PCI device of a `struct device`.

use super::raw;
use core::{marker::PhantomData, ptr::NonNull};
use kernel::{bindings, ffi::c_int, pci, prelude::*, sync::aref::ARef};

/// Number of standard BARs of a PCI function (`PCI_STD_NUM_BARS`).
const PCI_STD_NUM_BARS: u32 = 6;

/// The `struct pci_dev` behind a [`pci::Device`].
///
/// `pci::Device::as_raw()` is private in this kernel; `pci::Device` is `#[repr(transparent)]`
/// over `Opaque<bindings::pci_dev>` (plus a zero-sized context marker), so a reference to it
/// is a pointer to the C struct. The pointer is valid for as long as the reference is.
pub(super) fn raw_pci_dev(pdev: &pci::Device) -> *mut bindings::pci_dev {
    core::ptr::from_ref(pdev).cast_mut().cast()
}

/// The identity of a PCI device (the address of its `struct pci_dev`), only to compare with
/// what the bus notifier reports; never turned back into a pointer.
pub(crate) fn pci_dev_key(pdev: &pci::Device) -> usize {
    raw_pci_dev(pdev) as usize
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

    /// The locked device.
    pub(super) fn device(&self) -> &'a pci::Device {
        self.0
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

/// The devfn of slot `slot`, function `func` (the kernel's `PCI_DEVFN`); `EINVAL` if either
/// is out of range.
pub(crate) fn devfn(slot: u8, func: u8) -> Result<u8> {
    if slot >= 32 || func >= 8 {
        return Err(EINVAL);
    }
    Ok(slot << 3 | func)
}

/// A `pci_device_id` that matches `vendor`:`device` with any subsystem (the kernel's
/// `PCI_DEVICE`), for a vendor `pci::Vendor` has no constant for.
pub(crate) const fn device_id(vendor: u32, device: u32) -> pci::DeviceId {
    let id = bindings::pci_device_id {
        vendor,
        device,
        subvendor: !0,
        subdevice: !0,
        class: 0,
        class_mask: 0,
        driver_data: 0,
        override_only: 0,
    };
    // SAFETY: `pci::DeviceId` is `#[repr(transparent)]` over `bindings::pci_device_id` and adds
    // no invariant beyond it (its own constructors build one field by field, as here).
    unsafe { core::mem::transmute::<bindings::pci_device_id, pci::DeviceId>(id) }
}

/// The length of a [`DriverName`], `PEERDIRECT_DRIVER_NAME_LEN` of the ABI.
pub(crate) const DRIVER_NAME_LEN: usize = 32;

/// A PCI driver's name as `PEERDIRECT_IOC_INFO` reports it: NUL-padded, at most 31 bytes.
pub(crate) type DriverName = [u8; DRIVER_NAME_LEN];

/// The name of the driver bound to `pdev`.
///
/// # Safety
///
/// `pdev` is valid, and its device lock is held (or a bus notification of it is running).
pub(super) unsafe fn driver_name(pdev: *mut bindings::pci_dev) -> DriverName {
    let mut name = [0; DRIVER_NAME_LEN];
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

pub(crate) use super::raw::BarPlace;

impl BarPlace {
    pub(crate) fn new(bar: BarIndex, phys: u64, bus: u64, len: u64) -> Self {
        Self {
            phys,
            bus,
            len,
            bar: bar.as_c_int(),
        }
    }
}

/// Whether `pdev`'s BAR can be reached where `place` says it was found: the device decodes
/// memory (not while it is being reset, nor once its owner turned decoding off), and the BAR
/// was neither resized, reassigned nor moved since (the kernel's resource and the BAR
/// register still say `place`).
pub(crate) fn bar_in_place(pdev: &pci::Device, place: &BarPlace) -> bool {
    // SAFETY: `raw_pci_dev` is a valid `struct pci_dev` while `pdev` is borrowed, `place.bar`
    // a standard BAR's index (a `BarIndex`); config reads may be made in any context.
    unsafe { raw::peerdirect_pci_bar_in_place(raw_pci_dev(pdev), place) }
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
/// (device-managed; helpers/pci.c says why CPU mappings need it).
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
