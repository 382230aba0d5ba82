//! `/dev/peerdirectN`: finding, opening and querying the HBM devices.

use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Weak;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::error::Operation;
use crate::invalidation::{DeviceStatus, ExportId, Hooks, Invalidate};
use crate::sys::status::StatusPage;
use crate::sys::{self, RawAlloc, RawExport, RawExportRange, RawFree, RawInfo, RawP2p, RawRequest};
use crate::uapi::{self, DEVICE_PREFIX};
use crate::{DeviceInfo, DmaBuf, Error, P2pPath, PciAddress};

/// Where the device nodes live.
const DEV_DIR: &str = "/dev";

/// The device node of HBM device `index`: `/dev/peerdirect<index>`.
pub fn device_path(index: u32) -> PathBuf {
    Path::new(DEV_DIR).join(format!("{DEVICE_PREFIX}{index}"))
}

bitflags::bitflags! {
    /// How [`crate::Allocation::export`] makes the dma-buf (`PEERDIRECT_EXPORT_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct ExportFlags: u32 {
        /// The dma-buf fd is close-on-exec.
        const CLOEXEC = uapi::PEERDIRECT_EXPORT_CLOEXEC;
        /// The dma-buf may be mapped writable; without it, [`DmaBuf::mmap`] maps it read-only.
        const RDWR = uapi::PEERDIRECT_EXPORT_RDWR;
    }
}

/// An open peerdirect device node.
///
/// It remembers the exports made from each of its allocations and tells the registration
/// caches attached to it ([`crate::RegCache::attach`], [`Device::subscribe`]) before an
/// allocation is freed, before the file is closed, and when a command fails with `ENODEV`
/// (the device was revoked); see [`crate::invalidation`].
#[derive(Debug)]
pub struct Device {
    // Declared first so that it is dropped, telling the hooks, before `fd` is closed.
    hooks: Hooks,
    fd: OwnedFd,
    path: PathBuf,
    index: u32,
    status: Option<DeviceStatus>,
}

