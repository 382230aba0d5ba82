// SPDX-License-Identifier: GPL-2.0

//! The C helpers of `helpers/` (declared in `helpers/helpers.h`; the signatures must match it), and
//! the C structs they name. Only the floor calls them, each through one safe function or one
//! `unsafe fn` with a `# Safety` section: keep raw FFI in one place and wrap it once.

use kernel::{
    bindings,
    ffi::{c_char, c_int, c_ulong},
};

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

/// Where a memory BAR was found (mirrors `struct peerdirect_bar_place` in `helpers.h`): made
/// by `pci::BarPlace::new`, read by `peerdirect_pci_bar_in_place`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BarPlace {
    /// The CPU physical address of its start (the kernel's resource).
    pub(crate) phys: u64,
    /// Its bus address (what the BAR register holds).
    pub(crate) bus: u64,
    /// Its length.
    pub(crate) len: u64,
    /// Its index, below `PCI_STD_NUM_BARS`.
    pub(super) bar: c_int,
}

/// What the PCI bus notifier of `helpers/pci_notifier.c` calls (mirrors
/// `struct peerdirect_pci_events` in `helpers.h`): it is given one at registration, which
/// stays valid and unchanged until it is unregistered.
#[repr(C)]
pub(super) struct PciEvents {
    /// A PCI device was added or is being deleted (`BUS_NOTIFY_ADD_DEVICE`,
    /// `BUS_NOTIFY_DEL_DEVICE`), before a deleted device can be freed; with its
    /// `struct device`.
    pub(super) device_changed: Option<unsafe extern "C" fn(dev: *mut bindings::device)>,
}

/// What the error handlers of `helpers/pci.c` call (mirrors `struct peerdirect_pci_reset_events`
/// in `helpers.h`), with the device lock held: `prepare` before a bound device is reset or
/// while an error is recovered from, `done` after.
#[repr(C)]
pub(super) struct PciResetEvents {
    pub(super) prepare: Option<unsafe extern "C" fn(pdev: *mut bindings::pci_dev)>,
    pub(super) done: Option<unsafe extern "C" fn(pdev: *mut bindings::pci_dev)>,
}

/// `struct peerdirect_owner_link` of `helpers/owner_link.c`: only pointers to it cross.
#[repr(C)]
pub(super) struct OwnerLink {
    _opaque: [u8; 0],
}

// `improper_ctypes` fires because bindgen renders a flexible array inside `struct pci_dev` as a
// field-less struct; only pointers to it cross the boundary, never values.
#[allow(improper_ctypes)]
extern "C" {
    pub(super) fn peerdirect_pci_bus_address(pdev: *mut bindings::pci_dev, bar: c_int) -> u64;
    pub(super) fn peerdirect_pci_domain(pdev: *mut bindings::pci_dev) -> c_int;
    pub(super) fn peerdirect_pci_numa_node(pdev: *mut bindings::pci_dev) -> c_int;
    pub(super) fn peerdirect_pci_bar_is_mem(pdev: *mut bindings::pci_dev, bar: c_int) -> bool;
    pub(super) fn peerdirect_pci_bar_in_place(
        pdev: *mut bindings::pci_dev,
        place: *const BarPlace,
    ) -> bool;
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
    pub(super) fn peerdirect_fatal_signal_pending() -> bool;
    pub(super) fn peerdirect_global_init_lock();
    pub(super) fn peerdirect_global_init_unlock();
    pub(super) fn peerdirect_owner_links_init() -> c_int;
    pub(super) fn peerdirect_owner_links_exit();
    pub(super) fn peerdirect_owner_link_create(
        owner: *mut bindings::pci_dev,
        key: c_ulong,
        unlinked: Option<unsafe extern "C" fn(key: c_ulong)>,
    ) -> *mut OwnerLink;
    pub(super) fn peerdirect_owner_link_destroy(link: *mut OwnerLink);
    pub(super) fn peerdirect_pci_driver_set_reset_events(
        drv: *mut bindings::pci_driver,
        events: *const PciResetEvents,
    );
    pub(super) fn peerdirect_file_replace_fops(
        file: *mut bindings::file,
        fops: *const bindings::file_operations,
    );
    pub(super) fn peerdirect_current_tgid() -> bindings::pid_t;
    pub(super) fn peerdirect_page_set_bits(page: *mut bindings::page, offset: usize, bits: u32);
    pub(super) fn peerdirect_page_count(page: *mut bindings::page, offset: usize);
    pub(super) fn peerdirect_page_load(page: *mut bindings::page, offset: usize) -> u32;
    pub(super) fn peerdirect_vma_pgoff(vma: *mut bindings::vm_area_struct) -> usize;
    pub(super) fn peerdirect_pci_generation_register(events: *const PciEvents) -> c_int;
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
    pub(super) fn peerdirect_dmabuf_revoked(dmabuf: *mut bindings::dma_buf) -> bool;
    pub(super) fn peerdirect_dmabuf_vmap(
        dmabuf: *mut bindings::dma_buf,
        map: *mut bindings::iosys_map,
    ) -> c_int;
    pub(super) fn peerdirect_dmabuf_kmap_release(dmabuf: *mut bindings::dma_buf);
    #[cfg(CONFIG_LOCKDEP)]
    pub(super) fn peerdirect_assert_resv_held(attach: *mut bindings::dma_buf_attachment);
    pub(super) fn peerdirect_dmabuf_attachments(
        dmabuf: *mut bindings::dma_buf,
        out: *mut AttachInfo,
        max: usize,
    ) -> usize;
    pub(super) fn peerdirect_log_refused_attach(
        hbm: *mut bindings::pci_dev,
        importer: *mut bindings::device,
        reason: *const c_char,
    );
}
