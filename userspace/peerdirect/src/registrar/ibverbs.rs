//! The ibverbs registrar: `ibv_reg_dmabuf_mr` (rdma-core >= 34) on one RDMA device.
//!
//! `libibverbs.so.1` is loaded at run time, so a binary using this crate runs on hosts without
//! rdma-core; [`IbverbsRegistrar::open`] then fails with [`IbverbsError::LibraryNotLoaded`].
//! The kernel side is the RDMA driver's import of the dma-buf: EFA and irdma pin it
//! (`ib_umem_dmabuf_get_pinned`, `..._revocable_and_lock`), mlx5 maps it dynamically
//! (`ib_umem_dmabuf_get`). Devices whose provider cannot register dma-bufs (rxe, siw; in
//! Linux 7.3 `rdma_rxe` has no `reg_user_mr_dmabuf`) fail with [`IbverbsError::DmaBufUnsupported`],
//! which names the device, the provider, the errno and what to use instead.
//!
//! **The IOVA.** Work requests name registered bytes by I/O virtual address (`ibv_sge.addr`, a
//! peer's `remote_addr`), so the registrar picks it from what it registers ([`IbvSource`]): a
//! dma-buf the caller names by an address of its own (a runtime's device virtual address:
//! [`DmaBufSource::at`], C `pd_register_dmabuf_at`) is registered at that address, bytes
//! `offset..` at IOVA `base_addr + offset`, so that a peer addressing HBM by device VAs, as
//! HCL does, reaches them; any other (a [`DmaBuf`] alone, or one mapped in this process, whose
//! CPU address no NIC or peer uses) at IOVA `offset`.
//!
//! Every `unsafe` block of this registrar is in the private module `ffi` below;
//! [`IbverbsRegistrar::from_raw_pd`] only passes its contract on to it.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::io::Errno;

use super::libfabric::DmaBufSource;
use super::RegPath;
use crate::cache::{Access, ByteRange, DomainId, ExportId, RegKey, Registrar};
use crate::DmaBuf;

/// The library loaded at run time.
pub const LIBRARY: &str = "libibverbs.so.1";
/// Where the kernel lists RDMA devices.
pub const SYSFS_INFINIBAND: &str = "/sys/class/infiniband";

/// `IBV_ACCESS_*` of `<infiniband/verbs.h>` (stable ABI).
const IBV_ACCESS_LOCAL_WRITE: i32 = 1;
const IBV_ACCESS_REMOTE_WRITE: i32 = 1 << 1;
const IBV_ACCESS_REMOTE_READ: i32 = 1 << 2;

/// What the user can do when a device cannot register dma-bufs.
pub const DMA_BUF_ALTERNATIVES: &str = "use an RDMA device whose kernel driver imports dma-bufs (EFA, mlx5, irdma); ibverbs registrations are always direct, so with this device register through libfabric instead, whose host-bounce path (registered host memory, copies through the dma-buf's mapping) works on any NIC";

