//! Userspace access to peerdirect, the kernel module that exports accelerator HBM (a PCI BAR)
//! as DMA-BUF for peer-to-peer RDMA. Each HBM device is a misc device `/dev/peerdirectN`.
//!
//! ```no_run
//! for device in peerdirect::devices()? {
//!     let info = device.info()?;
//!     println!("{}: {} bytes of HBM at bus address {:#x}", info.pci_address, info.hbm_bytes, info.hbm_bus_addr);
//! }
//! # Ok::<(), peerdirect::Error>(())
//! ```
//!
//! Allocating HBM and handing it to an importer as a dma-buf:
//!
//! ```no_run
//! use peerdirect::{Device, ExportFlags, SyncFlags};
//!
//! let device = Device::open_index(0)?;
//! let allocation = device.alloc(4 << 20, None)?; // 4 MiB, 2 MiB aligned
//! let dma_buf = allocation.export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)?;
//! let mut map = dma_buf.mmap(true)?;
//! dma_buf.sync(SyncFlags::START_WRITE)?;
//! map.write(0, b"hello, HBM");
//! dma_buf.sync(SyncFlags::END_WRITE)?;
//! // Pass `dma_buf` (an fd) to an RDMA stack; it keeps the memory after `allocation` is freed.
//! # Ok::<(), peerdirect::Error>(())
//! ```
//!
//! Registration caches ([`RegCache`]) attach to the devices whose memory they register
//! ([`RegCache::attach`]): freeing an allocation, closing its device file or the device being
//! revoked (`ENODEV`) first invalidates the cached registrations of its exports, so that no
//! stale registration is handed out and none keeps freed HBM alive ([`invalidation`]).

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod allocation;
pub mod cache;
mod control;
mod device;
mod dma_buf;
mod error;
mod info;
pub mod invalidation;
mod p2p;
pub mod pattern;
pub mod registrar;
pub mod size;
mod stats;
mod sys;
pub mod uapi;

pub use allocation::Allocation;

/// How many `fork`s separate this process from the one in which this was first called (0
/// there; a `pthread_atfork` handler counts). A handle that records it when made can tell,
/// when used, that it is its parent's: libfabric and ibverbs objects, a device's watcher
/// thread and a cache's listener thread do not survive `fork` (the C ABI then fails with
/// `-ECHILD`). The crate's own types do not check it: do not use them in a forked child.
/// Inlined: the C ABI reads it in every call that takes a handle.
#[inline]
pub fn fork_generation() -> u64 {
    sys::fork::generation()
}
pub use cache::{CacheStats, Cause, Invalidated, Listener, RegCache, Registrar, Registration};
pub use control::{control_path, Control};
pub use device::{device_infos, device_path, devices, Device, ExportFlags};
pub use dma_buf::{DmaBuf, DmaBufMap, SyncFlags};
pub use error::{Error, Operation};
pub use info::{DeviceInfo, PciAddress, Provider};
pub use invalidation::{DeviceStatus, Invalidate};
pub use p2p::{P2pMapping, P2pPath};
pub use registrar::RegPath;
pub use rustix::io::Errno;
pub use stats::{stats_path, Stats, DEBUGFS};
pub use sys::{
    RawAlloc, RawCompanionAdd, RawCompanionRemove, RawCompanionResetDone, RawCompanionResetPrepare,
    RawExport, RawExportRange, RawFree, RawInfo, RawP2p,
};