impl Device {
    /// Opens the device node at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let fd = rustix::fs::open(path, OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|errno| Error::os(Operation::Open, path, errno))?;
        let mut device = Self {
            hooks: Hooks::default(),
            fd,
            path: path.to_owned(),
            index: Self::UNKNOWN_INDEX,
            status: None,
        };
        // A module without a status page (older than this crate) leaves revocation to be
        // noticed by ENODEV.
        device.status = StatusPage::map(device.fd.as_fd())
            .ok()
            .map(DeviceStatus::new);
        if let Some(status) = &device.status {
            device.hooks.set_status(status.clone());
        }
        device.index = match path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(device_index)
        {
            Some(index) => index,
            // Not named peerdirectN (a link, a test node): ask the module.
            None => device.info().map_or(Self::UNKNOWN_INDEX, |info| info.index),
        };
        Ok(device)
    }

    /// Opens `/dev/peerdirect<index>`.
    pub fn open_index(index: u32) -> Result<Self, Error> {
        Self::open(device_path(index))
    }

    /// The path the device was opened at.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The index of a node that neither is named peerdirectN nor answers INFO (such a node
    /// exports nothing). Not [`ExportId::FOREIGN`]: revoking it must not drop the
    /// registrations of foreign dma-bufs.
    pub const UNKNOWN_INDEX: u32 = u32::MAX - 1;

    /// N of `/dev/peerdirectN`: from the node's name, else from `PEERDIRECT_IOC_INFO`;
    /// [`Device::UNKNOWN_INDEX`] if neither says. The device part of the [`ExportId`]s of its
    /// exports.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The identity of `dma_buf`, exported from this device, as the caches know it and as
    /// the device reports it when the allocation it came from is freed:
    /// `ExportId::of_dma_buf(self.index(), dma_buf)`.
    pub fn export_id(&self, dma_buf: &DmaBuf) -> Result<ExportId, Errno> {
        ExportId::of_dma_buf(self.index, dma_buf)
    }

    /// The device's status page, `None` when the module offers none.
    pub fn status(&self) -> Option<DeviceStatus> {
        self.status.clone()
    }

    /// [`Device::status`], borrowed.
    pub(crate) fn status_page(&self) -> Option<&DeviceStatus> {
        self.status.as_ref()
    }

    /// How many live hooks (caches) are subscribed to the device.
    #[cfg(test)]
    pub(crate) fn hooks_subscribed(&self) -> usize {
        self.hooks.subscribers()
    }

    /// Whether the module has started revoking this device (its status page says so); `false`
    /// when there is no status page.
    pub fn is_revoked(&self) -> bool {
        self.status.as_ref().is_some_and(DeviceStatus::revoked)
    }

    /// Maps `len` bytes of the device file at `offset`, writable if asked, reads the first
    /// `u32` and unmaps them. For testing the module's checks of status page mappings (only
    /// one read-only page at `PEERDIRECT_STATUS_OFFSET` is allowed); [`Device::status`] is
    /// the normal way.
    pub fn map_status_raw(&self, len: usize, offset: u64, writable: bool) -> Result<u32, Error> {
        sys::status::probe_map(self.fd.as_fd(), len, offset, writable)
            .map_err(|errno| Error::os(Operation::Mmap, &self.path, errno))
    }

    /// Subscribes `hook` to this file's frees and revocation (once, however often it is
    /// subscribed; it unsubscribes by being dropped). [`crate::RegCache::attach`] does this
    /// for a cache.
    ///
    /// The first subscription also starts a thread that waits for the module to say the
    /// device is going (the file polls `POLLPRI`) and then tells the hooks at once
    /// ([`Invalidate::device_gone`]): removal of the device waits for registrations that
    /// cannot be revoked, so they must go without waiting for the caller's next command. If
    /// the thread cannot be started (no memory, no threads left), hooks still learn it from
    /// the status page and from `ENODEV`, later.
    pub fn subscribe(&self, hook: Weak<dyn Invalidate>) {
        self.hooks.subscribe(hook);
        let _ = self.hooks.watch(self.fd.as_fd(), self.index);
    }

    /// Asks the module about the HBM device (`PEERDIRECT_IOC_INFO`).
    pub fn info(&self) -> Result<DeviceInfo, Error> {
        let mut raw = RawInfo::<0>::new();
        self.info_raw(&mut raw)?;
        let mut info = DeviceInfo::from_raw(&self.path, &raw.info)?;
        if raw.info.size < uapi::PEERDIRECT_INFO_SIZE_VER1 {
            // A module older than the field: sysfs says it.
            info.driver = crate::info::pci_driver(info.pci_address);
        }
        Ok(info)
    }

    /// Sends `PEERDIRECT_IOC_INFO` with an argument the caller built, malformed ones included,
    /// and leaves in `raw` whatever the kernel wrote back. For testing the module's checks.
    ///
    /// Requests whose `size` reaches past `raw` are refused without a system call
    /// ([`Error::RequestTooLarge`]); so are those of the other `*_raw` methods.
    pub fn info_raw<const TAIL: usize>(&self, raw: &mut RawInfo<TAIL>) -> Result<(), Error> {
        self.send(Operation::Info, raw)
    }

    /// Sends `PEERDIRECT_IOC_ALLOC` with an argument the caller built, like
    /// [`Device::info_raw`]. An allocation it makes is not freed by this crate: free it with
    /// [`Device::free_raw`], or close the file.
    pub fn alloc_raw<const TAIL: usize>(&self, raw: &mut RawAlloc<TAIL>) -> Result<(), Error> {
        self.send(Operation::Alloc, raw)
    }

    /// Sends `PEERDIRECT_IOC_FREE` with an argument the caller built, like
    /// [`Device::info_raw`].
    ///
    /// Before the command is sent, the hooks subscribed to this file drop what they hold of
    /// the exports made from `raw.free.handle` through this `Device`.
    pub fn free_raw<const TAIL: usize>(&self, raw: &mut RawFree<TAIL>) -> Result<(), Error> {
        let handle = raw.free.handle;
        self.hooks.before_free(handle);
        self.send(Operation::Free, raw)?;
        self.hooks.freed(handle);
        Ok(())
    }

    /// Sends `PEERDIRECT_IOC_EXPORT` with an argument the caller built, like
    /// [`Device::info_raw`], and returns the dma-buf it made.
    pub fn export_raw<const TAIL: usize>(
        &self,
        raw: &mut RawExport<TAIL>,
    ) -> Result<DmaBuf, Error> {
        self.check_size(Operation::Export, raw)?;
        // Only a number the kernel wrote is adopted: whatever the caller's struct held (an fd
        // of its own, say) must not become this dma-buf's if the kernel writes none.
        raw.export.fd = -1;
        let fd = sys::export(self.fd.as_fd(), raw)
            .map_err(|errno| self.error(Operation::Export, errno))?
            .ok_or_else(|| self.invalid_reply(Operation::Export, "fd", raw.export.fd.into()))?;
        let dma_buf = DmaBuf::from_fd(fd)?;
        // fstat of an open dma-buf does not fail; if it did, there would be no identity for
        // a cache to have registered it under either.
        if let Ok(export) = self.export_id(&dma_buf) {
            self.hooks.exported(raw.export.handle, export);
        }
        Ok(dma_buf)
    }

    /// Exports `length` bytes at `bar_offset` of a companion device's BAR
    /// (`PEERDIRECT_IOC_EXPORT_RANGE`): memory that the device's owner (its driver's runtime)
    /// allocated, which the caller vouches for; needs `CAP_SYS_ADMIN`. Both numbers are
    /// multiples of the page size. The dma-buf registers like any other.
    pub fn export_range(
        &self,
        bar_offset: u64,
        length: u64,
        flags: ExportFlags,
    ) -> Result<DmaBuf, Error> {
        let mut raw = RawExportRange::<0>::new();
        raw.export.bar_offset = bar_offset;
        raw.export.length = length;
        raw.export.flags = flags.bits();
        self.export_range_raw(&mut raw)
    }

    /// Sends `PEERDIRECT_IOC_EXPORT_RANGE` with an argument the caller built, like
    /// [`Device::export_raw`].
    pub fn export_range_raw<const TAIL: usize>(
        &self,
        raw: &mut RawExportRange<TAIL>,
    ) -> Result<DmaBuf, Error> {
        self.check_size(Operation::ExportRange, raw)?;
        raw.export.fd = -1;
        let fd = sys::export_range(self.fd.as_fd(), raw)
            .map_err(|errno| self.error(Operation::ExportRange, errno))?
            .ok_or_else(|| {
                self.invalid_reply(Operation::ExportRange, "fd", raw.export.fd.into())
            })?;
        let dma_buf = DmaBuf::from_fd(fd)?;
        // Not made from an allocation (handle 0, which none has): only the device's revocation
        // and the file's close tell the caches about it.
        if let Ok(export) = self.export_id(&dma_buf) {
            self.hooks.exported(0, export);
        }
        Ok(dma_buf)
    }

    /// Asks the kernel whether the PCI device at `peer` (a NIC, another accelerator) can reach
    /// this HBM peer-to-peer, and why (`PEERDIRECT_IOC_P2P`). The verdict is the one the
    /// exporter applies when that device's driver attaches to a dma-buf.
    pub fn p2p(&self, peer: PciAddress) -> Result<P2pPath, Error> {
        let hbm = self.info()?.pci_address;
        let mut raw = RawP2p::<0>::new();
        raw.p2p.pci_domain = peer.domain;
        raw.p2p.pci_bus = peer.bus;
        raw.p2p.pci_slot = peer.slot;
        raw.p2p.pci_func = peer.func;
        self.p2p_raw(&mut raw)?;
        Ok(P2pPath::from_raw(hbm, &raw.p2p))
    }

    /// Sends `PEERDIRECT_IOC_P2P` with an argument the caller built, like
    /// [`Device::info_raw`].
    pub fn p2p_raw<const TAIL: usize>(&self, raw: &mut RawP2p<TAIL>) -> Result<(), Error> {
        self.send(Operation::P2p, raw)
    }

    /// Sends command `nr` (`_IO(PEERDIRECT_IOCTL_TYPE, nr)`) with a null argument. For testing
    /// how the module treats commands it does not know (ENOTTY).
    pub fn command_raw(&self, nr: u8) -> Result<(), Error> {
        sys::command(self.fd.as_fd(), nr).map_err(|errno| self.error(Operation::Command(nr), errno))
    }

    /// Records `export` as made from allocation `handle`, as a successful export does: for
    /// testing the hooks without a device.
    #[cfg(test)]
    pub(crate) fn record_export(&self, handle: u32, export: ExportId) {
        self.hooks.exported(handle, export);
    }

    /// Tells the hooks the device is gone, as a command failing with `ENODEV` does.
    #[cfg(test)]
    pub(crate) fn revoke_for_test(&self) {
        self.hooks.device_gone(self.index);
    }

    /// `PEERDIRECT_IOC_FREE` of `handle`.
    pub(crate) fn free_handle(&self, handle: u32) -> Result<(), Error> {
        let mut raw = RawFree::<0>::new();
        raw.free.handle = handle;
        self.free_raw(&mut raw)
    }

    fn send<R: RawRequest>(&self, operation: Operation, raw: &mut R) -> Result<(), Error> {
        self.check_size(operation, raw)?;
        sys::send(self.fd.as_fd(), raw).map_err(|errno| self.error(operation, errno))
    }

    fn check_size<R: RawRequest>(&self, operation: Operation, raw: &R) -> Result<(), Error> {
        check_request_size(operation, &self.path, raw)
    }

    pub(crate) fn invalid_reply(
        &self,
        operation: Operation,
        field: &'static str,
        value: i64,
    ) -> Error {
        Error::InvalidReply {
            operation,
            path: self.path.clone(),
            field,
            value,
        }
    }

    fn error(&self, operation: Operation, errno: Errno) -> Error {
        if errno == Errno::NODEV {
            // The device was unbound, removed or reset: its dma-bufs are revoked.
            self.hooks.device_gone(self.index);
        }
        Error::os(operation, &self.path, errno)
    }
}