/// Why the ibverbs registrar could not do its job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IbverbsError {
    /// `dlopen` of the library failed.
    #[error("cannot load {library}: {reason}; install rdma-core's libibverbs (Debian/Ubuntu: libibverbs1 and ibverbs-providers; RHEL: libibverbs), or use the libfabric registrar or the host-bounce path")]
    LibraryNotLoaded {
        /// The library asked for.
        library: String,
        /// What the dynamic loader said.
        reason: String,
    },
    /// The library lacks a function: rdma-core older than 34 has no `ibv_reg_dmabuf_mr`.
    #[error("{library} has no {symbol} ({reason}): rdma-core >= 34 is needed for dma-buf registration; update rdma-core, or use the host-bounce path")]
    MissingSymbol {
        /// The library.
        library: String,
        /// The function.
        symbol: &'static str,
        /// What the dynamic loader said.
        reason: String,
    },
    /// No RDMA device of that name.
    #[error("no RDMA device named {name} (devices: {}); list them with ibv_devices or rdma link", if .available.is_empty() { "none".to_owned() } else { .available.join(", ") })]
    NoSuchDevice {
        /// The name asked for.
        name: String,
        /// The devices libibverbs knows.
        available: Vec<String>,
    },
    /// A setup call (`ibv_get_device_list`, `ibv_open_device`, `ibv_alloc_pd`) failed.
    #[error("{call} on {device}: {}", ErrnoText(*.errno))]
    Setup {
        /// The call.
        call: &'static str,
        /// The device.
        device: String,
        /// errno after the call.
        errno: Errno,
    },
    /// The provider cannot register dma-bufs at all.
    #[error("ibv_reg_dmabuf_mr on {device} (provider {provider}): {}: this provider cannot register dma-bufs{}; {DMA_BUF_ALTERNATIVES}", ErrnoText(*.errno), provider_note(.provider))]
    DmaBufUnsupported {
        /// The RDMA device.
        device: String,
        /// Its provider (kernel driver).
        provider: String,
        /// errno: EOPNOTSUPP (or ENOSYS / EPROTONOSUPPORT from older stacks).
        errno: Errno,
    },
    /// `ibv_reg_dmabuf_mr` failed for another reason.
    #[error("ibv_reg_dmabuf_mr on {device} (provider {provider}) of dma-buf fd {fd} bytes {offset:#x}+{length:#x}: {}{}", ErrnoText(*.errno), reg_hint(*.errno))]
    Register {
        /// The RDMA device.
        device: String,
        /// Its provider.
        provider: String,
        /// The dma-buf.
        fd: i32,
        /// Offset in the dma-buf.
        offset: u64,
        /// Length.
        length: u64,
        /// errno after the call.
        errno: Errno,
    },
    /// `ibv_reg_dmabuf_mr` of a peerdirect export failed with `ENODEV`: the exporter refuses
    /// to attach a revoked dma-buf, and the export is revoked once its device is unbound,
    /// removed or reset. Only registrations through the [`Registrar`] trait know the export's
    /// device (from the key's [`crate::cache::ExportId`]); others say [`IbverbsError::Register`].
    #[error("ibv_reg_dmabuf_mr on {device} (provider {provider}) of dma-buf fd {fd} bytes {offset:#x}+{length:#x}: {}: the export of /dev/peerdirect{hbm_device} is revoked: that HBM device is gone (unbound or removed), or was reset (export again after a reset)", ErrnoText(Errno::NODEV))]
    Revoked {
        /// The RDMA device.
        device: String,
        /// Its provider.
        provider: String,
        /// The dma-buf.
        fd: i32,
        /// Offset in the dma-buf.
        offset: u64,
        /// Length.
        length: u64,
        /// The index of the peerdirect device the dma-buf was exported from.
        hbm_device: u32,
    },
}

impl IbverbsError {
    /// The errno, when a call failed with one.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            Self::Setup { errno, .. }
            | Self::DmaBufUnsupported { errno, .. }
            | Self::Register { errno, .. } => Some(*errno),
            Self::Revoked { .. } => Some(Errno::NODEV),
            Self::LibraryNotLoaded { .. }
            | Self::MissingSymbol { .. }
            | Self::NoSuchDevice { .. } => None,
        }
    }

    /// Whether the device can never register dma-bufs, so that falling back to host bounce
    /// is the answer (and must be reported as such).
    pub fn is_dma_buf_unsupported(&self) -> bool {
        matches!(self, Self::DmaBufUnsupported { .. })
    }
}

/// "EOPNOTSUPP (Operation not supported)".
struct ErrnoText(Errno);

impl fmt::Display for ErrnoText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            Errno::OPNOTSUPP => "EOPNOTSUPP",
            Errno::NOSYS => "ENOSYS",
            Errno::PROTONOSUPPORT => "EPROTONOSUPPORT",
            Errno::INVAL => "EINVAL",
            Errno::NOMEM => "ENOMEM",
            Errno::FAULT => "EFAULT",
            Errno::ACCESS => "EACCES",
            Errno::PERM => "EPERM",
            Errno::BADF => "EBADF",
            Errno::NODEV => "ENODEV",
            Errno::NOENT => "ENOENT",
            Errno::OVERFLOW => "EOVERFLOW",
            _ => return write!(f, "errno {} ({})", self.0.raw_os_error(), self.0),
        };
        write!(f, "{name} ({})", self.0)
    }
}

fn provider_note(provider: &str) -> &'static str {
    match provider {
        "rxe" => " (soft-RoCE: Linux 7.3's rdma_rxe has no dma-buf MRs, and rdma-core's rxe provider no reg_dmabuf_mr)",
        "siw" => " (soft-iWARP has no dma-buf MRs)",
        _ => "",
    }
}

