//! The structs and constants of `include/peerdirect.h`, as Rust sees them, except
//! `struct pd_invalidation` and `pd_invalidate_fn`, which name a `pd_domain` and live with it
//! in `regcache`. The header is written by hand; `tests::layout_matches_the_header` compiles
//! it and compares.

use pd::uapi;

/// `PD_EXPORT_CLOEXEC`: the dma-buf fd is close-on-exec.
pub const PD_EXPORT_CLOEXEC: u32 = 1;
/// `PD_EXPORT_RDWR`: the dma-buf may be mapped writable.
pub const PD_EXPORT_RDWR: u32 = 2;
/// `PD_PROVIDER_OWNED`: peerdirect is the device's PCI driver and owns the BAR.
pub const PD_PROVIDER_OWNED: u32 = 1;
/// `PD_PROVIDER_COMPANION`: another driver owns the device; peerdirect serves its BAR.
pub const PD_PROVIDER_COMPANION: u32 = 2;

/// `PD_ACCESS_*`: what a registration lets the NIC do (`pd_register`), the crate's `Access`.
pub const PD_ACCESS_LOCAL_READ: u32 = 1;
pub const PD_ACCESS_LOCAL_WRITE: u32 = 2;
pub const PD_ACCESS_REMOTE_READ: u32 = 4;
pub const PD_ACCESS_REMOTE_WRITE: u32 = 8;
/// `PD_PATH_*`: how a registration reaches HBM (`pd_mr_path`), the crate's `RegPath`.
pub const PD_PATH_DMABUF: u32 = 1;
pub const PD_PATH_HOST_BOUNCE: u32 = 2;
pub const PD_PATH_PEERMEM_VA: u32 = 3;

const _: () = assert!(PD_ACCESS_LOCAL_READ == pd::cache::Access::LOCAL_READ.bits() as u32);
const _: () = assert!(PD_ACCESS_LOCAL_WRITE == pd::cache::Access::LOCAL_WRITE.bits() as u32);
const _: () = assert!(PD_ACCESS_REMOTE_READ == pd::cache::Access::REMOTE_READ.bits() as u32);
const _: () = assert!(PD_ACCESS_REMOTE_WRITE == pd::cache::Access::REMOTE_WRITE.bits() as u32);

/// `PD_IFACE_*`: where a domain's registered memory lives (`pd_domain_set_iface`).
pub const PD_IFACE_SYSTEM: u32 = 0;
pub const PD_IFACE_SYNAPSEAI: u32 = 1;

/// `PD_INVALIDATED_*`: why registrations were invalidated (`struct pd_invalidation`), the
/// crate's `Cause`.
pub const PD_INVALIDATED_MEMORY: u32 = 1;
pub const PD_INVALIDATED_DEVICE: u32 = 2;
pub const PD_INVALIDATED_DOMAIN: u32 = 3;

/// `struct ibv_pd` of libibverbs: only ever behind a pointer.
#[repr(C)]
pub struct IbvPd {
    _opaque: [u8; 0],
}

/// `struct fid_domain` of libfabric: only ever behind a pointer.
#[repr(C)]
pub struct FidDomain {
    _opaque: [u8; 0],
}

/// `struct fid_ep` of libfabric: only ever behind a pointer.
#[repr(C)]
pub struct FidEp {
    _opaque: [u8; 0],
}

// The C names promise the module's values: flags are passed through unchanged.
const _: () = assert!(PD_EXPORT_CLOEXEC == uapi::PEERDIRECT_EXPORT_CLOEXEC);
const _: () = assert!(PD_EXPORT_RDWR == uapi::PEERDIRECT_EXPORT_RDWR);
const _: () = assert!(PD_PROVIDER_OWNED == uapi::PEERDIRECT_PROVIDER_OWNED);
const _: () = assert!(PD_PROVIDER_COMPANION == uapi::PEERDIRECT_PROVIDER_COMPANION);

/// `struct pd_device_info`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PdDeviceInfo {
    pub hbm_bytes: u64,
    pub hbm_bus_addr: u64,
    pub hbm_phys_addr: u64,
    pub index: u32,
    pub bar_index: u32,
    pub numa_node: i32,
    pub pci_domain: u32,
    pub pci_bus: u8,
    pub pci_slot: u8,
    pub pci_func: u8,
    pub reserved0: u8,
    pub vendor_id: u16,
    pub device_id: u16,
    pub provider: u32,
    pub reserved1: u32,
}

impl From<&pd::DeviceInfo> for PdDeviceInfo {
    fn from(info: &pd::DeviceInfo) -> Self {
        Self {
            hbm_bytes: info.hbm_bytes,
            hbm_bus_addr: info.hbm_bus_addr,
            hbm_phys_addr: info.hbm_phys_addr,
            index: info.index,
            bar_index: info.bar_index,
            // NUMA nodes are small; one that does not fit reads as "none".
            numa_node: info
                .numa_node
                .and_then(|node| i32::try_from(node).ok())
                .unwrap_or(-1),
            pci_domain: info.pci_address.domain,
            pci_bus: info.pci_address.bus,
            pci_slot: info.pci_address.slot,
            pci_func: info.pci_address.func,
            reserved0: 0,
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            provider: match info.provider {
                pd::Provider::Owned => PD_PROVIDER_OWNED,
                pd::Provider::Companion => PD_PROVIDER_COMPANION,
            },
            reserved1: 0,
        }
    }
}

/// `struct pd_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PdStats {
    pub allocations: u64,
    pub allocated_bytes: u64,
    pub exports: u64,
    pub hbm_bytes: u64,
}

impl From<&pd::Stats> for PdStats {
    fn from(stats: &pd::Stats) -> Self {
        Self {
            allocations: stats.allocations,
            allocated_bytes: stats.allocated_bytes,
            exports: stats.exports,
            hbm_bytes: stats.hbm_bytes,
        }
    }
}

/// `struct pd_regcache_stats`: the crate's `CacheStats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PdRegcacheStats {
    pub hits: u64,
    pub misses: u64,
    pub registrations: u64,
    pub failed_registrations: u64,
    pub deregistrations: u64,
    pub evictions: u64,
    pub superseded: u64,
    pub invalidations: u64,
    pub uncached: u64,
    pub entries: u64,
    pub bytes: u64,
    pub max_count: u64,
    pub max_bytes: u64,
}

impl From<&pd::CacheStats> for PdRegcacheStats {
    fn from(s: &pd::CacheStats) -> Self {
        Self {
            hits: s.hits,
            misses: s.misses,
            registrations: s.registrations,
            failed_registrations: s.failed_registrations,
            deregistrations: s.deregistrations,
            evictions: s.evictions,
            superseded: s.superseded,
            invalidations: s.invalidations,
            uncached: s.uncached,
            entries: s.entries,
            bytes: s.bytes,
            max_count: s.max_count,
            max_bytes: s.max_bytes,
        }
    }
}