impl AsFd for Device {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl From<Device> for OwnedFd {
    /// The crate no longer sees what is freed on the file: the hooks are told as if it were
    /// closed.
    fn from(device: Device) -> Self {
        device.fd
    }
}

/// Opens every `/dev/peerdirectN`, in the order of N. No device nodes (the module is not
/// loaded, or binds no device) is an empty list, not an error.
pub fn devices() -> Result<Vec<Device>, Error> {
    devices_in(Path::new(DEV_DIR))
}

/// What [`Device::info`] says of each device of [`devices`], but for devices being removed
/// (a companion whose removal waits for pinned registrations keeps its device file, whose
/// requests then answer `ENODEV`; an owned device's file can be opened just before it goes).
pub fn device_infos() -> Result<Vec<DeviceInfo>, Error> {
    present_infos(devices()?.iter().map(Device::info))
}

/// The answers of `results`, without those of devices that answered `ENODEV`; the first other
/// error.
fn present_infos<T>(results: impl Iterator<Item = Result<T, Error>>) -> Result<Vec<T>, Error> {
    results
        .filter(|r| !matches!(r, Err(e) if e.errno() == Some(Errno::NODEV)))
        .collect()
}

fn devices_in(dir: &Path) -> Result<Vec<Device>, Error> {
    let list_error = |err: io::Error| {
        let errno = Errno::from_io_error(&err).unwrap_or(Errno::IO);
        Error::os(Operation::List, dir, errno)
    };
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(list_error(err)),
    };
    let mut nodes = Vec::new();
    for entry in entries {
        let entry = entry.map_err(list_error)?;
        if let Some(index) = entry.file_name().to_str().and_then(device_index) {
            nodes.push((index, entry.path()));
        }
    }
    nodes.sort_unstable();
    nodes
        .into_iter()
        .map(|(_, path)| Device::open(path))
        .collect()
}