fn reg_hint(errno: Errno) -> &'static str {
    match errno {
        Errno::INVAL => "; the range must lie inside the dma-buf, its IOVA must lie at the same offset in its page as the range does in the dma-buf (a base address of the caller's: page-aligned), and the exporter must accept this NIC as a peer-to-peer importer (see `peerdirect topology`)",
        Errno::NOMEM => "; raise the locked-memory limit (ulimit -l) or free registrations",
        Errno::ACCESS | Errno::PERM => "; a NIC maps a dma-buf for reading and writing whatever access is asked, which a read-only export refuses: export it read-write (PEERDIRECT_EXPORT_RDWR)",
        Errno::NODEV => "; its exporter revoked it (an export of a peerdirect device whose device was reset, unbound or removed): export the memory again and register the new dma-buf",
        _ => "",
    }
}

/// The error for a failed `ibv_reg_dmabuf_mr`: an unsupported provider, or another failure.
pub fn reg_error(
    device: &str,
    provider: &str,
    fd: i32,
    range: ByteRange,
    errno: Errno,
) -> IbverbsError {
    match errno {
        Errno::OPNOTSUPP | Errno::NOSYS | Errno::PROTONOSUPPORT => {
            IbverbsError::DmaBufUnsupported {
                device: device.to_owned(),
                provider: provider.to_owned(),
                errno,
            }
        }
        _ => IbverbsError::Register {
            device: device.to_owned(),
            provider: provider.to_owned(),
            fd,
            offset: range.offset(),
            length: range.length(),
            errno,
        },
    }
}

/// `err`, or for an `ENODEV` of an export of a peerdirect device (not [`ExportId::FOREIGN`]),
/// [`IbverbsError::Revoked`] naming the device.
fn revoked(err: IbverbsError, export: ExportId) -> IbverbsError {
    match err {
        IbverbsError::Register {
            device,
            provider,
            fd,
            offset,
            length,
            errno: Errno::NODEV,
        } if export.device() != ExportId::FOREIGN => IbverbsError::Revoked {
            device,
            provider,
            fd,
            offset,
            length,
            hbm_device: export.device(),
        },
        err => err,
    }
}

/// `IBV_ACCESS_*` for `access`. Local read is always allowed; remote write needs local write.
pub fn ibv_access(access: Access) -> i32 {
    let mut flags = 0;
    if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE) {
        flags |= IBV_ACCESS_LOCAL_WRITE;
    }
    if access.contains(Access::REMOTE_WRITE) {
        flags |= IBV_ACCESS_REMOTE_WRITE;
    }
    if access.contains(Access::REMOTE_READ) {
        flags |= IBV_ACCESS_REMOTE_READ;
    }
    flags
}

/// The kernel driver behind RDMA device `name`, from sysfs under `root` (normally
/// [`SYSFS_INFINIBAND`]): the PCI driver of its parent device (`efa`, `mlx5_core`, `irdma`),
/// or for software devices, which have no parent device, the name without its index (`rxe`,
/// `siw`).
pub fn provider_of(root: &Path, name: &str) -> String {
    let driver: PathBuf = root.join(name).join("device").join("driver");
    if let Some(driver) = std::fs::read_link(&driver)
        .ok()
        .and_then(|target| target.file_name().map(|n| n.to_string_lossy().into_owned()))
    {
        return driver;
    }
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.is_empty() {
        name.to_owned()
    } else {
        stem.to_owned()
    }
}

/// What [`IbverbsRegistrar`] registers: a dma-buf, and the address its first byte is named by
/// in registrations, if the caller names it by one. Implemented by [`DmaBuf`] (none) and by
/// [`DmaBufSource`] (the caller's address of [`DmaBufSource::at`]; none for a mapped one).
pub trait IbvSource {
    /// The dma-buf.
    fn dma_buf(&self) -> &DmaBuf;

    /// The IOVA of the dma-buf's first byte: a registration of bytes `offset..` is made at
    /// IOVA `iova_base + offset`. `None`: at IOVA `offset`.
    fn iova_base(&self) -> Option<u64>;
}

impl IbvSource for DmaBuf {
    fn dma_buf(&self) -> &DmaBuf {
        self
    }

    fn iova_base(&self) -> Option<u64> {
        None
    }
}

impl IbvSource for DmaBufSource {
    fn dma_buf(&self) -> &DmaBuf {
        DmaBufSource::dma_buf(self)
    }

    /// The caller's address ([`DmaBufSource::at`]). A mapped source has none: its address is
    /// this process's CPU mapping, which neither the NIC nor a peer uses, and the offset keeps
    /// the NIC's page size independent of where the mapping landed.
    fn iova_base(&self) -> Option<u64> {
        (!self.is_mapped()).then(|| self.base_addr())
    }
}

/// A memory region made by `ibv_reg_dmabuf_mr`, deregistered when dropped. It holds the device
/// context and protection domain it lives in, so those stay open until the last of their
/// memory regions is gone, whatever becomes of the registrar that made it.
pub struct IbvMr {
    mr: ffi::MrPtr,
    /// The local key.
    pub lkey: u32,
    /// The remote key.
    pub rkey: u32,
    /// The I/O virtual address of its first byte: what work requests (`ibv_sge.addr`, a
    /// peer's `remote_addr`) name it by: the source's [`IbvSource::iova_base`] plus the
    /// range's offset in the dma-buf, or the offset alone.
    pub iova: u64,
    /// Its length in bytes.
    pub length: u64,
    verbs: Arc<ffi::Verbs>,
}

impl IbvMr {
    /// How it reaches the memory: always the dma-buf itself ([`RegPath::DmaBuf`]), since a
    /// provider that refuses dma-bufs fails the registration rather than bounce.
    pub fn path(&self) -> &'static RegPath {
        &RegPath::DmaBuf
    }
}

impl fmt::Debug for IbvMr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbvMr")
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .finish_non_exhaustive()
    }
}

impl Drop for IbvMr {
    fn drop(&mut self) {
        self.verbs.dereg_mr(&self.mr);
    }
}

/// One RDMA device, opened, with a protection domain: registers ranges of dma-bufs in it.
/// The device and domain are released once the registrar and all of its memory regions are.
pub struct IbverbsRegistrar {
    verbs: Arc<ffi::Verbs>,
    device: String,
    provider: String,
    /// Unique in the process ([`DomainId::unique`]), unlike the domain's address.
    id: DomainId,
}

impl fmt::Debug for IbverbsRegistrar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IbverbsRegistrar")
            .field("device", &self.device)
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

impl IbverbsRegistrar {
    /// Opens RDMA device `device` (e.g. `rxe0`, `efa_0`, `mlx5_0`) through [`LIBRARY`] and
    /// allocates a protection domain.
    pub fn open(device: &str) -> Result<Self, IbverbsError> {
        Self::open_with(LIBRARY, device)
    }

    /// As [`IbverbsRegistrar::open`], loading `library` (a name or a path) instead.
    pub fn open_with(library: &str, device: &str) -> Result<Self, IbverbsError> {
        let verbs = Arc::new(ffi::Verbs::open(library, device)?);
        Ok(Self {
            verbs,
            device: device.to_owned(),
            provider: provider_of(Path::new(SYSFS_INFINIBAND), device),
            id: DomainId::unique(),
        })
    }

    /// A registrar for a protection domain the caller allocated, e.g. a runtime's own, whose
    /// queue pairs will use the memory regions, through `library` (normally [`LIBRARY`]: the
    /// copy of libibverbs the process already uses). The registrar never deallocates the
    /// domain nor closes its context. The device's name is read from the domain.
    ///
    /// # Safety
    ///
    /// `pd` is a live `struct ibv_pd *` made by that library, that stays allocated (and its
    /// context open) until the registrar and every memory region it made are dropped, and is
    /// used thread-safely (libibverbs' verbs are).
    // Only forwards its contract to `ffi`, where the pointers are used.
    #[allow(unsafe_code)]
    pub unsafe fn from_raw_pd(
        library: &str,
        pd: std::ptr::NonNull<std::ffi::c_void>,
    ) -> Result<Self, IbverbsError> {
        // SAFETY: the caller's contract is `borrow`'s.
        let (verbs, device) = unsafe { ffi::Verbs::borrow(library, pd) }?;
        Ok(Self {
            verbs: Arc::new(verbs),
            provider: provider_of(Path::new(SYSFS_INFINIBAND), &device),
            device,
            id: DomainId::unique(),
        })
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// Its provider (kernel driver), e.g. `efa`, `mlx5_core`, `rxe`.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// `ibv_reg_dmabuf_mr` of `range` of `source`'s dma-buf at IOVA
    /// [`IbvSource::iova_base`] + the range's offset (the offset alone without a base;
    /// `EOVERFLOW` if the range's IOVAs would pass 2^64); deregistered when the returned
    /// region is dropped.
    pub fn register_range(
        &self,
        source: &(impl IbvSource + ?Sized),
        range: ByteRange,
        access: Access,
    ) -> Result<IbvMr, IbverbsError> {
        let fd = source.dma_buf().as_fd().as_raw_fd();
        let error = |errno| reg_error(&self.device, &self.provider, fd, range, errno);
        let iova = match source.iova_base() {
            None => range.offset(),
            Some(base) => base
                .checked_add(range.end())
                .map(|_| base + range.offset())
                .ok_or_else(|| error(Errno::OVERFLOW))?,
        };
        ffi::Verbs::reg_dmabuf_mr(
            &self.verbs,
            range.offset(),
            range.length(),
            iova,
            fd,
            ibv_access(access),
        )
        .map_err(error)
    }
}

impl Registrar for IbverbsRegistrar {
    /// A [`DmaBuf`] or a [`DmaBufSource`], whichever the caller has (`&dma_buf` coerces).
    type Source = dyn IbvSource;
    type Mr = IbvMr;
    type Error = IbverbsError;