/// N for a device node named `peerdirectN`.
fn device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(DEVICE_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Refuses a request whose `size` reaches past the memory `raw` has (the kernel would read and
/// write beyond it), without a system call.
pub(crate) fn check_request_size<R: RawRequest>(
    operation: Operation,
    path: &Path,
    raw: &R,
) -> Result<(), Error> {
    if raw.size() as usize > R::CAPACITY {
        return Err(Error::RequestTooLarge {
            operation,
            path: path.to_owned(),
            size: raw.size(),
            capacity: R::CAPACITY,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listings_leave_out_devices_being_removed_but_not_other_errors() {
        let err = |errno| {
            Err(Error::os(
                Operation::Info,
                Path::new("/dev/peerdirect1"),
                errno,
            ))
        };
        let listed = present_infos([Ok(0), err(Errno::NODEV), Ok(2)].into_iter()).unwrap();
        assert_eq!(listed, [0, 2]);
        let failed = present_infos([Ok(0), err(Errno::ACCESS), Ok(2)].into_iter()).unwrap_err();
        assert_eq!(failed.errno(), Some(Errno::ACCESS));
    }

    #[test]
    fn device_path_is_under_dev() {
        assert_eq!(device_path(0), Path::new("/dev/peerdirect0"));
        assert_eq!(device_path(12), Path::new("/dev/peerdirect12"));
    }

    #[test]
    fn device_index_accepts_only_peerdirect_and_digits() {
        assert_eq!(device_index("peerdirect0"), Some(0));
        assert_eq!(device_index("peerdirect17"), Some(17));
        for name in [
            "peerdirect",
            "peerdirect+1",
            "peerdirect-1",
            "peerdirectx",
            "peerdirect1a",
            "xpeerdirect1",
            "peerdirect99999999999",
        ] {
            assert_eq!(device_index(name), None, "{name}");
        }
    }

    /// A directory of its own under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> Self {
            let path =
                std::env::temp_dir().join(format!("peerdirect-test-{}-{name}", std::process::id()));
            fs::create_dir(&path).unwrap();
            Self(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn missing_directory_lists_no_devices() {
        let dir = TempDir::new("missing");
        assert!(devices_in(&dir.0.join("dev")).unwrap().is_empty());
    }

    #[test]
    fn lists_device_nodes_in_index_order() {
        let dir = TempDir::new("order");
        for name in [
            "peerdirect10",
            "peerdirect2",
            "peerdirect0",
            "peerdirect",
            "peerdirectx",
            "null",
        ] {
            fs::write(dir.0.join(name), b"").unwrap();
        }
        let paths: Vec<_> = devices_in(&dir.0)
            .unwrap()
            .iter()
            .map(|d| d.path().to_owned())
            .collect();
        assert_eq!(
            paths,
            ["peerdirect0", "peerdirect2", "peerdirect10"].map(|name| dir.0.join(name))
        );
    }

    #[test]
    fn open_missing_node_names_path_and_hint() {
        let dir = TempDir::new("open");
        let path = dir.0.join("peerdirect0");
        let err = Device::open(&path).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOENT));
        assert!(
            err.to_string()
                .starts_with(&format!("open {}: ", path.display())),
            "{err}"
        );
        assert!(err.hint().unwrap().contains("peerdirect.ko"));
    }

    /// A node neither named peerdirectN nor answering INFO gets an index of its own, not the
    /// pseudo-device of foreign dma-bufs (whose registrations its ENODEV would drop).
    #[test]
    fn a_node_without_an_index_is_not_the_foreign_pseudo_device() {
        let dir = TempDir::new("noindex");
        let path = dir.0.join("hbm-stand-in");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        assert_eq!(device.index(), Device::UNKNOWN_INDEX);
        assert_ne!(device.index(), crate::invalidation::ExportId::FOREIGN);
    }

    /// A FREE that fails leaves the allocation, and so its exports, as they were: a retried
    /// free tells the caches again (they may have registered them anew meanwhile).
    #[test]
    fn a_failed_free_keeps_the_exports_for_the_next_try() {
        #[derive(Default)]
        struct Told(std::sync::Mutex<Vec<ExportId>>);
        impl Invalidate for Told {
            fn exports_freed(&self, exports: &[ExportId]) {
                self.0.lock().unwrap().extend_from_slice(exports);
            }
            fn device_gone(&self, _: u32) {}
        }
        let dir = TempDir::new("failedfree");
        let path = dir.0.join("peerdirect0");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        let told = std::sync::Arc::new(Told::default());
        let weak: std::sync::Weak<Told> = std::sync::Arc::downgrade(&told);
        device.hooks.subscribe(weak);
        device.hooks.exported(3, ExportId::new(0, 33));
        let mut raw = RawFree::<0>::new();
        raw.free.handle = 3;
        for told_so_far in 1..=2 {
            // A regular file answers FREE with ENOTTY.
            assert_eq!(
                device.free_raw(&mut raw).unwrap_err().errno(),
                Some(Errno::NOTTY)
            );
            assert_eq!(
                *told.0.lock().unwrap(),
                vec![ExportId::new(0, 33); told_so_far]
            );
        }
    }

    #[test]
    fn regular_file_is_not_a_peerdirect_device() {
        let dir = TempDir::new("notty");
        let path = dir.0.join("peerdirect0");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        let err = device.info().unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOTTY));
        assert!(err.hint().unwrap().contains("not a peerdirect device"));
        assert_eq!(
            device.command_raw(0x7f).unwrap_err().errno(),
            Some(Errno::NOTTY)
        );
    }

    #[test]
    fn raw_request_larger_than_its_buffer_is_not_sent() {
        let dir = TempDir::new("toolarge");
        let path = dir.0.join("peerdirect0");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        let mut raw = RawInfo::<8>::new();
        raw.info.size = uapi::PEERDIRECT_INFO_SIZE_VER1 + 8 + 1;
        let err = device.info_raw(&mut raw).unwrap_err();
        assert!(
            matches!(
                err,
                Error::RequestTooLarge {
                    size: 105,
                    capacity: 104,
                    ..
                }
            ),
            "{err:?}"
        );
        // Within its buffer, the request reaches the file (which knows no ioctls).
        raw.info.size = 72;
        assert_eq!(
            device.info_raw(&mut raw).unwrap_err().errno(),
            Some(Errno::NOTTY)
        );
    }

    #[test]
    fn hbm_commands_on_a_regular_file_fail_with_enotty() {
        let dir = TempDir::new("hbm-notty");
        let path = dir.0.join("peerdirect0");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        let err = device.alloc(4096, None).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOTTY));
        assert!(
            err.to_string()
                .starts_with(&format!("PEERDIRECT_IOC_ALLOC on {}: ", path.display())),
            "{err}"
        );
        assert!(err.hint().unwrap().contains("not a peerdirect device"));
        let err = device.free_raw(&mut RawFree::<0>::new()).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOTTY));
        // A stale number in the struct is cleared before the call, never adopted.
        let mut raw = RawExport::<0>::new();
        raw.export.fd = 0;
        let err = device.export_raw(&mut raw).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::NOTTY));
        assert_eq!(raw.export.fd, -1);
        assert!(
            err.to_string().starts_with("PEERDIRECT_IOC_EXPORT on "),
            "{err}"
        );
    }

    #[test]
    fn raw_hbm_requests_larger_than_their_buffer_are_not_sent() {
        let dir = TempDir::new("hbm-toolarge");
        let path = dir.0.join("peerdirect0");
        fs::write(&path, b"").unwrap();
        let device = Device::open(&path).unwrap();
        let mut alloc = RawAlloc::<4>::new();
        alloc.alloc.size = 45;
        let err = device.alloc_raw(&mut alloc).unwrap_err();
        assert!(
            matches!(
                err,
                Error::RequestTooLarge {
                    operation: Operation::Alloc,
                    size: 45,
                    capacity: 44,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            err.to_string().starts_with("PEERDIRECT_IOC_ALLOC on "),
            "{err}"
        );
        let mut free = RawFree::<0>::new();
        free.free.size = 17;
        assert!(matches!(
            device.free_raw(&mut free).unwrap_err(),
            Error::RequestTooLarge {
                operation: Operation::Free,
                capacity: 16,
                ..
            }
        ));
        let mut export = RawExport::<0>::new();
        export.export.size = 33;
        assert!(matches!(
            device.export_raw(&mut export).unwrap_err(),
            Error::RequestTooLarge {
                operation: Operation::Export,
                capacity: 32,
                ..
            }
        ));
    }
}