    fn domain(&self) -> DomainId {
        self.id
    }

    /// [`IbverbsRegistrar::register_range`]; an `ENODEV` of a peerdirect export says which
    /// device's export is revoked ([`IbverbsError::Revoked`]).
    fn register(&self, source: &dyn IbvSource, key: &RegKey) -> Result<IbvMr, IbverbsError> {
        self.register_range(source, key.range, key.access)
            .map_err(|err| revoked(err, key.export))
    }

    /// Drops `mr`, which deregisters it in its own protection domain.
    fn deregister(&self, mr: IbvMr) {
        drop(mr);
    }
}

/// Everything unsafe: the library, its functions and the objects they return.
#[allow(unsafe_code)]
mod ffi {
    use std::ffi::{c_char, c_int, c_void, CStr};
    use std::io;

    use libloading::Library;
    use rustix::io::Errno;

    use std::sync::Arc;

    use super::{IbvMr, IbverbsError};

    type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
    type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
    type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
    type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
    type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
    type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
    type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
    type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut Mr;
    type DeregMr = unsafe extern "C" fn(*mut Mr) -> c_int;

    /// The head of `struct ibv_mr` (rdma-core's stable ABI).
    #[repr(C)]
    pub(super) struct Mr {
        context: *mut c_void,
        pd: *mut c_void,
        addr: *mut c_void,
        length: usize,
        handle: u32,
        lkey: u32,
        rkey: u32,
    }

    /// A `struct ibv_mr *` from `ibv_reg_dmabuf_mr`, deregistered exactly once.
    #[derive(Debug)]
    pub(super) struct MrPtr(*mut Mr);

    // SAFETY: an ibv_mr is not tied to the thread that made it; libibverbs allows
    // ibv_dereg_mr from any thread, and nothing here reads it after registration.
    unsafe impl Send for MrPtr {}
    // SAFETY: shared references give no access to the pointer's target.
    unsafe impl Sync for MrPtr {}

    struct Fns {
        close_device: CloseDevice,
        dealloc_pd: DeallocPd,
        reg_dmabuf_mr: RegDmabufMr,
        dereg_mr: DeregMr,
    }

    /// The library, an open device context and a protection domain.
    pub(super) struct Verbs {
        fns: Fns,
        context: *mut c_void,
        pd: *mut c_void,
        /// Whether the domain and context are this library's to release (else the caller's).
        owned: bool,
        /// Kept loaded while the function pointers above live; dropped last.
        _library: Library,
    }

    /// The heads of `struct ibv_pd` and `struct ibv_context` (rdma-core's stable ABI).
    #[repr(C)]
    struct PdHead {
        context: *mut ContextHead,
    }
    #[repr(C)]
    struct ContextHead {
        device: *mut c_void,
    }

    // SAFETY: libibverbs' verbs are thread-safe (rdma-core's documented guarantee for
    // ibv_reg_*_mr, ibv_dereg_mr, ibv_dealloc_pd, ibv_close_device on one context), and the
    // raw pointers are only passed to them.
    unsafe impl Send for Verbs {}
    // SAFETY: as for Send: every use through &Verbs is a thread-safe verb.
    unsafe impl Sync for Verbs {}

    /// Function `name` of `lib` (loaded from `library`).
    ///
    /// # Safety
    ///
    /// `T` is the function's C prototype, and the pointer is not used once `lib` is unloaded.
    unsafe fn symbol<T: Copy>(
        lib: &Library,
        library: &str,
        name: &'static str,
    ) -> Result<T, IbverbsError> {
        let with_nul = format!("{name}\0");
        // SAFETY: forwarded from the caller.
        let found = unsafe { lib.get::<T>(with_nul.as_bytes()) };
        found
            .map(|symbol| *symbol)
            .map_err(|err| IbverbsError::MissingSymbol {
                library: library.to_owned(),
                symbol: name,
                reason: err.to_string(),
            })
    }

    fn errno_now() -> Errno {
        Errno::from_io_error(&io::Error::last_os_error()).unwrap_or(Errno::IO)
    }

    impl Verbs {
        /// Loads `library` and the functions every `Verbs` uses.
        fn load(library: &str) -> Result<(Library, Fns, GetDeviceName), IbverbsError> {
            // SAFETY: loading libibverbs runs its constructors, which only initialise its
            // own state (no thread-unsafe global changes beyond what dlopen does).
            let loaded = unsafe { Library::new(library) };
            let lib = loaded.map_err(|err| IbverbsError::LibraryNotLoaded {
                library: library.to_owned(),
                reason: err.to_string(),
            })?;
            // The caller moves `lib` into the `Verbs` that holds these pointers.
            // SAFETY: each type is its function's C prototype in <infiniband/verbs.h>, and the
            // pointers are only used while `lib` is loaded.
            let (fns, get_device_name) = unsafe {
                (
                    Fns {
                        close_device: symbol(&lib, library, "ibv_close_device")?,
                        dealloc_pd: symbol(&lib, library, "ibv_dealloc_pd")?,
                        reg_dmabuf_mr: symbol(&lib, library, "ibv_reg_dmabuf_mr")?,
                        dereg_mr: symbol(&lib, library, "ibv_dereg_mr")?,
                    },
                    symbol::<GetDeviceName>(&lib, library, "ibv_get_device_name")?,
                )
            };
            Ok((lib, fns, get_device_name))
        }

        /// The caller's protection domain `pd`, and its device's name.
        ///
        /// # Safety
        ///
        /// As `IbverbsRegistrar::from_raw_pd`.
        pub(super) unsafe fn borrow(
            library: &str,
            pd: std::ptr::NonNull<c_void>,
        ) -> Result<(Self, String), IbverbsError> {
            let (lib, fns, get_device_name) = Self::load(library)?;
            let pd = pd.as_ptr();
            // A live ibv_pd's head holds its open context, whose head holds its device, whose
            // name is a NUL-terminated string inside it, copied here.
            // SAFETY: the caller promises a live ibv_pd of this library; see above.
            let device = unsafe {
                let context = (*pd.cast::<PdHead>()).context;
                CStr::from_ptr(get_device_name((*context).device))
            }
            .to_string_lossy()
            .into_owned();
            // SAFETY: as above: the context of a live ibv_pd.
            let context = unsafe { (*pd.cast::<PdHead>()).context.cast::<c_void>() };
            Ok((
                Self {
                    fns,
                    context,
                    pd,
                    owned: false,
                    _library: lib,
                },
                device,
            ))
        }

        pub(super) fn open(library: &str, device: &str) -> Result<Self, IbverbsError> {
            let (lib, fns, get_device_name) = Self::load(library)?;
            // SAFETY: each type is the C prototype of its function in <infiniband/verbs.h>,
            // and the pointers are only used in this function, while `lib` is loaded.
            let (get_device_list, free_device_list, open_device, alloc_pd) = unsafe {
                (
                    symbol::<GetDeviceList>(&lib, library, "ibv_get_device_list")?,
                    symbol::<FreeDeviceList>(&lib, library, "ibv_free_device_list")?,
                    symbol::<OpenDevice>(&lib, library, "ibv_open_device")?,
                    symbol::<AllocPd>(&lib, library, "ibv_alloc_pd")?,
                )
            };

            let setup = |call, errno| IbverbsError::Setup {
                call,
                device: device.to_owned(),
                errno,
            };
            let mut count: c_int = 0;
            // SAFETY: count is a valid out pointer; the list is freed below.
            let list = unsafe { get_device_list(&mut count) };
            if list.is_null() {
                return Err(setup("ibv_get_device_list", errno_now()));
            }
            let mut names = Vec::new();
            let mut found = std::ptr::null_mut();
            for i in 0..usize::try_from(count).unwrap_or(0) {
                // SAFETY: the list holds `count` device pointers.
                let dev = unsafe { *list.add(i) };
                // SAFETY: dev is a device of the list; the name is a NUL-terminated string
                // inside it, copied before the list is freed.
                let name = unsafe { CStr::from_ptr(get_device_name(dev)) }
                    .to_string_lossy()
                    .into_owned();
                if name == device {
                    found = dev;
                }
                names.push(name);
            }
            let context = if found.is_null() {
                std::ptr::null_mut()
            } else {
                // SAFETY: found is a device of the live list; a context outlives the list.
                unsafe { open_device(found) }
            };
            let open_errno = errno_now();
            // SAFETY: list came from get_device_list and is freed once.
            unsafe { free_device_list(list) };
            if found.is_null() {
                return Err(IbverbsError::NoSuchDevice {
                    name: device.to_owned(),
                    available: names,
                });
            }
            if context.is_null() {
                return Err(setup("ibv_open_device", open_errno));
            }
            // SAFETY: context is an open device context.
            let pd = unsafe { alloc_pd(context) };
            if pd.is_null() {
                let errno = errno_now();
                // SAFETY: context is open and has no objects; closed once.
                unsafe { (fns.close_device)(context) };
                return Err(setup("ibv_alloc_pd", errno));
            }
            Ok(Self {
                fns,
                context,
                pd,
                owned: true,
                _library: lib,
            })
        }

        pub(super) fn reg_dmabuf_mr(
            this: &Arc<Self>,
            offset: u64,
            length: u64,
            iova: u64,
            fd: c_int,
            access: c_int,
        ) -> Result<IbvMr, Errno> {
            let length = usize::try_from(length).map_err(|_| Errno::OVERFLOW)?;
            // SAFETY: pd is live for &self; the kernel checks fd, offset and length.
            let mr = unsafe { (this.fns.reg_dmabuf_mr)(this.pd, offset, length, iova, fd, access) };
            if mr.is_null() {
                return Err(errno_now());
            }
            // SAFETY: a non-null result is a valid struct ibv_mr until ibv_dereg_mr.
            let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
            Ok(IbvMr {
                mr: MrPtr(mr),
                lkey,
                rkey,
                iova,
                length: length as u64,
                verbs: Arc::clone(this),
            })
        }

        /// Deregisters `mr`, from `IbvMr::drop` only.
        pub(super) fn dereg_mr(&self, mr: &MrPtr) {
            // An IbvMr holds the Verbs that made it, so self.pd is live while it is.
            // SAFETY: mr was registered in the live self.pd; IbvMr::drop runs once, so this is
            // its only deregistration.
            unsafe { (self.fns.dereg_mr)(mr.0) };
        }
    }

    impl Drop for Verbs {
        fn drop(&mut self) {
            if !self.owned {
                // The caller's domain: theirs to deallocate, now that none of our memory
                // regions is left in it.
                return;
            }
            // SAFETY: every memory region holds an Arc of this Verbs, so none is left when it
            // drops: the pd is empty and deallocated before its context is closed, once each.
            unsafe {
                (self.fns.dealloc_pd)(self.pd);
                (self.fns.close_device)(self.context);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range() -> ByteRange {
        ByteRange::new(0, 64 << 20).unwrap()
    }

    #[test]
    fn eopnotsupp_on_rxe_names_device_provider_errno_and_alternatives() {
        let err = reg_error("rxe0", "rxe", 7, range(), Errno::OPNOTSUPP);
        assert!(err.is_dma_buf_unsupported());
        assert_eq!(err.errno(), Some(Errno::OPNOTSUPP));
        let text = err.to_string();
        for part in [
            "ibv_reg_dmabuf_mr on rxe0",
            "provider rxe",
            "EOPNOTSUPP",
            "cannot register dma-bufs",
            "rdma_rxe has no dma-buf MRs",
            "EFA, mlx5, irdma",
            "host-bounce",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
    }

    #[test]
    fn enosys_is_unsupported_too_and_other_errors_are_not() {
        assert!(reg_error("x0", "x", 3, range(), Errno::NOSYS).is_dma_buf_unsupported());
        let err = reg_error("efa_0", "efa", 3, range(), Errno::INVAL);
        assert!(!err.is_dma_buf_unsupported());
        let text = err.to_string();
        assert!(text.contains("efa_0 (provider efa)"), "{text}");
        assert!(text.contains("fd 3 bytes 0x0+0x4000000"), "{text}");
        assert!(text.contains("EINVAL"), "{text}");
        assert!(text.contains("peer-to-peer"), "{text}");
        assert!(!text.contains("host-bounce"), "{text}");
    }

    #[test]
    fn enodev_of_a_peerdirect_export_names_its_revoked_device() {
        let err = revoked(
            reg_error("rxe0", "rxe", 9, range(), Errno::NODEV),
            ExportId::new(2, 77),
        );
        assert!(
            matches!(err, IbverbsError::Revoked { hbm_device: 2, .. }),
            "{err:?}"
        );
        assert_eq!(err.errno(), Some(Errno::NODEV));
        assert!(!err.is_dma_buf_unsupported());
        assert_eq!(
            err.to_string(),
            "ibv_reg_dmabuf_mr on rxe0 (provider rxe) of dma-buf fd 9 bytes 0x0+0x4000000: ENODEV (No such device (os error 19)): the export of /dev/peerdirect2 is revoked: that HBM device is gone (unbound or removed), or was reset (export again after a reset)"
        );
        // Another exporter's dma-buf: no peerdirect device to name.
        let foreign = revoked(
            reg_error("rxe0", "rxe", 9, range(), Errno::NODEV),
            ExportId::new(ExportId::FOREIGN, 77),
        );
        assert!(matches!(
            foreign,
            IbverbsError::Register {
                errno: Errno::NODEV,
                ..
            }
        ));
        assert!(foreign
            .to_string()
            .ends_with("(an export of a peerdirect device whose device was reset, unbound or removed): export the memory again and register the new dma-buf"));
        // Other errors stay what they are.
        let inval = revoked(
            reg_error("rxe0", "rxe", 9, range(), Errno::INVAL),
            ExportId::new(2, 77),
        );
        assert!(matches!(
            inval,
            IbverbsError::Register {
                errno: Errno::INVAL,
                ..
            }
        ));
    }

    #[test]
    fn missing_library_is_reported_with_what_to_install() {
        let err =
            IbverbsRegistrar::open_with("libibverbs-does-not-exist.so.1", "rxe0").unwrap_err();
        let IbverbsError::LibraryNotLoaded { library, reason } = &err else {
            panic!("expected LibraryNotLoaded, got {err:?}");
        };
        assert_eq!(library, "libibverbs-does-not-exist.so.1");
        assert!(!reason.is_empty());
        let text = err.to_string();
        assert!(
            text.starts_with("cannot load libibverbs-does-not-exist.so.1: "),
            "{text}"
        );
        assert!(text.contains("libibverbs1 and ibverbs-providers"), "{text}");
        assert!(text.contains("host-bounce"), "{text}");
        assert_eq!(err.errno(), None);
    }

    #[test]
    fn no_such_device_lists_the_others() {
        let err = IbverbsError::NoSuchDevice {
            name: "efa_0".into(),
            available: vec!["rxe0".into()],
        };
        assert_eq!(
            err.to_string(),
            "no RDMA device named efa_0 (devices: rxe0); list them with ibv_devices or rdma link"
        );
    }

    #[test]
    fn access_flags() {
        assert_eq!(ibv_access(Access::LOCAL_READ), 0);
        assert_eq!(ibv_access(Access::LOCAL_WRITE), IBV_ACCESS_LOCAL_WRITE);
        assert_eq!(
            ibv_access(Access::REMOTE_WRITE),
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE
        );
        assert_eq!(ibv_access(Access::REMOTE_READ), IBV_ACCESS_REMOTE_READ);
        assert_eq!(ibv_access(Access::all()), 7);
    }

    #[test]
    fn provider_from_sysfs_driver_link_or_software_name() {
        let root = std::env::temp_dir().join(format!("pd-ibverbs-sysfs-{}", std::process::id()));
        let dev = root.join("efa_0").join("device");
        std::fs::create_dir_all(&dev).unwrap();
        std::os::unix::fs::symlink("../../../bus/pci/drivers/efa", dev.join("driver")).unwrap();
        assert_eq!(provider_of(&root, "efa_0"), "efa");
        assert_eq!(provider_of(&root, "rxe0"), "rxe");
        assert_eq!(provider_of(&root, "siw12"), "siw");
        assert_eq!(provider_of(&root, "42"), "42");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
