//! The libfabric registrar: `fi_mr_regattr` with `FI_MR_DMABUF` (libfabric >= 1.20), loaded
//! at run time from `libfabric.so.1`, and the host-bounce fallback when a provider refuses it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use peerdirect::cache::{Access, ByteRange, ExportId, RegCache};
//! use peerdirect::registrar::libfabric::{Fabric, LibfabricRegistrar, MappedDmaBuf};
//! use peerdirect::{Device, ExportFlags};
//!
//! let device = Device::open_index(0)?;
//! let allocation = device.alloc(8 << 20, None)?;
//! let dma_buf = allocation.export(0, 0, ExportFlags::CLOEXEC | ExportFlags::RDWR)?;
//! let export = ExportId::of_dma_buf(0, &dma_buf)?;
//! let hbm = MappedDmaBuf::new(dma_buf)?; // mapped once, kept by every MR of it
//! let registrar = Arc::new(LibfabricRegistrar::new(Fabric::open("tcp", Some("127.0.0.1"))?));
//! let cache = RegCache::from_env()?;
//! let mr = cache.get(&registrar, &hbm, export, ByteRange::new(0, 8 << 20)?, Access::all())?;
//! println!("{:?} key {:#x}", mr.mr().path(), mr.mr().key()); // DmaBuf, or HostBounce { reason }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Software providers (`tcp`, `shm`, `udp`) accept `FI_MR_DMABUF` and use `base_addr +
//! offset` as the region's CPU address, so `base_addr` is the dma-buf's mapping
//! ([`MappedDmaBuf`]). A provider that refuses (verbs on rxe: no dma-buf MRs in the kernel)
//! gets a registered host staging buffer instead; [`Endpoint::send`] and [`Endpoint::recv`]
//! then copy through the dma-buf's mapping in [`CHUNK`]-sized pieces, two in flight, and the
//! registration says so: [`RegPath::HostBounce`] with the provider's reason. Its staging
//! buffer has slots for each direction, so that one send and one receive (or read) of the
//! same registration can run at once, as every step of a ring collective needs; two sends
//! (or two receives) of one host-bounce registration take turns. Transfers of a direct
//! registration never wait for each other.
//!
//! Threads may run transfers on one [`Endpoint`] at once: completions are routed to the
//! transfer whose operation they complete, and a failed transfer cancels and drains its own
//! operations before it returns (Documentation/rdma.md).
//!
//! With libfabric's default `FI_UNIVERSE_SIZE` (1024) an `ofi_rxm` endpoint asks its verbs
//! device for a completion queue of 262144 entries, which soft-RoCE refuses (`fi_enable`:
//! -EINVAL). libfabric reads the universe size only from the environment, and a library
//! must not change the environment of a process whose other threads may be reading it: a
//! program calls [`default_universe_size`] at the start of `main` (the `peerdirect` CLI
//! does), and [`Fabric::endpoint`] names the knob when rxm fails this way.
//!
//! # A domain the caller opened
//!
//! A program that runs libfabric itself registers HBM in its own domain through
//! [`Fabric::from_raw_domain`]: the `struct fid_domain *` is borrowed, never closed here.
//! Lifetime rules: the domain must stay open until the registrar, every [`FabricMr`] made
//! through it and every cache entry of it are gone (drop the handles, then
//! [`crate::RegCache::invalidate_domain`] or drop the cache, then the registrar, then
//! `fi_close` the domain). It must be opened with `FI_THREAD_SAFE`, or the caller serializes
//! its own use of the domain with everything that registers or deregisters through the
//! registrar (cache misses, evictions, invalidations, freeing an allocation of an attached
//! device, dropping a [`crate::Registration`]). Keys are requested from 1 upwards for
//! providers without `FI_MR_PROV_KEY`, unless the program hands its own key allocator to the
//! registrar ([`LibfabricRegistrar::set_keys`], honouring the domain's `mr_key_size`); the
//! memory's `iface` is [`Iface::System`] unless set ([`LibfabricRegistrar::set_iface`]:
//! SynapseAI, as HCL registers). Such a fabric has no endpoints ([`Fabric::endpoint`] says so) and its
//! [`ProviderCaps`] are only the provider's name.
//!
//! # Endpoint-bound registrations
//!
//! A domain with `FI_MR_ENDPOINT` makes memory regions disabled, with no usable key, until
//! bound to an endpoint and enabled. The registrar binds (`fi_mr_bind`) and enables
//! (`fi_mr_enable`) each new registration with the endpoint named
//! ([`LibfabricRegistrar::set_endpoint`]: [`MrEndpoint::of`] one of ours,
//! [`MrEndpoint::from_raw`] the program's) before handing it out; with none named a
//! registration there fails ([`LibfabricError::NoEndpoint`]). A domain [`Fabric::open`]ed
//! without the bit binds nothing. The `mr_mode` of a borrowed domain cannot be read from its
//! pointer, so it binds exactly when an endpoint is named: name one when the domain's info
//! has `FI_MR_ENDPOINT`. Registrations must be closed before the endpoint they are bound to.

#[allow(
    dead_code,
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    clippy::all
)]
mod bindings;
mod sys;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::os::fd::AsFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

// Defined with the loader that opens it, which this file is above.
pub use sys::LIBRARY;

use super::RegPath;
use crate::cache::{Access, ByteRange, Cause, DomainId, ExportId, RegKey, Registrar};
use crate::DmaBuf;

/// The piece size of transfers: every transfer is one tagged message per chunk (tag + chunk
/// index), whatever the registration's path, so direct and bounced peers interoperate.
pub const CHUNK: usize = 1 << 20;
/// Whether a failed `fi_mr_regattr(FI_MR_DMABUF)` means the provider cannot take dma-buf
/// memory at all (then host bounce is the answer): not supported (`FI_EOPNOTSUPP`,
/// `FI_ENOSYS`, `EPROTONOSUPPORT`; verbs on rxe, or the kernel refusing peer-to-peer between
/// the NIC and the HBM). Anything else is a failure to report, not a reason to take the slow
/// path in silence: `EINVAL` (a range outside the dma-buf, or a provider that mishandles
/// dma-bufs of host memory, such as efa in libfabric 2.5.0), `EFAULT`, `EPERM`/`EACCES` (a
/// read-only export registered for writing: export it read-write), `ENOMEM`, keys.
fn refuses_dma_buf(errno: i32) -> bool {
    const ENOSYS: i32 = 38;
    const EPROTONOSUPPORT: i32 = 93;
    const EOPNOTSUPP: i32 = 95;
    matches!(errno, ENOSYS | EPROTONOSUPPORT | EOPNOTSUPP)
}

/// A provider's error number and text, as [`LibfabricError::Completion`] shows them.
struct ProvError<'a>(i32, Option<&'a str>);

impl std::fmt::Display for ProvError<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // No number of its own: whatever its strerror makes of 0 ("Success") says nothing.
            ProvError(0, _) => f.write_str("nothing more"),
            ProvError(number, None) => write!(f, "error {number}"),
            ProvError(number, Some(text)) => write!(f, "{text} ({number})"),
        }
    }
}

/// `err`, or for an `ENODEV` of an export of a peerdirect device (not [`ExportId::FOREIGN`]),
/// [`LibfabricError::Revoked`] naming the device. libfabric passes the kernel's errno through
/// (`ibv_reg_dmabuf_mr`: ib_core refuses a revoked export with `ENODEV`).
fn revoked(err: LibfabricError, export: ExportId) -> LibfabricError {
    const ENODEV: i32 = 19;
    match err {
        LibfabricError::Call {
            provider,
            call,
            errno: ENODEV,
            text,
        } if export.device() != ExportId::FOREIGN => LibfabricError::Revoked {
            provider,
            call,
            errno: ENODEV,
            text,
            hbm_device: export.device(),
        },
        err => err,
    }
}

/// Chunks a host-bounce registration stages at once in each direction (its staging buffer
/// holds twice this many: sends use the first half, receives and reads the second).
const BOUNCE_SLOTS: usize = 2;
/// Chunks a direct registration keeps in flight.
const DIRECT_WINDOW: usize = 8;
/// How long a transfer may go without a completion, unless [`Endpoint::set_timeout`] says.
const STALL: Duration = Duration::from_secs(60);
/// How long a failed transfer waits for its cancelled operations to complete.
const SETTLE: Duration = Duration::from_secs(5);
/// The API version asked for: the first with `FI_MR_DMABUF`.
const API_VERSION: u32 = 1 << 16 | 20;
/// libfabric's universe size (`FI_UNIVERSE_SIZE`: the peers an endpoint expects) unless the
/// environment sets one. ofi_rxm gives each endpoint one core completion queue of
/// (tx + rx) x universe entries, (128 + 128) x 1024 with libfabric's defaults: soft-RoCE's
/// `max_cqe` is 32767, so `ibv_create_cq` and with it `fi_enable` fail with -EINVAL for any
/// universe over 127. 64 peers need 16384 entries.
pub const UNIVERSE_SIZE: &str = "64";

/// What to do when a dma-buf could not be mapped ([`LibfabricError::Map`]).
fn map_hint(errno: rustix::io::Errno) -> &'static str {
    if errno == rustix::io::Errno::NODEV {
        "its exporter revoked it (an export of a peerdirect device whose device was reset, \
         unbound or removed): export the memory again and register the new dma-buf"
    } else {
        "export it with ExportFlags::RDWR, or, for an exporter without mmap or a read-only \
         export, register it by its fd alone (DmaBufSource::at; C: pd_register_dmabuf_at)"
    }
}

/// Errors of the libfabric registrar.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LibfabricError {
    /// `dlopen("libfabric.so.1")` failed.
    #[error("{LIBRARY} not found: install libfabric1 (>= 1.20) ({0})")]
    NotFound(String),
    /// The library lacks a function libfabric has.
    #[error("{LIBRARY} has no {0}: not a usable libfabric; install libfabric1 (>= 1.20)")]
    MissingSymbol(&'static str),
    /// The library predates `FI_MR_DMABUF`.
    #[error("libfabric {major}.{minor} is older than 1.20 (no FI_MR_DMABUF): install libfabric1 (>= 1.20)")]
    TooOld {
        /// Major version.
        major: u32,
        /// Minor version.
        minor: u32,
    },
    /// A libfabric call failed.
    #[error("{provider}: {call}: {text} (-{errno})")]
    Call {
        /// The provider (as asked for, or as `fi_getinfo` named it).
        provider: String,
        /// The call.
        call: &'static str,
        /// The positive libfabric error number.
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
    },
    /// An operation of a transfer completed in error (`fi_cq_readerr`): libfabric's error,
    /// and the provider's own (for verbs, the work completion's status).
    #[error(
        "{provider}: {call} completed in error: {text} (-{errno}); the provider says: {}",
        ProvError(*prov_errno, prov_text.as_deref())
    )]
    Completion {
        /// The provider.
        provider: String,
        /// The operation's call (`fi_read`, `fi_tsend`, ...).
        call: &'static str,
        /// The positive libfabric error number.
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
        /// The provider's error number (`prov_errno`; 0 when it gives none).
        prov_errno: i32,
        /// `fi_cq_strerror` of it, when the provider says.
        prov_text: Option<String>,
    },
    /// [`DmaBufSource::at`]: a base address of 0, or one the dma-buf does not fit after.
    #[error("base address {base_addr:#x} for a {len}-byte dma-buf: give the non-zero address its first byte is named by, with room for all of it below 2^64 (base address + size, its end, is an address too)")]
    BaseAddr {
        /// The address given.
        base_addr: u64,
        /// The dma-buf's length.
        len: u64,
    },
    /// A registration asked for bytes the dma-buf does not have.
    #[error("bytes {range} of a {len}-byte dma-buf: the range runs past its end; ask for bytes inside it")]
    Range {
        /// The bytes asked for.
        range: ByteRange,
        /// The dma-buf's length.
        len: u64,
    },
    /// The dma-buf could not be mapped.
    #[error("mmap of dma-buf ({len} bytes, writable): {errno}; {}", map_hint(*errno))]
    Map {
        /// Its length.
        len: u64,
        /// The kernel's error.
        errno: rustix::io::Errno,
    },
    /// A name holds a NUL byte.
    #[error("{0:?} contains a NUL byte")]
    BadName(String),
    /// The operation needs the fabric, which a borrowed domain does not come with.
    #[error(
        "{provider}: {what} needs a fabric opened by Fabric::open; this one only borrows a domain"
    )]
    Borrowed {
        /// The provider name given with the domain.
        provider: String,
        /// What was asked for.
        what: &'static str,
    },
    /// An ofi_rxm endpoint could not be made: most likely its core completion queue is larger
    /// than the device allows ([`UNIVERSE_SIZE`] says why).
    #[error(
        "{provider}: fi_endpoint/fi_enable: {text} (-{errno}): ofi_rxm asks the device for a \
         completion queue of (tx + rx) x FI_UNIVERSE_SIZE entries, (128 + 128) x {universe} \
         with rxm's default queue sizes: more than small devices take (soft-RoCE: 32767, \
         so FI_UNIVERSE_SIZE <= 127); set FI_UNIVERSE_SIZE lower, before libfabric \
         initializes"
    )]
    RxmEndpoint {
        /// The provider.
        provider: String,
        /// The positive libfabric error number.
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
        /// `FI_UNIVERSE_SIZE` as this process sees it (libfabric's default 1024 if unset).
        universe: String,
    },
    /// The provider refuses to register the dma-buf, and the registrar's host-bounce fallback
    /// is off ([`LibfabricRegistrar::set_host_bounce`]).
    #[error(
        "{reason}; the host-bounce fallback is off: a host-bounce registration names a host \
         staging buffer, which peers would write into instead of HBM unless the caller copies \
         through it"
    )]
    DmaBufRefused {
        /// The provider's refusal.
        reason: String,
    },
    /// The provider refuses to register a dma-buf named by the caller's addresses
    /// ([`DmaBufSource::at`]), which host bounce, though on, cannot copy through: it has no
    /// CPU mapping.
    #[error(
        "{reason}; host bounce is on, but it copies through a CPU mapping of the dma-buf, which \
         one registered at the caller's addresses has not: register it through a mapping \
         (MappedDmaBuf; C: pd_register, pd_register_dmabuf, pd_register_export) for host \
         bounce, or use a provider that registers dma-bufs"
    )]
    DmaBufRefusedAtAddress {
        /// The provider's refusal.
        reason: String,
    },
    /// A transfer's range does not fit in its registration.
    #[error(
        "a transfer of {length} bytes at {offset} does not fit in the {size}-byte registration"
    )]
    OutOfRange {
        /// Where it starts in the registration.
        offset: u64,
        /// Its length.
        length: u64,
        /// The registration's length.
        size: u64,
    },
    /// A received chunk was shorter than the receive asked for.
    #[error(
        "{provider}: chunk {chunk} of the receive got {received} bytes, {expected} expected: \
         the sender sent less than the receiver asked for"
    )]
    ShortMessage {
        /// The provider.
        provider: String,
        /// The chunk's index in the transfer.
        chunk: u64,
        /// Bytes received.
        received: usize,
        /// Bytes expected.
        expected: usize,
    },
    /// A transfer's tags do not fit: `tag + chunks` above [`TAG_LIMIT`] (the top 16 bits of
    /// a tag carry the chunk count).
    #[error("tag {tag:#x} with {chunks} chunk(s) reaches past {limit:#x}: use tags below it", limit = TAG_LIMIT)]
    TagRange {
        /// The transfer's tag.
        tag: u64,
        /// Its chunks.
        chunks: u64,
    },
    /// A receive met a message of a transfer with another number of chunks: the sender sent
    /// more (or less) than the receiver asked for, and the rest would be left for a later
    /// receive.
    #[error(
        "{provider}: the sender's transfer has {sent} chunk(s) (modulo 65536), this receive \
         expected {expected}: sender and receiver disagree on the length"
    )]
    ChunkCount {
        /// The provider.
        provider: String,
        /// The sender's chunk count (modulo 2^16).
        sent: u64,
        /// This receive's.
        expected: u64,
    },
    /// The key allocator ([`LibfabricRegistrar::set_keys`]) had no key left.
    #[error("{provider}: the key allocator has no key left for a new registration")]
    NoKey {
        /// The provider.
        provider: String,
    },
    /// The key allocator gave a key the domain's `mr_key_size` cannot hold.
    #[error(
        "{provider}: key {key:#x} from the key allocator does not fit the domain's key size \
         (keys below {limit:#x})"
    )]
    KeyRange {
        /// The provider.
        provider: String,
        /// The key.
        key: u64,
        /// Keys must be below it.
        limit: u64,
    },
    /// An earlier transfer on the registration failed, and its operations could not be
    /// cancelled: the NIC may still write into its memory.
    #[error(
        "{provider}: operations of an earlier failed transfer on this registration could not be \
         cancelled, so the NIC may still use its memory; deregister it and register again"
    )]
    Stranded {
        /// The provider.
        provider: String,
    },
    /// The provider would copy bytes of this transfer with the CPU at the registration's own
    /// addresses, and they are not mapped in this process (a [`DmaBufSource::at`]
    /// registration at device addresses): libfabric would fault. Nothing was posted.
    #[error(
        "{provider} copies {what} with the CPU at the registered addresses, and bytes \
         {start:#x}..+{len} are not mapped in this process (a registration by fd at device \
         addresses, DmaBufSource::at / pd_register_dmabuf_at): libfabric would fault. {fix}"
    )]
    CpuCopyUnmapped {
        /// The provider.
        provider: String,
        /// What it copies: every byte, or messages up to a size.
        what: String,
        /// The first address the CPU would touch.
        start: u64,
        /// How many bytes from there.
        len: u64,
        /// What to do instead.
        fix: &'static str,
    },
    /// The domain has `FI_MR_ENDPOINT` and no endpoint is named for its registrations
    /// ([`LibfabricRegistrar::set_endpoint`]): nothing was registered.
    #[error(
        "{provider}: the domain has FI_MR_ENDPOINT: a registration is usable only once bound to \
         an endpoint and enabled, and no endpoint is named; name the endpoint that will use \
         the registrations first (LibfabricRegistrar::set_endpoint; C: pd_domain_set_endpoint)"
    )]
    NoEndpoint {
        /// The provider.
        provider: String,
    },
    /// Binding a new registration to the endpoint named (`fi_mr_bind`) or enabling it
    /// (`fi_mr_enable`) failed; the registration was closed.
    #[error(
        "{provider}: {call} of a new registration to the endpoint named for the domain's \
         registrations: {text} (-{errno}); the registration was closed{}",
        if *mode_known {
            ""
        } else {
            ". Name an endpoint only for a domain with FI_MR_ENDPOINT in its mr_mode (its \
             fi_info's domain_attr->mr_mode; a provider may leave out a mode the hints asked \
             for): for one without, name none (C: pd_domain_set_endpoint(dom, NULL))"
        }
    )]
    EndpointBind {
        /// The provider.
        provider: String,
        /// `fi_mr_bind` or `fi_mr_enable`.
        call: &'static str,
        /// The positive libfabric error number.
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
        /// Whether the registrar knows that the domain has `FI_MR_ENDPOINT` (its own domain's
        /// info says so); a borrowed domain's mode is not known, and the endpoint may have been
        /// named for a domain without it.
        mode_known: bool,
    },
    /// [`LibfabricRegistrar::set_endpoint`] named another endpoint (or none) while
    /// registrations made with the endpoint named before are open.
    #[error(
        "{provider}: {registrations} registration(s) made with the endpoint named before are \
         still open: close them first (drop them, and the cache's with \
         RegCache::invalidate_domain), since each must be closed before the endpoint it is \
         bound to; the endpoint named stays as it was"
    )]
    EndpointBusy {
        /// The provider.
        provider: String,
        /// Registrations open (or being made) with the endpoint named before.
        registrations: usize,
    },
    /// The provider refused a registration with `ENODEV` because the dma-buf's export is
    /// revoked: the peerdirect device it came from was removed (unbound, unplugged) or reset.
    /// Only registrations through the [`Registrar`] trait know the export's device (from the
    /// key's [`ExportId`]); others say [`LibfabricError::Call`].
    #[error(
        "{provider}: {call}: {text} (-{errno}): the export of /dev/peerdirect{hbm_device} is \
         revoked: that HBM device is gone (unbound or removed), or was reset (export again \
         after a reset)"
    )]
    Revoked {
        /// The provider.
        provider: String,
        /// The call.
        call: &'static str,
        /// The positive libfabric error number (`ENODEV`).
        errno: i32,
        /// `fi_strerror(errno)`.
        text: String,
        /// The index of the peerdirect device the dma-buf was exported from.
        hbm_device: u32,
    },
    /// A transfer's registration is of HBM its device's removal or reset revoked (the cache
    /// invalidated it): the transfer failed (cancelling what it had posted) or was refused.
    #[error(
        "{provider}: the HBM under this registration is revoked (/dev/peerdirect{hbm_device} \
         was unbound, removed or reset): the transfer cannot complete; drop the registration, \
         and register again once the device is back"
    )]
    TransferRevoked {
        /// The provider.
        provider: String,
        /// The index of the peerdirect device the registration's dma-buf came from.
        hbm_device: u32,
    },
    /// A transfer saw no completion for too long.
    #[error(
        "{provider}: no completion for {secs} s during a transfer: the peer has died, hangs or \
         cannot be reached (check it, and its host and network), or is slower than the \
         endpoint's timeout allows"
    )]
    Stalled {
        /// The provider.
        provider: String,
        /// Seconds waited.
        secs: u64,
    },
}

/// What a provider advertises that matters for registering HBM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderCaps {
    /// The provider `fi_getinfo` chose (e.g. `tcp`, `verbs;ofi_rxm`).
    pub provider: String,
    /// Its domain (e.g. `rxe0`, `lo`).
    pub domain: String,
    /// `FI_HMEM` in its caps: it registers device memory itself. tcp does not advertise it and
    /// still accepts `FI_MR_DMABUF` (it uses the CPU mapping).
    pub hmem: bool,
    /// `FI_MR_LOCAL`: local buffers need their MR's descriptor.
    pub mr_local: bool,
    /// `FI_MR_VIRT_ADDR`: RMA addresses are virtual addresses, not offsets.
    pub mr_virt_addr: bool,
    /// `FI_MR_PROV_KEY`: the provider picks keys.
    pub mr_prov_key: bool,
    /// `FI_MR_ENDPOINT`: MRs must be bound to an endpoint and enabled before use; the
    /// registrar does so with the endpoint it is given ([`LibfabricRegistrar::set_endpoint`]).
    pub mr_endpoint: bool,
    /// Largest message.
    pub max_msg_size: u64,
    /// `FI_RMA` with `FI_READ`, `FI_WRITE` and their remote counterparts: [`Endpoint::read`]
    /// and [`Endpoint::write`] work.
    pub rma: bool,
}

/// The loaded library, or why it cannot be used.
fn library() -> Result<&'static sys::Lib, LibfabricError> {
    let lib = sys::Lib::get().map_err(load_error)?;
    check_version(lib.version())?;
    Ok(lib)
}

/// Sets `FI_UNIVERSE_SIZE` to [`UNIVERSE_SIZE`] unless it is set. libfabric reads it once,
/// when the process's first `fi_getinfo` initializes it.
///
/// Call it at the start of `main`, before the program starts threads or libfabric:
/// `setenv` races with every other thread's `getenv`, which is why the crate never calls it
/// on its own.
pub fn default_universe_size() {
    if std::env::var_os("FI_UNIVERSE_SIZE").is_none() {
        std::env::set_var("FI_UNIVERSE_SIZE", UNIVERSE_SIZE);
    }
}

fn load_error(e: sys::LoadError) -> LibfabricError {
    match e {
        sys::LoadError::NotFound(message) => LibfabricError::NotFound(message),
        sys::LoadError::MissingSymbol(name) => LibfabricError::MissingSymbol(name),
    }
}

fn check_version(version: u32) -> Result<(), LibfabricError> {
    let (major, minor) = (version >> 16, version & 0xffff);
    if (major, minor) < (1, 20) {
        return Err(LibfabricError::TooOld { major, minor });
    }
    Ok(())
}

/// libfabric's version as "major.minor", if the library loads.
pub fn version() -> Result<String, LibfabricError> {
    let v = library()?.version();
    Ok(format!("{}.{}", v >> 16, v & 0xffff))
}

fn call_error(
    lib: &sys::Lib,
    provider: &str,
    call: &'static str,
    e: sys::FiErrno,
) -> LibfabricError {
    LibfabricError::Call {
        provider: provider.to_owned(),
        call,
        errno: e.0,
        text: lib.strerror(e),
    }
}

/// A provider's fabric and domain (thread-safe), opened for tagged messages on reliable
/// datagram endpoints (`FI_EP_RDM`, `FI_TAGGED | FI_MSG`).
pub struct Fabric {
    lib: &'static sys::Lib,
    /// `None` for a borrowed domain.
    info: Option<sys::Info>,
    caps: ProviderCaps,
    domain: Arc<sys::Domain>,
    id: DomainId,
    /// Whether the domain has `FI_MR_ENDPOINT`, as its info says; `None` for a borrowed domain,
    /// whose info this crate never sees: its registrations are bound when an endpoint is named.
    mr_endpoint: Option<bool>,
}

impl std::fmt::Debug for Fabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fabric")
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

impl Fabric {
    /// Opens the first domain of `provider` (`fi_getinfo` with `prov_name`, e.g. `tcp` or
    /// `verbs;ofi_rxm`), its endpoints bound to `node` if given (`FI_SOURCE`).
    pub fn open(provider: &str, node: Option<&str>) -> Result<Self, LibfabricError> {
        let lib = library()?;
        let name =
            sys::c_string(provider).ok_or_else(|| LibfabricError::BadName(provider.into()))?;
        let node: Option<CString> = match node {
            Some(n) => Some(sys::c_string(n).ok_or_else(|| LibfabricError::BadName(n.into()))?),
            None => None,
        };
        use bindings as b;
        let tagged = u64::from(b::FI_TAGGED | b::FI_MSG);
        let rma = u64::from(
            b::FI_RMA | b::FI_READ | b::FI_REMOTE_READ | b::FI_WRITE | b::FI_REMOTE_WRITE,
        );
        let hints = |caps| sys::Hints {
            provider: &name,
            ep_type: b::FI_EP_RDM,
            caps,
            mode: b::FI_CONTEXT | b::FI_CONTEXT2,
            // What this crate handles: descriptors on every post, virtual addresses, keys from
            // the provider, registered (allocated) memory, MRs bound to an endpoint (the
            // registrar binds and enables them, LibfabricRegistrar::set_endpoint). Hints name
            // the modes the caller handles: a provider's info keeps only those it requires,
            // so providers without FI_MR_ENDPOINT (tcp, verbs) answer as before.
            mr_mode: (b::FI_MR_LOCAL
                | b::FI_MR_VIRT_ADDR
                | b::FI_MR_ALLOCATED
                | b::FI_MR_PROV_KEY
                | b::FI_MR_ENDPOINT) as i32,
            node: node.as_deref(),
        };
        let err = |call, e| call_error(lib, provider, call, e);
        // With RMA reads and writes if the provider has them; tagged messages are what it
        // must have.
        let info = match sys::Info::get(lib, API_VERSION, &hints(tagged | rma)) {
            Ok(info) => info,
            Err(e) if e.0 == b::FI_ENODATA as i32 => {
                sys::Info::get(lib, API_VERSION, &hints(tagged))
                    .map_err(|e| err("fi_getinfo", e))?
            }
            Err(e) => return Err(err("fi_getinfo", e)),
        };
        let fields = info.fields();
        let mr_mode = fields.mr_mode as u32;
        let caps = ProviderCaps {
            provider: fields.provider,
            domain: fields.domain,
            hmem: fields.caps & b::FI_HMEM != 0,
            mr_local: mr_mode & b::FI_MR_LOCAL != 0,
            mr_virt_addr: mr_mode & b::FI_MR_VIRT_ADDR != 0,
            mr_prov_key: mr_mode & b::FI_MR_PROV_KEY != 0,
            mr_endpoint: mr_mode & b::FI_MR_ENDPOINT != 0,
            max_msg_size: fields.max_msg_size as u64,
            rma: fields.caps & rma == rma,
        };
        let fabric = sys::Fabric::open(&info).map_err(|e| err("fi_fabric", e))?;
        let domain = sys::Domain::open(&fabric, &info).map_err(|e| err("fi_domain", e))?;
        Ok(Self {
            lib,
            info: Some(info),
            mr_endpoint: Some(caps.mr_endpoint),
            caps,
            domain,
            id: DomainId::unique(),
        })
    }

    /// Wraps a domain the caller opened and will close (`struct fid_domain *`), so that a
    /// [`LibfabricRegistrar`] registers in it; `provider` names it in messages. The library
    /// is loaded (`dlopen`, normally the very copy the caller uses) for its version and error
    /// strings. Each call gets a new [`DomainId`], even for the same domain.
    ///
    /// # Safety
    ///
    /// `domain` points to an open `struct fid_domain` of libfabric >= 1.20 that outlives the
    /// returned `Fabric`, every registrar made from it and every registration made through
    /// those, and is thread-safe or used under the rules of the module documentation
    /// ("A domain the caller opened").
    #[allow(unsafe_code)]
    pub unsafe fn from_raw_domain(
        domain: NonNull<c_void>,
        provider: &str,
    ) -> Result<Self, LibfabricError> {
        let lib = library()?;
        // SAFETY: the caller's contract is `Domain::borrow`'s: an open fid_domain of a
        // libfabric with this ABI that outlives everything made from it, used thread-safely.
        let domain = unsafe { sys::Domain::borrow(domain.cast()) };
        Ok(Self {
            lib,
            info: None,
            caps: ProviderCaps {
                provider: provider.to_owned(),
                domain: String::new(),
                hmem: false,
                mr_local: false,
                mr_virt_addr: false,
                mr_prov_key: false,
                mr_endpoint: false,
                max_msg_size: 0,
                rma: false,
            },
            domain,
            id: DomainId::unique(),
            mr_endpoint: None,
        })
    }

    /// Whether the domain was opened by [`Fabric::open`] (else borrowed).
    pub fn owns_domain(&self) -> bool {
        self.domain.is_owned()
    }

    /// What the provider advertises.
    pub fn caps(&self) -> &ProviderCaps {
        &self.caps
    }

    /// A tagged endpoint of this domain, with its own completion queue and address vector.
    /// Not for a borrowed domain ([`LibfabricError::Borrowed`]).
    pub fn endpoint(&self) -> Result<Endpoint, LibfabricError> {
        let info = self.info.as_ref().ok_or_else(|| LibfabricError::Borrowed {
            provider: self.caps.provider.clone(),
            what: "an endpoint",
        })?;
        let provider = &self.caps.provider;
        let ep = sys::Endpoint::open(&self.domain, info).map_err(|e| {
            const EINVAL: i32 = 22;
            if e.0 == EINVAL && provider.contains("ofi_rxm") {
                LibfabricError::RxmEndpoint {
                    provider: provider.clone(),
                    errno: e.0,
                    text: self.lib.strerror(e),
                    universe: std::env::var("FI_UNIVERSE_SIZE").unwrap_or_else(|_| "1024".into()),
                }
            } else {
                call_error(self.lib, provider, "fi_endpoint/fi_enable", e)
            }
        })?;
        Ok(Endpoint {
            lib: self.lib,
            provider: self.caps.provider.clone(),
            ep: Arc::new(ep),
            stall: STALL,
        })
    }

    fn error(&self, call: &'static str, e: sys::FiErrno) -> LibfabricError {
        call_error(self.lib, &self.caps.provider, call, e)
    }
}

impl LibfabricError {
    /// The errno closest to the failure, for callers that speak errno (the C ABI): a failed
    /// call's number mapped by [`errno_of_fi`]; `None` for failures that are not a call's.
    pub fn errno(&self) -> Option<rustix::io::Errno> {
        match self {
            Self::Call { errno, .. }
            | Self::Revoked { errno, .. }
            | Self::Completion { errno, .. } => Some(errno_of_fi(*errno)),
            Self::Map { errno, .. } => Some(*errno),
            Self::Range { .. } => Some(rustix::io::Errno::INVAL),
            Self::NoKey { .. } => Some(rustix::io::Errno::NOSPC),
            Self::KeyRange { .. } => Some(rustix::io::Errno::RANGE),
            // The domain is not in a state that allows registering: no endpoint bound, as
            // errno_of_fi maps libfabric's "not bound" (FI_ENOCQ, FI_ENOAV).
            Self::NoEndpoint { .. } => Some(rustix::io::Errno::BADFD),
            Self::EndpointBind { errno, .. } => Some(errno_of_fi(*errno)),
            Self::EndpointBusy { .. } => Some(rustix::io::Errno::BUSY),
            Self::TransferRevoked { .. } => Some(rustix::io::Errno::NODEV),
            _ => None,
        }
    }
}

/// The errno closest to libfabric error number `fi_errno` (positive). libfabric's numbers
/// below `FI_ERRNO_OFFSET` (256) are errno values and pass through; its own (`FI_EOTHER` to
/// `FI_ENOMR`) are not, and a C caller handed 266 would read "Unknown error 266".
pub fn errno_of_fi(fi_errno: i32) -> rustix::io::Errno {
    use bindings as b;
    use rustix::io::Errno;
    let Ok(number) = u32::try_from(fi_errno) else {
        return Errno::IO;
    };
    match number {
        n if n < b::FI_EOTHER => Errno::from_raw_os_error(fi_errno),
        // A buffer the caller gave is too small; a completion overran its queue.
        b::FI_ETOOSMALL => Errno::NOBUFS,
        b::FI_EOVERRUN => Errno::OVERFLOW,
        // The object is not in a state that allows the call (not enabled, not bound).
        b::FI_EOPBADSTATE | b::FI_ENOEQ | b::FI_ENOCQ | b::FI_ENOAV | b::FI_EDOMAIN => Errno::BADFD,
        b::FI_EBADFLAGS => Errno::INVAL,
        b::FI_ECRC => Errno::BADMSG,
        b::FI_ETRUNC => Errno::MSGSIZE,
        // A memory key the provider does not know or will not take (a requested key in use).
        b::FI_ENOKEY => Errno::NOKEY,
        // The buffer is not in registered memory.
        b::FI_ENOMR => Errno::FAULT,
        b::FI_ENORX => Errno::AGAIN,
        // FI_EOTHER, FI_EAVAIL (an error entry is waiting: read it) and anything newer.
        _ => Errno::IO,
    }
}

/// What the registrar registers: a dma-buf, and the address its first byte is named by in
/// the registration (`fi_mr_dmabuf.base_addr`; local operations and, with `FI_MR_VIRT_ADDR`,
/// peers' RMA name its bytes from there). Either this process's CPU mapping of it
/// ([`MappedDmaBuf`]), or an address the caller gives ([`DmaBufSource::at`]): registered by
/// its fd alone, never mapped here, as a runtime registers device memory it names by its own
/// device addresses and whose exporter may offer no `mmap` at all (habanalabs).
pub struct DmaBufSource {
    dma_buf: DmaBuf,
    /// The mapping, or the caller's addresses ([`sys::Memory::foreign`]).
    memory: Arc<sys::Memory>,
}

impl std::fmt::Debug for DmaBufSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaBufSource")
            .field("dma_buf", &self.dma_buf)
            .field("base_addr", &format_args!("{:#x}", self.base_addr()))
            .field("mapped", &self.is_mapped())
            .finish()
    }
}

impl DmaBufSource {
    /// `dma_buf`, by its fd alone: its first byte is named `base_addr` in registrations
    /// (whatever address the caller names it by: a device virtual address for a runtime, or,
    /// for a provider that moves bytes with the CPU (tcp, shm), a CPU address of the same
    /// bytes, which that provider then reads and writes). Nothing is mapped, so read-only
    /// exports register for reading and exporters without `mmap` work; but host bounce,
    /// which copies through a mapping, is not possible. `base_addr` must be non-zero with
    /// room for the whole dma-buf after it: `base_addr + len`, the end, is at most
    /// `u64::MAX` (one past the last byte is an address too).
    pub fn at(dma_buf: DmaBuf, base_addr: u64) -> Result<Self, LibfabricError> {
        let len = dma_buf.length();
        let bad = || LibfabricError::BaseAddr { base_addr, len };
        let size = usize::try_from(len).map_err(|_| bad())?;
        base_addr.checked_add(len).ok_or_else(bad)?;
        let base = NonNull::new(base_addr as usize as *mut u8).ok_or_else(bad)?;
        Ok(Self {
            dma_buf,
            memory: sys::Memory::foreign(base, size),
        })
    }

    /// The dma-buf.
    pub fn dma_buf(&self) -> &DmaBuf {
        &self.dma_buf
    }

    /// The address its first byte is named by: the mapping's, or the caller's.
    pub fn base_addr(&self) -> u64 {
        self.memory.ptr.as_ptr() as u64
    }

    /// Whether it is this process's mapping ([`MappedDmaBuf`]), which host bounce needs.
    pub fn is_mapped(&self) -> bool {
        self.memory.is_cpu()
    }
}

/// A dma-buf with its writable CPU mapping, made once per export: a [`DmaBufSource`] whose
/// base address is the mapping (it derefs to one), and the way the CPU reads and writes HBM
/// (plain copies).
pub struct MappedDmaBuf {
    source: DmaBufSource,
}

impl std::fmt::Debug for MappedDmaBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedDmaBuf")
            .field("dma_buf", &self.source.dma_buf)
            .finish_non_exhaustive()
    }
}

impl std::ops::Deref for MappedDmaBuf {
    type Target = DmaBufSource;

    fn deref(&self) -> &DmaBufSource {
        &self.source
    }
}

impl MappedDmaBuf {
    /// Maps all of `dma_buf` shared and writable (it must be exported with `RDWR`).
    pub fn new(dma_buf: DmaBuf) -> Result<Self, LibfabricError> {
        let len = dma_buf.length();
        let map_err = |errno| LibfabricError::Map { len, errno };
        let size = usize::try_from(len).map_err(|_| map_err(rustix::io::Errno::NOMEM))?;
        let memory = sys::Memory::map(dma_buf.as_fd(), size).map_err(map_err)?;
        Ok(Self {
            source: DmaBufSource { dma_buf, memory },
        })
    }

    /// The dma-buf.
    pub fn dma_buf(&self) -> &DmaBuf {
        &self.source.dma_buf
    }

    /// The source alone, for a caller that registers but never copies: the mapping stays
    /// for as long as it or a registration of it lives.
    pub fn into_source(self) -> DmaBufSource {
        self.source
    }

    /// Copies bytes `offset..offset + buf.len()` of the dma-buf into `buf`. Panics if out of
    /// range.
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.source.memory.read(offset, buf);
    }

    /// Copies `data` into the dma-buf at `offset`. Panics if out of range.
    ///
    /// Takes `&mut self`, as [`DmaBufMap::write`](crate::DmaBufMap::write) does, so that two
    /// threads cannot write the same bytes at once through shared references:
    ///
    /// ```compile_fail
    /// fn racing(buf: &peerdirect::registrar::libfabric::MappedDmaBuf) {
    ///     std::thread::scope(|s| {
    ///         s.spawn(|| buf.write(0, &[1]));
    ///         s.spawn(|| buf.write(0, &[2]));
    ///     });
    /// }
    /// ```
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.source.memory.write(offset, data);
    }
}

/// How many registrations took each path, since the registrar was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PathStats {
    /// Registered with `FI_MR_DMABUF`.
    pub dma_buf: u64,
    /// Staged through host memory.
    pub host_bounce: u64,
    /// The reason of the last host-bounce registration.
    pub last_bounce_reason: Option<String>,
}

/// Registers ranges of a [`MappedDmaBuf`] in a [`Fabric`]'s domain (binding each to the
/// endpoint named, where the domain has `FI_MR_ENDPOINT`).
pub struct LibfabricRegistrar {
    fabric: Fabric,
    stats: Mutex<PathStats>,
    /// Whether a refused dma-buf registration falls back to a host staging buffer.
    host_bounce: AtomicBool,
    /// What new registrations request: their keys and the memory's `iface`.
    requests: Mutex<Requests>,
}

/// Where the memory a registrar registers lives, as `fi_mr_attr.iface` and `.device` say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Iface {
    /// `FI_HMEM_SYSTEM` (the default): memory the provider may treat as host memory, as
    /// software providers and verbs with dma-bufs do.
    #[default]
    System,
    /// `FI_HMEM_SYNAPSEAI` on Gaudi `device`, as HCL registers its HBM: only providers built
    /// with libfabric's SynapseAI support take it; others refuse the registration as they
    /// refuse dma-bufs (then host bounce, where allowed and the dma-buf is mapped).
    SynapseAi {
        /// The SynapseAI device id (`fi_mr_attr.device.synapseai`).
        device: i32,
    },
}

/// The keys a registrar requests (`fi_mr_attr.requested_key`) from providers that do not pick
/// their own (no `FI_MR_PROV_KEY`; those ignore it). A key must be unique in the domain, so a
/// runtime that requests keys of its own hands the registrar its allocator
/// ([`LibfabricRegistrar::set_keys`]), as aws-ofi-nccl does with its key pool.
pub trait KeyAllocator: Send + Sync {
    /// A key no registration of the domain uses; `None` when none is left.
    fn allocate(&self) -> Option<u64>;
    /// The registration that had `key` is closed: the key may be handed out again. Called
    /// from whichever thread drops the registration.
    fn release(&self, key: u64);
}

/// The default: one counter for the whole process, from 1. Several registrars (caches) may
/// share a domain, and one made after a domain's invalidation must not request the keys of
/// registrations still held.
struct ProcessKeys;

impl KeyAllocator for ProcessKeys {
    fn allocate(&self) -> Option<u64> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Some(NEXT.fetch_add(1, Relaxed))
    }

    fn release(&self, _: u64) {}
}

struct Requests {
    allocator: Arc<dyn KeyAllocator>,
    /// Keys must be below this (`mr_key_size` bytes); `None`: any `u64`.
    limit: Option<u64>,
    iface: Iface,
    /// The endpoint registrations are bound to now.
    binding: Arc<Binding>,
}

/// The endpoint registrations are bound to ([`LibfabricRegistrar::set_endpoint`]), or none.
/// Each registration holds the one it was made with, from its request to its close, so that
/// the registrar knows whether any made with it is still open.
struct Binding {
    to: Option<Arc<sys::BindTo>>,
}

/// What a new registration requests, copied out of [`Requests`].
struct Request {
    lease: KeyLease,
    iface: Iface,
    binding: Arc<Binding>,
}

/// An endpoint a registrar binds its registrations to, in a domain with `FI_MR_ENDPOINT`
/// ([`LibfabricRegistrar::set_endpoint`]).
pub struct MrEndpoint(Arc<sys::BindTo>);

impl std::fmt::Debug for MrEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrEndpoint").finish_non_exhaustive()
    }
}

impl MrEndpoint {
    /// `endpoint` (of the registrar's fabric, [`Fabric::endpoint`]): it stays open while the
    /// registrar names it and until every registration bound to it is closed, even if the
    /// [`Endpoint`] itself is dropped before.
    pub fn of(endpoint: &Endpoint) -> Self {
        Self(Arc::new(sys::BindTo::Ours(Arc::clone(&endpoint.ep))))
    }

    /// An endpoint the caller opened (`struct fid_ep *`, `fi_endpoint` on the registrar's
    /// domain) and will close; never closed here.
    ///
    /// # Safety
    ///
    /// `ep` points to an open, enabled `struct fid_ep` of the registrar's domain (of a
    /// libfabric of 1.20 or later) that stays open until every registration bound to it is
    /// closed (dropped, and dropped from every cache), and that `fi_mr_bind` may name from the
    /// threads that register (an `FI_THREAD_SAFE` domain, or the caller serializes
    /// registrations with its own use of the endpoint).
    #[allow(unsafe_code)]
    pub unsafe fn from_raw(ep: NonNull<c_void>) -> Self {
        // SAFETY: the caller's contract is `BindTo::borrow`'s: an open endpoint of the domain,
        // kept open until every MR bound to it is closed, usable from the registering threads.
        Self(Arc::new(unsafe { sys::BindTo::borrow(ep.cast()) }))
    }
}

/// A requested key, given back to its allocator when dropped: after the MR, as the field
/// after it in [`FabricMr`] and [`HostMr`].
struct KeyLease {
    allocator: Arc<dyn KeyAllocator>,
    key: u64,
}

impl Drop for KeyLease {
    fn drop(&mut self) {
        self.allocator.release(self.key);
    }
}

impl std::fmt::Debug for LibfabricRegistrar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibfabricRegistrar")
            .field("fabric", &self.fabric)
            .finish_non_exhaustive()
    }
}

impl LibfabricRegistrar {
    /// A registrar for `fabric`'s domain. Where the provider refuses dma-bufs it registers a
    /// host staging buffer instead ([`RegPath::HostBounce`]), which [`Endpoint`] transfers copy
    /// through; [`LibfabricRegistrar::set_host_bounce`] turns that off.
    pub fn new(fabric: Fabric) -> Self {
        Self {
            fabric,
            stats: Mutex::default(),
            host_bounce: AtomicBool::new(true),
            requests: Mutex::new(Requests {
                allocator: Arc::new(ProcessKeys),
                limit: None,
                iface: Iface::System,
                binding: Arc::new(Binding { to: None }),
            }),
        }
    }

    /// Requests keys for new registrations from `allocator` (instead of the process-wide
    /// counter from 1), each below `2^(8 * key_size)` for a domain whose `mr_key_size` is
    /// `key_size` bytes (8 or more: any key); a key above fails the registration
    /// ([`LibfabricError::KeyRange`]), as does an allocator with none left
    /// ([`LibfabricError::NoKey`]). Registrations made before keep their keys.
    pub fn set_keys(&self, allocator: Arc<dyn KeyAllocator>, key_size: usize) {
        let mut requests = self.requests();
        requests.allocator = allocator;
        requests.limit = (key_size < 8).then(|| 1u64 << (8 * key_size));
    }

    /// Requests keys from the process-wide counter again (the default).
    pub fn set_process_keys(&self) {
        self.set_keys(Arc::new(ProcessKeys), 8);
    }

    /// Registers new registrations' memory as `iface` (default [`Iface::System`]).
    pub fn set_iface(&self, iface: Iface) {
        self.requests().iface = iface;
    }

    /// Binds new registrations to `endpoint` (`fi_mr_bind`, then `fi_mr_enable`, before a
    /// registration is handed out), or to none. A domain with `FI_MR_ENDPOINT` needs it:
    /// there a registration with no endpoint named fails ([`LibfabricError::NoEndpoint`],
    /// `EBADFD`), and one that cannot be bound or enabled is closed and fails
    /// ([`LibfabricError::EndpointBind`]). A domain opened by [`Fabric::open`] without
    /// `FI_MR_ENDPOINT` binds nothing, whatever is named. A borrowed domain
    /// ([`Fabric::from_raw_domain`]), whose `mr_mode` this crate cannot read, binds to the
    /// endpoint named if there is one: name one exactly when the domain's info has
    /// `FI_MR_ENDPOINT`.
    ///
    /// Each registration must be closed before the endpoint it is bound to, so the endpoint
    /// named changes only while no registration made with the one named before is open (nor
    /// being made): else [`LibfabricError::EndpointBusy`] (`EBUSY`) and nothing changes; a
    /// cache's entries count, so drop them first ([`crate::RegCache::invalidate_domain`]).
    /// Naming the endpoint named already changes nothing and succeeds.
    pub fn set_endpoint(&self, endpoint: Option<MrEndpoint>) -> Result<(), LibfabricError> {
        let mut requests = self.requests();
        let same = match (&requests.binding.to, &endpoint) {
            (None, None) => true,
            (Some(now), Some(new)) => now.same(&new.0),
            _ => false,
        };
        if same {
            return Ok(());
        }
        // Registrations clone it under this lock: none starts while it is counted and replaced.
        let open = Arc::strong_count(&requests.binding) - 1;
        if open > 0 {
            return Err(LibfabricError::EndpointBusy {
                provider: self.fabric.caps.provider.clone(),
                registrations: open,
            });
        }
        requests.binding = Arc::new(Binding {
            to: endpoint.map(|endpoint| endpoint.0),
        });
        Ok(())
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, Requests> {
        // Only plain values are stored under it.
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A key for a new registration, the registrar's iface and the endpoint to bind it to.
    fn request(&self) -> Result<Request, LibfabricError> {
        // Copied out: the allocator (the caller's code) runs without this lock.
        let (allocator, limit, iface, binding) = {
            let requests = self.requests();
            (
                Arc::clone(&requests.allocator),
                requests.limit,
                requests.iface,
                Arc::clone(&requests.binding),
            )
        };
        let provider = || self.fabric.caps.provider.clone();
        if self.fabric.mr_endpoint == Some(true) && binding.to.is_none() {
            return Err(LibfabricError::NoEndpoint {
                provider: provider(),
            });
        }
        let key = allocator.allocate().ok_or_else(|| LibfabricError::NoKey {
            provider: provider(),
        })?;
        let lease = KeyLease { allocator, key };
        if let Some(limit) = limit.filter(|&limit| key >= limit) {
            return Err(LibfabricError::KeyRange {
                provider: provider(),
                key,
                limit,
            });
        }
        Ok(Request {
            lease,
            iface,
            binding,
        })
    }

    /// Binds a new MR to the endpoint named and enables it, where the domain wants it
    /// ([`LibfabricRegistrar::set_endpoint`]); its key and descriptor are final only then. On
    /// failure the caller drops (closes) the MR.
    fn bind(&self, mr: &mut sys::Mr, binding: &Binding) -> Result<(), LibfabricError> {
        let Some(to) = binding.to.as_ref() else {
            return Ok(());
        };
        if self.fabric.mr_endpoint == Some(false) {
            return Ok(());
        }
        let failed = |call, e: sys::FiErrno| LibfabricError::EndpointBind {
            provider: self.fabric.caps.provider.clone(),
            call,
            errno: e.0,
            text: self.fabric.lib.strerror(e),
            mode_known: self.fabric.mr_endpoint == Some(true),
        };
        mr.bind(Arc::clone(to))
            .map_err(|e| failed("fi_mr_bind", e))?;
        mr.enable().map_err(|e| failed("fi_mr_enable", e))
    }

    /// Whether a dma-buf registration the provider refuses falls back to a host staging buffer
    /// (on by default) or fails with [`LibfabricError::DmaBufRefused`]. Callers that move data
    /// other than through [`Endpoint`] (which copies through the staging buffer) must turn it
    /// off, or copy through [`FabricMr::staging`] themselves.
    pub fn set_host_bounce(&self, allow: bool) {
        self.host_bounce.store(allow, Relaxed);
    }

    /// Its fabric.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// How many registrations took which path.
    pub fn path_stats(&self) -> PathStats {
        self.stats
            .lock()
            .expect("no panics under this lock")
            .clone()
    }

    /// Registers `len` bytes of new, zeroed host memory with `access` (not cached, not
    /// counted in [`LibfabricRegistrar::path_stats`]).
    pub fn register_host(&self, len: usize, access: Access) -> Result<HostMr, LibfabricError> {
        let Request { lease, binding, .. } = self.request()?;
        let mut mr = self
            .fabric
            .domain
            .register_host(fi_access(access), lease.key, sys::Memory::host(len))
            .map_err(|e| self.fabric.error("fi_mr_regattr(host)", e))?;
        self.bind(&mut mr, &binding)?;
        Ok(HostMr {
            mr,
            _key: lease,
            _binding: binding,
        })
    }
}

/// The `FI_*` access bits for `access`: local reads are send and RMA-write sources
/// (`FI_SEND | FI_WRITE`), local writes receive and RMA-read targets (`FI_RECV | FI_READ`).
pub fn fi_access(access: Access) -> u64 {
    let mut bits = 0;
    if access.contains(Access::LOCAL_READ) {
        bits |= u64::from(bindings::FI_SEND | bindings::FI_WRITE);
    }
    if access.contains(Access::LOCAL_WRITE) {
        bits |= u64::from(bindings::FI_RECV | bindings::FI_READ);
    }
    if access.contains(Access::REMOTE_READ) {
        bits |= u64::from(bindings::FI_REMOTE_READ);
    }
    if access.contains(Access::REMOTE_WRITE) {
        bits |= u64::from(bindings::FI_REMOTE_WRITE);
    }
    bits
}

/// A registration: an MR of the dma-buf itself, or of a host staging buffer.
pub struct FabricMr {
    mr: sys::Mr,
    /// Given back after `mr` is closed (fields drop in order).
    _key: KeyLease,
    /// The endpoint setting it was made with, let go of after `mr` is closed.
    _binding: Arc<Binding>,
    path: RegPath,
    range: ByteRange,
    hbm: Arc<sys::Memory>,
    /// Held by a transfer that uses the staging buffer (host bounce): `[0]` by sends, which
    /// use the first half of its slots, `[1]` by receives and reads, which use the second.
    staging: [Mutex<()>; 2],
    /// Chunks copied through the staging buffer (host bounce).
    staged_chunks: AtomicU64,
    /// Bytes of those chunks.
    staged_bytes: AtomicU64,
    /// A failed transfer left operations that could not be cancelled.
    stranded: AtomicBool,
    /// The index of the peerdirect device whose removal or reset revoked the memory
    /// ([`Registrar::invalidated`] with [`Cause::Device`]); `u32::MAX` while it is not.
    revoked: AtomicU32,
}

impl FabricMr {
    /// The device whose removal or reset revoked the registration's memory, if one did.
    fn revoked(&self) -> Option<u32> {
        Some(self.revoked.load(Relaxed)).filter(|&device| device != u32::MAX)
    }
}

impl std::fmt::Debug for FabricMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FabricMr")
            .field("path", &self.path)
            .field("range", &self.range)
            .field("key", &self.key())
            .finish_non_exhaustive()
    }
}

impl FabricMr {
    /// How it reaches HBM.
    pub fn path(&self) -> &RegPath {
        &self.path
    }

    /// Whether a failed transfer left operations on it that could not be cancelled: no later
    /// transfer may use it ([`LibfabricError::Stranded`]), and the endpoint that posted them
    /// keeps them, with this registration's memory, for the life of the process.
    pub fn stranded(&self) -> bool {
        self.stranded.load(Relaxed)
    }

    /// `fi_mr_key`: what peers name it with in RMA (read now: in a domain with
    /// `FI_MR_ENDPOINT`, the key of the bound and enabled MR).
    pub fn key(&self) -> u64 {
        self.mr.key()
    }

    /// `fi_mr_desc`, as an address (0 when the provider needs none).
    pub fn desc(&self) -> usize {
        self.mr.desc()
    }

    /// The bytes of the dma-buf it covers.
    pub fn range(&self) -> ByteRange {
        self.range
    }

    /// Bytes of host staging memory (0 when direct).
    pub fn staging_bytes(&self) -> usize {
        if self.path.is_direct() {
            0
        } else {
            self.mr.memory().len()
        }
    }

    /// What a peer needs to read bytes from `offset` (relative to the registration's range) on
    /// with [`Endpoint::read`]: the address, virtual when the domain uses `FI_MR_VIRT_ADDR`
    /// (`virt_addr`, [`ProviderCaps::mr_virt_addr`]) else the offset from the registration's
    /// start, and the key. `None` for host bounce: a peer's RMA would reach the staging buffer,
    /// not HBM.
    pub fn remote(&self, offset: u64, virt_addr: bool) -> Option<RemoteMr> {
        if !self.path.is_direct() || offset > self.range.length() {
            return None;
        }
        let addr = if virt_addr {
            // The registration's base_addr is the dma-buf mapping; the range starts inside it.
            self.hbm.ptr.as_ptr() as u64 + self.range.offset() + offset
        } else {
            offset
        };
        Some(RemoteMr {
            addr,
            key: self.key(),
        })
    }

    /// Where the registration starts in this process and how long it is, for the `buf` of
    /// local operations (`fi_tsend`, `fi_read`'s destination, ...) with [`FabricMr::desc`]:
    /// the dma-buf's mapping (the `base_addr` it was registered with) plus its range's offset.
    /// `None` for host bounce: the key and descriptor name the staging buffer
    /// ([`FabricMr::staging`]).
    pub fn local(&self) -> Option<(NonNull<u8>, u64)> {
        if !self.path.is_direct() {
            return None;
        }
        let offset = usize::try_from(self.range.offset()).ok()?;
        // The range lies inside the mapping (checked when it was registered), so the sum
        // stays inside the same allocation.
        let start = self.hbm.ptr.as_ptr().wrapping_add(offset);
        Some((NonNull::new(start)?, self.range.length()))
    }

    /// The host staging buffer of a host-bounce registration (`None` when direct): its address
    /// and length. The key and descriptor name it, not HBM: a caller that posts its own
    /// operations copies HBM into it before sending and out of it after receiving, and must
    /// not use it while an [`Endpoint`] transfer of this registration runs.
    pub fn staging(&self) -> Option<(NonNull<u8>, usize)> {
        if self.path.is_direct() {
            return None;
        }
        let memory = self.mr.memory();
        Some((memory.ptr, memory.len()))
    }

    /// Chunks that transfers have passed through the staging buffer: sent from it after a copy
    /// from HBM, or received into it and copied to HBM (0 when direct).
    pub fn staged_chunks(&self) -> u64 {
        self.staged_chunks.load(Relaxed)
    }

    /// Bytes that transfers have copied with the CPU between HBM and the staging buffer: the
    /// cost of host bounce a direct registration does not pay (0 when direct).
    pub fn staged_bytes(&self) -> u64 {
        self.staged_bytes.load(Relaxed)
    }
}

impl Registrar for LibfabricRegistrar {
    type Source = DmaBufSource;
    type Mr = FabricMr;
    type Error = LibfabricError;

    fn domain(&self) -> DomainId {
        self.fabric.id
    }

    fn register(&self, source: &DmaBufSource, key: &RegKey) -> Result<FabricMr, LibfabricError> {
        let access = fi_access(key.access);
        let range = key.range;
        let len = source.memory.len() as u64;
        if range.end() > len {
            return Err(LibfabricError::Range { range, len });
        }
        let Request {
            lease,
            iface,
            binding,
        } = self.request()?;
        let requested_key = lease.key;
        let direct = self.fabric.domain.register_dma_buf(
            source.dma_buf.as_fd(),
            sys::DmaBufRange {
                offset: range.offset(),
                len: range.length(),
            },
            access,
            requested_key,
            match iface {
                Iface::System => sys::Hmem::System,
                Iface::SynapseAi { device } => sys::Hmem::SynapseAi(device),
            },
            Arc::clone(&source.memory),
        );
        let (mut mr, path) = match direct {
            Ok(mr) => (mr, RegPath::DmaBuf),
            // Anything else (out of memory, keys, a revoked export, ...) is an error of its
            // own, not a reason to take the slow path.
            Err(other) if !refuses_dma_buf(other.0) => {
                return Err(revoked(
                    self.fabric.error("fi_mr_regattr(FI_MR_DMABUF)", other),
                    key.export,
                ));
            }
            Err(refused) => {
                let reason = self
                    .fabric
                    .error("fi_mr_regattr(FI_MR_DMABUF)", refused)
                    .to_string();
                if !self.host_bounce.load(Relaxed) {
                    return Err(LibfabricError::DmaBufRefused { reason });
                }
                if !source.is_mapped() {
                    return Err(LibfabricError::DmaBufRefusedAtAddress { reason });
                }
                let slots = usize::try_from(range.length())
                    .unwrap_or(usize::MAX)
                    .div_ceil(CHUNK)
                    .clamp(1, BOUNCE_SLOTS);
                let staging = sys::Memory::host(2 * slots * CHUNK);
                let mr = self
                    .fabric
                    .domain
                    .register_host(access, requested_key, staging)
                    .map_err(|e| self.fabric.error("fi_mr_regattr(host staging)", e))?;
                (mr, RegPath::HostBounce { reason })
            }
        };
        // Dropped (closed) on failure, before its key is given back.
        self.bind(&mut mr, &binding)?;
        let mut stats = self.stats.lock().expect("no panics under this lock");
        match &path {
            RegPath::HostBounce { reason } => {
                stats.host_bounce += 1;
                stats.last_bounce_reason = Some(reason.clone());
            }
            _ => stats.dma_buf += 1,
        }
        Ok(FabricMr {
            mr,
            _key: lease,
            _binding: binding,
            path,
            range,
            hbm: Arc::clone(&source.memory),
            staging: [Mutex::new(()), Mutex::new(())],
            staged_chunks: AtomicU64::new(0),
            staged_bytes: AtomicU64::new(0),
            stranded: AtomicBool::new(false),
            revoked: AtomicU32::new(u32::MAX),
        })
    }

    fn deregister(&self, mr: FabricMr) {
        drop(mr);
    }

    /// A registration of a revoked export ([`Cause::Device`]) fails its transfers from now
    /// on, those in flight included, with [`LibfabricError::TransferRevoked`]: the NIC can no
    /// longer reach the memory, and a provider need not report that to both ends (ofi_rxm's
    /// rendezvous sender waits for an acknowledgement the failed receiver never sends).
    fn invalidated(&self, key: &RegKey, mr: &FabricMr, cause: Cause) {
        if cause == Cause::Device && key.export.device() != ExportId::FOREIGN {
            mr.revoked.store(key.export.device(), Relaxed);
        }
    }
}

/// Host memory registered in a fabric's domain ([`LibfabricRegistrar::register_host`]): the
/// other end of RMA when the HBM registration cannot be an RMA target (host bounce, or a
/// provider that mishandles `FI_MR_DMABUF` targets; Documentation/rdma.md).
pub struct HostMr {
    mr: sys::Mr,
    _key: KeyLease,
    _binding: Arc<Binding>,
}

impl std::fmt::Debug for HostMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostMr")
            .field("len", &self.len())
            .field("key", &self.mr.key())
            .finish_non_exhaustive()
    }
}

impl HostMr {
    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.mr.memory().len()
    }

    /// Whether it is empty (never: registrations have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `data` into it at `offset`. Panics outside it.
    ///
    /// Takes `&mut self`: two threads cannot write the same bytes at once through shared
    /// references.
    ///
    /// ```compile_fail
    /// fn racing(mr: &peerdirect::registrar::libfabric::HostMr) {
    ///     std::thread::scope(|s| {
    ///         s.spawn(|| mr.write(0, &[1]));
    ///         s.spawn(|| mr.write(0, &[2]));
    ///     });
    /// }
    /// ```
    pub fn write(&mut self, offset: usize, data: &[u8]) {
        self.mr.memory().write(offset, data);
    }

    /// Copies bytes at `offset` into `buf`. Panics outside it.
    pub fn read(&self, offset: usize, buf: &mut [u8]) {
        self.mr.memory().read(offset, buf);
    }

    /// What a peer needs to reach bytes from `offset` on with RMA (see [`FabricMr::remote`]).
    pub fn remote(&self, offset: u64, virt_addr: bool) -> RemoteMr {
        RemoteMr {
            addr: if virt_addr {
                self.mr.memory().ptr.as_ptr() as u64 + offset
            } else {
                offset
            },
            key: self.mr.key(),
        }
    }
}

/// Where a transfer's chunk count goes in its messages' tags: the top 16 bits (the count
/// modulo 2^16), so that a receive learns from its first chunk whether the sender sent as many
/// chunks as it expects. The caller's tags, plus one per chunk, stay below [`TAG_LIMIT`].
const COUNT_SHIFT: u32 = 48;
const COUNT_MASK: u64 = 0xffff << COUNT_SHIFT;
/// Tags a transfer may use (`tag + chunks` at most this).
pub const TAG_LIMIT: u64 = 1 << COUNT_SHIFT;

/// The tag of chunk `id` of a transfer of `count` chunks with base `tag`: a send carries the
/// count; a receive asks for `tag + id` and ignores the count bits (checked on completion).
fn chunk_tag(kind: sys::Kind, tag: u64, id: u64, count: u64) -> u64 {
    let tag = tag + id;
    match kind {
        sys::Kind::Send => tag | ((count << COUNT_SHIFT) & COUNT_MASK),
        _ => tag,
    }
}

/// A peer's registered memory as RMA names it: address and key ([`FabricMr::remote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMr {
    /// The address of the first byte to read: virtual, or an offset (see [`FabricMr::remote`]).
    pub addr: u64,
    /// The registration's key.
    pub key: u64,
}

/// A peer in an endpoint's address vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(u64);

/// A tagged endpoint ([`Fabric::endpoint`]).
pub struct Endpoint {
    lib: &'static sys::Lib,
    provider: String,
    /// Shared with the registrations bound to it ([`MrEndpoint::of`]), which keep it open.
    ep: Arc<sys::Endpoint>,
    /// How long a transfer may go without a completion ([`Endpoint::set_timeout`]).
    stall: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .finish_non_exhaustive()
    }
}

/// The pieces of a transfer: `(offset, length)` of each [`CHUNK`] of `length` bytes.
pub fn chunks(length: u64) -> impl Iterator<Item = (u64, usize)> {
    (0..length.div_ceil(CHUNK as u64)).map(move |i| {
        let offset = i * CHUNK as u64;
        (offset, (length - offset).min(CHUNK as u64) as usize)
    })
}

/// For a registration known only by the caller's addresses (`hbm`, the registered range at
/// `range_offset` in it): refuses a transfer some of whose bytes `provider` would copy with
/// the CPU at those addresses ([`cpu_copied_up_to`]) when they are not mapped in this
/// process, rather than let libfabric fault on them. `env` reads the provider's settings.
fn check_cpu_copies(
    provider: &str,
    hbm: &sys::Memory,
    range_offset: u64,
    plan: Plan,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(), LibfabricError> {
    let Some(limit) = cpu_copied_up_to(provider, plan.kind, env) else {
        return Ok(());
    };
    // The chunks the provider copies: all of them, or (chunks being CHUNK but the last) the
    // last alone; either way one run of bytes.
    let Some((start, len)) = chunks(plan.length)
        .filter(|&(_, len)| len as u64 <= limit)
        .fold(None, |run: Option<(u64, u64)>, (at, len)| {
            let first = run.map_or(at, |(first, _)| first);
            Some((first, at + len as u64 - first))
        })
    else {
        return Ok(());
    };
    // Inside the registration (checked by the caller).
    let offset = range_offset + plan.offset + start;
    if hbm.is_mapped_here(offset as usize, len as usize) {
        return Ok(());
    }
    let (what, fix) = if limit == u64::MAX {
        (
            "every byte it moves".to_owned(),
            "Register a mapped source (MappedDmaBuf; C: pd_register_dmabuf), or name the bytes \
             by a CPU address that maps them.",
        )
    } else {
        (
            format!("messages of up to {limit} bytes (ofi_rxm's eager and segmented protocols)"),
            "Send larger messages (ofi_rxm hands those to the NIC), or register a mapped source \
             for small ones.",
        )
    };
    Err(LibfabricError::CpuCopyUnmapped {
        provider: provider.to_owned(),
        what,
        start: hbm.base() + offset,
        len,
        fix,
    })
}

/// The longest message `provider` (as `fi_getinfo` names it: `tcp`, `verbs;ofi_rxm`, ...)
/// copies with the CPU at the registered addresses themselves, in a transfer of `kind`, rather
/// than handing the addresses to a NIC; `u64::MAX` for every byte, `None` for none. Providers
/// that move bytes through sockets or shared memory copy everything; ofi_rxm over a NIC copies
/// messages up to its segmentation limit through its own buffers (`FI_HMEM_SYSTEM`
/// registrations: libfabric 2.1's `rxm_ep_init_proto`) and lets the NIC do RMA and larger
/// messages. `env` reads its settings (`FI_OFI_RXM_BUFFER_SIZE`, `FI_OFI_RXM_SAR_LIMIT`).
fn cpu_copied_up_to(
    provider: &str,
    kind: sys::Kind,
    env: impl Fn(&str) -> Option<String>,
) -> Option<u64> {
    let core = provider.split(';').next().unwrap_or(provider);
    if matches!(core, "tcp" | "udp" | "sockets" | "shm" | "sm2") {
        return Some(u64::MAX);
    }
    if !provider.split(';').any(|p| p == "ofi_rxm")
        || !matches!(kind, sys::Kind::Send | sys::Kind::Recv)
    {
        return None;
    }
    let setting = |name| env(name).and_then(|v| v.trim().parse::<u64>().ok());
    // rxm's rules: the eager limit is the buffer size (16 KiB); segmentation goes up to
    // FI_OFI_RXM_SAR_LIMIT if above it, else eight times it, and not past it when it is
    // over 64 KiB.
    let eager = setting("FI_OFI_RXM_BUFFER_SIZE").unwrap_or(16384);
    Some(if eager > u64::from(u16::MAX) {
        eager
    } else {
        match setting("FI_OFI_RXM_SAR_LIMIT") {
            Some(sar) if sar > eager => sar,
            Some(_) => eager,
            None => eager * 8,
        }
    })
}

/// What a transfer does: its kind, the bytes of the registration, the peer and the first tag.
#[derive(Clone, Copy)]
struct Plan {
    kind: sys::Kind,
    /// Where in the registration's range.
    offset: u64,
    length: u64,
    /// `fi_addr_t` (`u64::MAX`, FI_ADDR_UNSPEC, for receives from anyone).
    peer: u64,
    tag: u64,
}

impl Endpoint {
    /// How long a transfer may go without a completion before it fails with
    /// [`LibfabricError::Stalled`] (default 60 s): a peer that died or hung is noticed no
    /// later than this. Not less than a second.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.stall = timeout.max(Duration::from_secs(1));
    }

    /// Its address (`fi_getname`), for [`Endpoint::insert_peer`] on other endpoints.
    pub fn address(&self) -> Result<Vec<u8>, LibfabricError> {
        self.ep.name().map_err(|e| self.error("fi_getname", e))
    }

    /// Adds a peer's address to the address vector (`fi_av_insert`).
    pub fn insert_peer(&self, address: &[u8]) -> Result<Peer, LibfabricError> {
        self.ep
            .insert(address)
            .map(Peer)
            .map_err(|e| self.error("fi_av_insert", e))
    }

    /// Sends bytes `offset..offset + length` of `mr` (relative to its range) to `peer` with
    /// tagged messages `tag`, `tag + 1`, ... (one per chunk, carrying the chunk count in the
    /// tag's top 16 bits; `tag` plus the chunks at most [`TAG_LIMIT`]), returning once all
    /// completed.
    /// Host bounce copies each chunk from HBM to the staging buffer first.
    pub fn send(
        &self,
        mr: &FabricMr,
        offset: u64,
        length: u64,
        peer: Peer,
        tag: u64,
    ) -> Result<(), LibfabricError> {
        self.transfer(
            mr,
            Plan {
                kind: sys::Kind::Send,
                offset,
                length,
                peer: peer.0,
                tag,
            },
        )
    }

    /// Receives what [`Endpoint::send`] sends with `tag` into bytes `offset..offset + length`
    /// of `mr`, from any peer. Host bounce copies each chunk from staging to HBM on arrival.
    /// A sender whose transfer has another number of chunks (a longer or shorter send) fails
    /// it with [`LibfabricError::ChunkCount`], instead of leaving chunks for a later receive.
    pub fn recv(
        &self,
        mr: &FabricMr,
        offset: u64,
        length: u64,
        tag: u64,
    ) -> Result<(), LibfabricError> {
        self.transfer(
            mr,
            Plan {
                kind: sys::Kind::Recv,
                offset,
                length,
                peer: u64::MAX,
                tag,
            },
        )
    }

    /// Reads this endpoint's completion queue once, which drives progress for providers with
    /// manual progress: an endpoint that is only the target of RMA calls it while peers read.
    pub fn progress(&self) -> Result<(), LibfabricError> {
        // A transfer of its own, with no operations: other transfers' completions it reads
        // go to them.
        let transfer = self.ep.begin();
        let mut done = Vec::new();
        self.ep
            .completions(&transfer, &mut done)
            .map_err(|e| self.error("fi_cq_read", e))
    }

    /// Reads `length` bytes of `peer`'s registered memory at `remote` with RMA (`fi_read`, in
    /// [`CHUNK`]s) into bytes `offset..offset + length` of `mr`, returning once all completed.
    /// The peer posts nothing. Host bounce reads into the staging buffer and copies each chunk
    /// to HBM on arrival. Needs [`ProviderCaps::rma`].
    pub fn read(
        &self,
        mr: &FabricMr,
        offset: u64,
        length: u64,
        peer: Peer,
        remote: RemoteMr,
    ) -> Result<(), LibfabricError> {
        let kind = sys::Kind::Read {
            addr: remote.addr,
            key: remote.key,
        };
        self.rma(kind, mr, offset, length, peer)
    }

    /// Writes bytes `offset..offset + length` of `mr` into `peer`'s registered memory at
    /// `remote` with RMA (`fi_write`, in [`CHUNK`]s), returning once all completed. The peer
    /// posts nothing. Host bounce copies each chunk out of HBM into the staging buffer first.
    /// Needs [`ProviderCaps::rma`]. A completion is libfabric's default, transmit complete:
    /// the bytes need not be in the peer's memory yet (tcp places them as the peer
    /// progresses); tell the peer with a message sent after them, or read after them where
    /// the provider orders reads after writes (`FI_ORDER_RAW`, what HCL's flush relies on),
    /// before it reads them.
    pub fn write(
        &self,
        mr: &FabricMr,
        offset: u64,
        length: u64,
        peer: Peer,
        remote: RemoteMr,
    ) -> Result<(), LibfabricError> {
        let kind = sys::Kind::Write {
            addr: remote.addr,
            key: remote.key,
        };
        self.rma(kind, mr, offset, length, peer)
    }

    /// An RMA read or write of `length` bytes of `mr` at `offset`, untagged.
    fn rma(
        &self,
        kind: sys::Kind,
        mr: &FabricMr,
        offset: u64,
        length: u64,
        peer: Peer,
    ) -> Result<(), LibfabricError> {
        let plan = Plan {
            kind,
            offset,
            length,
            peer: peer.0,
            tag: 0,
        };
        self.transfer(mr, plan)
    }

    fn transfer(&self, mr: &FabricMr, plan: Plan) -> Result<(), LibfabricError> {
        let Plan { offset, length, .. } = plan;
        let size = mr.range.length();
        if offset.checked_add(length).is_none_or(|end| end > size) {
            return Err(LibfabricError::OutOfRange {
                offset,
                length,
                size,
            });
        }
        // Host bounce: one transfer per direction at a time per registration, each direction
        // with staging slots of its own. Direct transfers share nothing of the registration.
        let _staging = (!mr.path.is_direct()).then(|| {
            let direction = usize::from(!plan.kind.outbound());
            mr.staging[direction]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
        });
        self.check_revoked(mr)?;
        if mr.stranded.load(Relaxed) {
            return Err(LibfabricError::Stranded {
                provider: self.provider.clone(),
            });
        }
        if !mr.hbm.is_cpu() {
            check_cpu_copies(&self.provider, &mr.hbm, mr.range.offset(), plan, |name| {
                std::env::var(name).ok()
            })?;
        }
        let transfer = self.ep.begin();
        let result = self.run(&transfer, mr, plan);
        if result.is_err() && !self.settle(&transfer) {
            // The NIC may still write into the registration's memory (its staging slots
            // among it): no later transfer may use it.
            mr.stranded.store(true, Relaxed);
        }
        result
    }

    /// After a failed transfer: cancels its pending operations and reads completions until
    /// none is left, for at most [`SETTLE`]. Whether none is left.
    fn settle(&self, transfer: &sys::Transfer<'_>) -> bool {
        self.ep.cancel(transfer);
        let deadline = Instant::now() + SETTLE;
        let mut done = Vec::new();
        while self.ep.pending(transfer) > 0 {
            if Instant::now() > deadline || self.ep.completions(transfer, &mut done).is_err() {
                return false;
            }
            done.clear();
            std::thread::yield_now();
        }
        true
    }

    fn run(
        &self,
        transfer: &sys::Transfer<'_>,
        mr: &FabricMr,
        plan: Plan,
    ) -> Result<(), LibfabricError> {
        let Plan {
            kind,
            offset,
            length,
            peer,
            tag,
        } = plan;
        let bounce = !mr.path.is_direct();
        // Sends and writes copy into staging before posting; receives and reads out of it on
        // completion.
        let send = kind.outbound();
        let call = match kind {
            sys::Kind::Send => "fi_tsend",
            sys::Kind::Recv => "fi_trecv",
            sys::Kind::Read { .. } => "fi_read",
            sys::Kind::Write { .. } => "fi_write",
        };
        // Inside the mapping (checked by the caller), so it fits.
        let hbm_base = (mr.range.offset() + offset) as usize;
        let pieces: Vec<(u64, usize)> = chunks(length).collect();
        let count = pieces.len() as u64;
        if tag.checked_add(count).is_none_or(|end| end > TAG_LIMIT) {
            return Err(LibfabricError::TagRange { tag, chunks: count });
        }
        // Host bounce: this direction's half of the staging slots (sends the first half).
        let (window, first_slot) = if bounce {
            let per_direction = mr.mr.memory().len() / CHUNK / 2;
            (per_direction, if send { 0 } else { per_direction })
        } else {
            (DIRECT_WINDOW, 0)
        };
        let mut free: Vec<usize> = (first_slot..first_slot + window).rev().collect();
        let mut slot_of: HashMap<u64, usize> = HashMap::new();
        let (mut next, mut finished) = (0usize, 0usize);
        let mut done = Vec::new();
        let mut last_progress = Instant::now();
        // The piece and the slot it was last copied into: a send refused with FI_EAGAIN is
        // retried without copying again, unless completions have freed another slot since.
        let mut staged = None;
        while finished < pieces.len() {
            while let (Some(&(chunk_offset, len)), Some(&slot)) = (pieces.get(next), free.last()) {
                let hbm_offset = hbm_base + chunk_offset as usize;
                let region_offset = if bounce {
                    if send && staged != Some((next, slot)) {
                        // A CPU copy out of revoked HBM faults (SIGBUS): none once the cache
                        // knows. (Between the kernel's revocation and the cache learning of
                        // it, a copy can still fault: Documentation/rdma.md.)
                        self.check_revoked(mr)?;
                        mr.mr
                            .memory()
                            .copy_from(slot * CHUNK, &mr.hbm, hbm_offset, len);
                        staged = Some((next, slot));
                    }
                    slot * CHUNK
                } else {
                    hbm_offset
                };
                let id = next as u64;
                let op = sys::Op {
                    kind: match kind {
                        sys::Kind::Read { addr, key } => sys::Kind::Read {
                            addr: addr + chunk_offset,
                            key,
                        },
                        sys::Kind::Write { addr, key } => sys::Kind::Write {
                            addr: addr + chunk_offset,
                            key,
                        },
                        other => other,
                    },
                    offset: region_offset,
                    len,
                    peer,
                    tag: chunk_tag(kind, tag, id, count),
                    ignore: if kind == sys::Kind::Recv {
                        COUNT_MASK
                    } else {
                        0
                    },
                    id,
                };
                match self.ep.post(transfer, &mr.mr, &op) {
                    Ok(()) => {
                        if bounce && send {
                            mr.staged_chunks.fetch_add(1, Relaxed);
                            mr.staged_bytes.fetch_add(len as u64, Relaxed);
                        }
                        free.pop();
                        slot_of.insert(id, slot);
                        next += 1;
                    }
                    Err(e) if e.0 == bindings::FI_EAGAIN as i32 => break,
                    Err(e) => return Err(self.error(call, e)),
                }
            }
            done.clear();
            self.ep
                .completions(transfer, &mut done)
                .map_err(|e| self.error("fi_cq_read", e))?;
            for completion in done.drain(..) {
                let Some(slot) = slot_of.remove(&completion.op) else {
                    continue;
                };
                completion
                    .result
                    .map_err(|e| self.completion_error(call, e))?;
                let Some(&(chunk_offset, len)) = pieces.get(completion.op as usize) else {
                    continue;
                };
                let sent = completion.tag >> COUNT_SHIFT;
                if kind == sys::Kind::Recv && sent != count & (COUNT_MASK >> COUNT_SHIFT) {
                    return Err(LibfabricError::ChunkCount {
                        provider: self.provider.clone(),
                        sent,
                        expected: count,
                    });
                }
                if kind == sys::Kind::Recv && completion.len != len {
                    return Err(LibfabricError::ShortMessage {
                        provider: self.provider.clone(),
                        chunk: completion.op,
                        received: completion.len,
                        expected: len,
                    });
                }
                if bounce && !send {
                    self.check_revoked(mr)?;
                    mr.hbm.copy_from(
                        hbm_base + chunk_offset as usize,
                        mr.mr.memory(),
                        slot * CHUNK,
                        len,
                    );
                    mr.staged_chunks.fetch_add(1, Relaxed);
                    mr.staged_bytes.fetch_add(len as u64, Relaxed);
                }
                free.push(slot);
                finished += 1;
                last_progress = Instant::now();
            }
            self.check_revoked(mr)?;
            if last_progress.elapsed() > self.stall {
                return Err(LibfabricError::Stalled {
                    provider: self.provider.clone(),
                    secs: self.stall.as_secs(),
                });
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    fn error(&self, call: &'static str, e: sys::FiErrno) -> LibfabricError {
        call_error(self.lib, &self.provider, call, e)
    }

    /// [`LibfabricError::Completion`] for an operation of `call` that completed in error.
    fn completion_error(&self, call: &'static str, e: sys::CqError) -> LibfabricError {
        LibfabricError::Completion {
            provider: self.provider.clone(),
            call,
            errno: e.errno.0,
            text: self.lib.strerror(e.errno),
            prov_errno: e.prov_errno,
            prov_text: e.prov_text,
        }
    }

    /// [`LibfabricError::TransferRevoked`] if `mr`'s memory is revoked.
    fn check_revoked(&self, mr: &FabricMr) -> Result<(), LibfabricError> {
        match mr.revoked() {
            Some(hbm_device) => Err(LibfabricError::TransferRevoked {
                provider: self.provider.clone(),
                hbm_device,
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {

    /// A registration by the caller's address: never mapped (so never copied through), named
    /// by that address; an address of 0, or one the dma-buf does not fit after, is refused.
    #[test]
    fn a_source_at_the_callers_address_is_not_mapped() {
        use super::{DmaBufSource, LibfabricError};
        let stand_in = || {
            let file = tempfile_of(8192);
            crate::DmaBuf::from_fd(file.into()).unwrap()
        };
        let source = DmaBufSource::at(stand_in(), 0x7f00_0000_0000).unwrap();
        assert!(!source.is_mapped());
        assert_eq!(source.base_addr(), 0x7f00_0000_0000);
        assert_eq!(source.dma_buf().length(), 8192);
        for base in [0, u64::MAX - 4096] {
            assert!(matches!(
                DmaBufSource::at(stand_in(), base),
                Err(LibfabricError::BaseAddr { len: 8192, .. })
            ));
        }
    }

    /// A file of `len` zero bytes, unlinked: a stand-in the dma-buf code can size (lseek).
    fn tempfile_of(len: u64) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "peerdirect-libfabric-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        file.set_len(len).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    /// A send's tags carry its chunk count in the top 16 bits; a receive asks for the plain
    /// tag (and ignores those bits, checking them on completion).
    #[test]
    fn tags_carry_the_chunk_count_on_sends() {
        use super::{chunk_tag, sys::Kind, COUNT_MASK, TAG_LIMIT};
        assert_eq!(chunk_tag(Kind::Send, 0x40, 2, 3), 0x42 | (3 << 48));
        assert_eq!(chunk_tag(Kind::Recv, 0x40, 2, 3), 0x42);
        assert_eq!(chunk_tag(Kind::Send, 0, 0, 0x1_0001) & COUNT_MASK, 1 << 48);
        assert_eq!(TAG_LIMIT, 1 << 48);
    }

    #[test]
    fn libfabric_error_numbers_become_errno_values_a_c_caller_can_print() {
        use rustix::io::Errno;
        // errno values pass through.
        assert_eq!(super::errno_of_fi(11), Errno::AGAIN);
        assert_eq!(super::errno_of_fi(95), Errno::OPNOTSUPP);
        // libfabric's own: FI_ENOKEY, FI_ENOMR, FI_ETRUNC.
        assert_eq!(super::errno_of_fi(266), Errno::NOKEY);
        assert_eq!(super::errno_of_fi(270), Errno::FAULT);
        assert_eq!(super::errno_of_fi(265), Errno::MSGSIZE);
        // Every one of them (FI_EOTHER..FI_ERRNO_MAX) and beyond is an errno below 256.
        for fi in 256..300 {
            let errno = super::errno_of_fi(fi).raw_os_error();
            assert!((1..256).contains(&errno), "{fi} -> {errno}");
        }
        assert_eq!(super::errno_of_fi(-5), Errno::IO);
    }

    #[test]
    fn only_refusals_of_dma_buf_memory_take_host_bounce() {
        assert!(refuses_dma_buf(95)); // EOPNOTSUPP: rxe through verbs
        assert!(refuses_dma_buf(38)); // ENOSYS
        assert!(refuses_dma_buf(93)); // EPROTONOSUPPORT
                                      // Errors of the request or of the setup: reported, never bounced in silence.
        assert!(!refuses_dma_buf(22)); // EINVAL: a bad range, or efa in libfabric 2.5.0
        assert!(!refuses_dma_buf(14)); // EFAULT
        assert!(!refuses_dma_buf(1)); // EPERM
        assert!(!refuses_dma_buf(13)); // EACCES: a read-only export registered for writing
        assert!(!refuses_dma_buf(12)); // ENOMEM: an error, not a reason to bounce
        assert!(!refuses_dma_buf(126)); // ENOKEY
        assert!(!refuses_dma_buf(11)); // EAGAIN
    }
    use super::*;

    #[test]
    fn a_missing_library_says_what_to_install() {
        let err = load_error(
            sys::Lib::load("libfabric-peerdirect-test-missing.so.1")
                .err()
                .expect("no such library"),
        );
        let text = err.to_string();
        assert!(
            text.starts_with("libfabric.so.1 not found: install libfabric1 (>= 1.20)"),
            "{text}"
        );
        assert!(
            text.contains("libfabric-peerdirect-test-missing.so.1"),
            "{text}"
        );
    }

    #[test]
    fn a_library_without_libfabric_functions_is_refused() {
        let err = load_error(
            sys::Lib::load("libc.so.6")
                .err()
                .expect("libc is no libfabric"),
        );
        assert_eq!(err.to_string(), "libfabric.so.1 has no fi_getinfo: not a usable libfabric; install libfabric1 (>= 1.20)");
    }

    #[test]
    fn libfabric_before_1_20_is_too_old() {
        assert_eq!(
            check_version(1 << 16 | 17).unwrap_err().to_string(),
            "libfabric 1.17 is older than 1.20 (no FI_MR_DMABUF): install libfabric1 (>= 1.20)"
        );
        assert!(check_version(1 << 16 | 20).is_ok());
        assert!(check_version(2 << 16 | 1).is_ok());
    }

    #[test]
    fn opening_a_fabric_without_the_library_fails_clearly() {
        // Only meaningful where libfabric is absent (this project's host); elsewhere it opens
        // or fails for another reason, which is not this test's business.
        if sys::Lib::load(LIBRARY).is_err() {
            let err = Fabric::open("tcp", None).unwrap_err();
            assert!(matches!(err, LibfabricError::NotFound(_)), "{err}");
            assert!(version().is_err());
        }
    }

    #[test]
    #[allow(unsafe_code)]
    fn borrowing_a_domain_without_the_library_fails_clearly() {
        if sys::Lib::load(LIBRARY).is_err() {
            let mut not_a_domain = 0u64;
            let not_a_domain = NonNull::from(&mut not_a_domain).cast();
            // SAFETY: the library is missing, so `from_raw_domain` returns before it looks at
            // the pointer (a live u64, never used as a domain).
            let err = unsafe { Fabric::from_raw_domain(not_a_domain, "tcp") }.unwrap_err();
            assert!(matches!(err, LibfabricError::NotFound(_)), "{err}");
        }
        let err = LibfabricError::Borrowed {
            provider: "tcp".into(),
            what: "an endpoint",
        };
        assert_eq!(
            err.to_string(),
            "tcp: an endpoint needs a fabric opened by Fabric::open; this one only borrows a domain"
        );
    }

    #[test]
    fn access_maps_to_fi_bits() {
        // FI_SEND 1 << 11, FI_WRITE 1 << 9, FI_RECV 1 << 10, FI_READ 1 << 8, FI_REMOTE_READ
        // 1 << 12, FI_REMOTE_WRITE 1 << 13 (rdma/fabric.h).
        assert_eq!(fi_access(Access::LOCAL_READ), (1 << 11) | (1 << 9));
        assert_eq!(fi_access(Access::LOCAL_WRITE), (1 << 10) | (1 << 8));
        assert_eq!(fi_access(Access::REMOTE_READ), 1 << 12);
        assert_eq!(fi_access(Access::all()), 0b11_1111 << 8);
        assert_eq!(bindings::FI_MR_DMABUF, 1 << 40);
    }

    #[test]
    fn the_default_universe_fits_soft_roce_completion_queues() {
        // ofi_rxm's core CQ: (tx 128 + rx 128) x universe entries; rxe's max_cqe is 32767.
        let universe: usize = UNIVERSE_SIZE.parse().unwrap();
        assert!((128 + 128) * universe <= 32767);
        let err = LibfabricError::RxmEndpoint {
            provider: "verbs;ofi_rxm".into(),
            errno: 22,
            text: "Invalid argument".into(),
            universe: "1024".into(),
        };
        assert_eq!(
            err.to_string(),
            "verbs;ofi_rxm: fi_endpoint/fi_enable: Invalid argument (-22): ofi_rxm asks the \
             device for a completion queue of (tx + rx) x FI_UNIVERSE_SIZE entries, \
             (128 + 128) x 1024 with rxm's default queue sizes: more than small devices take \
             (soft-RoCE: 32767, so FI_UNIVERSE_SIZE <= 127); set FI_UNIVERSE_SIZE lower, \
             before libfabric initializes"
        );
    }

    /// A provider setting from a list, as `env` reads them.
    fn settings(list: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            list.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn which_bytes_providers_copy_with_the_cpu() {
        let none = settings(&[]);
        let read = sys::Kind::Read { addr: 0, key: 0 };
        for kind in [sys::Kind::Send, sys::Kind::Recv, read] {
            assert_eq!(cpu_copied_up_to("tcp", kind, &none), Some(u64::MAX));
            assert_eq!(cpu_copied_up_to("tcp;ofi_rxm", kind, &none), Some(u64::MAX));
            assert_eq!(cpu_copied_up_to("shm", kind, &none), Some(u64::MAX));
            assert_eq!(cpu_copied_up_to("efa", kind, &none), None);
            assert_eq!(cpu_copied_up_to("verbs", kind, &none), None);
        }
        // ofi_rxm over verbs: messages up to 8 x 16 KiB by default; RMA goes to the NIC.
        assert_eq!(
            cpu_copied_up_to("verbs;ofi_rxm", sys::Kind::Send, &none),
            Some(128 << 10)
        );
        assert_eq!(
            cpu_copied_up_to("verbs;ofi_rxm", sys::Kind::Recv, &none),
            Some(128 << 10)
        );
        assert_eq!(cpu_copied_up_to("verbs;ofi_rxm", read, &none), None);
        let write = sys::Kind::Write { addr: 0, key: 0 };
        assert_eq!(cpu_copied_up_to("verbs;ofi_rxm", write, &none), None);
        // Its settings, by its own rules.
        let send = |list| cpu_copied_up_to("verbs;ofi_rxm", sys::Kind::Send, settings(list));
        assert_eq!(
            send(&[("FI_OFI_RXM_BUFFER_SIZE", "32768")]),
            Some(256 << 10)
        );
        // Over 64 KiB of eager buffer, no segmentation.
        assert_eq!(send(&[("FI_OFI_RXM_BUFFER_SIZE", "65536")]), Some(64 << 10));
        assert_eq!(send(&[("FI_OFI_RXM_BUFFER_SIZE", "100000")]), Some(100000));
        assert_eq!(send(&[("FI_OFI_RXM_SAR_LIMIT", "262144")]), Some(256 << 10));
        assert_eq!(send(&[("FI_OFI_RXM_SAR_LIMIT", "1000")]), Some(16 << 10));
        assert_eq!(send(&[("FI_OFI_RXM_SAR_LIMIT", "lots")]), Some(128 << 10));
    }

    #[test]
    fn transfers_the_cpu_would_copy_at_unmapped_addresses_are_refused() {
        const MIB: u64 = 1 << 20;
        let len = 4 * MIB as usize;
        // A CPU address of the bytes (the caller's, for tcp): host memory here.
        let host = sys::Memory::host(len);
        let base = NonNull::new(host.base() as *mut u8).expect("host memory is not null");
        let mapped = sys::Memory::foreign(base, len);
        let plan = |kind, offset, length| Plan {
            kind,
            offset,
            length,
            peer: 0,
            tag: 0,
        };
        let none = settings(&[]);
        let check =
            |provider, hbm: &sys::Memory, plan| check_cpu_copies(provider, hbm, 0, plan, &none);
        // Addresses this process maps: every transfer goes.
        for length in [1, 4096, 3 * MIB + 5] {
            assert!(check("tcp", &mapped, plan(sys::Kind::Send, 0, length)).is_ok());
            assert!(check("verbs;ofi_rxm", &mapped, plan(sys::Kind::Send, 0, length)).is_ok());
        }
        // A device's addresses (HCL's pool sits at 16 TiB), which nothing in a process maps.
        let device = NonNull::new(0x1000_0000_0000 as *mut u8).expect("not null");
        let unmapped = sys::Memory::foreign(device, len);
        assert!(!unmapped.is_mapped_here(0, len), "nothing maps 16 TiB here");
        let base = unmapped.base();
        // ofi_rxm: small messages, and the small last chunk of a larger transfer, are refused,
        // naming the bytes; whole chunks and RMA go to the NIC.
        match check(
            "verbs;ofi_rxm",
            &unmapped,
            plan(sys::Kind::Send, 4096, 4096),
        ) {
            Err(LibfabricError::CpuCopyUnmapped {
                start,
                len,
                ref what,
                ..
            }) => {
                assert_eq!((start, len), (base + 4096, 4096));
                assert!(what.contains("up to 131072 bytes"), "{what}");
            }
            other => panic!("a 4 KiB send at unmapped addresses: {other:?}"),
        }
        match check(
            "verbs;ofi_rxm",
            &unmapped,
            plan(sys::Kind::Recv, 0, MIB + 100),
        ) {
            Err(LibfabricError::CpuCopyUnmapped { start, len, .. }) => {
                assert_eq!((start, len), (base + MIB, 100))
            }
            other => panic!("a receive whose last chunk is 100 bytes: {other:?}"),
        }
        assert!(check(
            "verbs;ofi_rxm",
            &unmapped,
            plan(sys::Kind::Send, 0, 2 * MIB)
        )
        .is_ok());
        let read = sys::Kind::Read { addr: 0, key: 0 };
        assert!(check("verbs;ofi_rxm", &unmapped, plan(read, 0, 4096)).is_ok());
        assert!(check("efa", &unmapped, plan(sys::Kind::Send, 0, 4096)).is_ok());
        // tcp copies every byte: any transfer is refused.
        let err = check("tcp", &unmapped, plan(sys::Kind::Send, 0, 2 * MIB)).unwrap_err();
        assert!(
            matches!(err, LibfabricError::CpuCopyUnmapped { len, .. } if len == 2 * MIB),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(
            text.contains("tcp copies every byte it moves with the CPU"),
            "{text}"
        );
        assert!(text.contains("not mapped in this process"), "{text}");
        // With rxm's segmentation limit raised past the chunk, whole chunks are copied too.
        let big = settings(&[("FI_OFI_RXM_SAR_LIMIT", "2097152")]);
        assert!(check_cpu_copies(
            "verbs;ofi_rxm",
            &unmapped,
            0,
            plan(sys::Kind::Send, 0, 2 * MIB),
            &big
        )
        .is_err());
    }

    #[test]
    fn transfers_split_into_chunks() {
        assert_eq!(chunks(0).count(), 0);
        assert_eq!(chunks(5).collect::<Vec<_>>(), [(0, 5)]);
        let c: Vec<_> = chunks(2 * CHUNK as u64 + 3).collect();
        assert_eq!(
            c,
            [(0, CHUNK), (CHUNK as u64, CHUNK), (2 * CHUNK as u64, 3)]
        );
        // Over 4 GiB: offsets stay exact.
        let big = 5u64 << 30;
        assert_eq!(chunks(big).count() as u64, big / CHUNK as u64);
        assert_eq!(chunks(big).last(), Some((big - CHUNK as u64, CHUNK)));
    }

    use crate::cache::ExportId;
    use sys::fake::{self, Call};

    /// A registrar of a fake domain (`sys::fake`) whose info says `mr_endpoint` (`None`: a
    /// borrowed domain, whose info is unknown); its MRs are made disabled, as such a domain
    /// makes them, when `mr_endpoint` is not `Some(false)`. `fi_mr_bind` and `fi_mr_enable`
    /// return `bind_ret` and `enable_ret`.
    fn fake_registrar(
        mr_endpoint: Option<bool>,
        bind_ret: i32,
        enable_ret: i32,
    ) -> (LibfabricRegistrar, &'static fake::Log) {
        let (domain, log) = fake::domain(mr_endpoint != Some(false), bind_ret, enable_ret);
        let fabric = Fabric {
            lib: fake::lib(),
            info: None,
            caps: ProviderCaps {
                provider: "fake".into(),
                domain: String::new(),
                hmem: false,
                mr_local: false,
                mr_virt_addr: false,
                mr_prov_key: false,
                mr_endpoint: mr_endpoint == Some(true),
                max_msg_size: 0,
                rma: false,
            },
            domain,
            id: DomainId::unique(),
            mr_endpoint,
        };
        (LibfabricRegistrar::new(fabric), log)
    }

    /// Registers 4 KiB of a stand-in dma-buf (named by an address, never mapped).
    fn register(registrar: &LibfabricRegistrar) -> Result<FabricMr, LibfabricError> {
        register_range(registrar, ByteRange::new(0, 4096).unwrap())
    }

    /// Registers `range` of an 8 KiB dma-buf at a base address through `registrar`.
    fn register_range(
        registrar: &LibfabricRegistrar,
        range: ByteRange,
    ) -> Result<FabricMr, LibfabricError> {
        let dma_buf = crate::DmaBuf::from_fd(tempfile_of(8192).into()).unwrap();
        let source = DmaBufSource::at(dma_buf, 0x7f00_0000_0000).unwrap();
        let key = RegKey {
            domain: registrar.domain(),
            export: ExportId::new(0, 1),
            range,
            access: Access::all(),
        };
        registrar.register(&source, &key)
    }

    /// One of this crate's endpoints, on the fake domain of `registrar`.
    fn fake_endpoint(registrar: &LibfabricRegistrar) -> Endpoint {
        Endpoint {
            lib: fake::lib(),
            provider: "fake".into(),
            ep: Arc::new(sys::fake::endpoint(&registrar.fabric.domain)),
            stall: STALL,
        }
    }

    /// The key the fake was asked for and the MR it made, from a `Regattr` call.
    fn regattr(call: Call) -> (u64, usize) {
        match call {
            Call::Regattr { key, mr } => (key, mr),
            other => panic!("{other:?} where fi_mr_regattr was expected"),
        }
    }

    #[allow(unsafe_code)]
    fn raw(ep: NonNull<bindings::fid_ep>) -> MrEndpoint {
        // SAFETY: the fake's endpoint is leaked (never closed) and only named in fi_mr_bind.
        unsafe { MrEndpoint::from_raw(ep.cast()) }
    }

    /// In a domain with FI_MR_ENDPOINT (or a borrowed one, whose mode is unknown, with an
    /// endpoint named) each new registration is bound to the endpoint named (its fid, flags 0)
    /// and then enabled, before it is handed out: its key and descriptor, which such a provider
    /// gives only once enabled, are the enabled MR's. Dma-bufs and host memory alike.
    #[test]
    fn an_endpoint_mr_is_bound_then_enabled_before_it_is_handed_out() {
        for mode in [Some(true), None] {
            let (registrar, log) = fake_registrar(mode, 0, 0);
            let ep = fake::foreign_endpoint();
            registrar.set_endpoint(Some(raw(ep))).unwrap();
            let mr = register(&registrar).unwrap();
            let calls = log.calls();
            assert_eq!(calls.len(), 3, "{mode:?}: {calls:?}");
            let (key, made) = regattr(calls[0]);
            let bind = Call::Bind {
                mr: made,
                fid: fake::fid_of(ep),
                flags: 0,
            };
            assert_eq!(calls[1..], [bind, Call::Enable { mr: made }], "{mode:?}");
            assert_eq!(mr.key(), key, "{mode:?}: the enabled MR's key");
            assert_ne!(mr.key(), fake::KEY_NOTAVAIL);
            assert_eq!(
                mr.desc(),
                fake::DESC,
                "{mode:?}: the enabled MR's descriptor"
            );
            drop(mr);
            assert_eq!(log.calls()[3..], [Call::CloseMr { mr: made }]);

            let host = registrar.register_host(4096, Access::all()).unwrap();
            let calls = log.calls();
            let (key, made) = regattr(calls[4]);
            let bind = Call::Bind {
                mr: made,
                fid: fake::fid_of(ep),
                flags: 0,
            };
            assert_eq!(calls[5..], [bind, Call::Enable { mr: made }], "{mode:?}");
            assert_eq!(host.remote(0, false).key, key);
        }
    }

    /// A registration bound to one of this crate's endpoints keeps it open: the endpoint is
    /// closed only after the MR, as libfabric asks, even when its `Endpoint` went first.
    #[test]
    fn an_mr_bound_to_our_endpoint_is_closed_before_the_endpoint() {
        let (registrar, log) = fake_registrar(Some(true), 0, 0);
        let endpoint = fake_endpoint(&registrar);
        let ep_fid = fake::fid_of_ours(&endpoint.ep);
        registrar
            .set_endpoint(Some(MrEndpoint::of(&endpoint)))
            .unwrap();
        let mr = register(&registrar).unwrap();
        let (_, made) = regattr(log.calls()[0]);
        assert_eq!(
            log.calls()[1],
            Call::Bind {
                mr: made,
                fid: ep_fid,
                flags: 0
            }
        );
        drop(endpoint);
        drop(mr);
        registrar.set_endpoint(None).unwrap();
        assert_eq!(
            log.calls()[3..],
            [Call::CloseMr { mr: made }, Call::CloseEp { ep: ep_fid }]
        );
    }

    /// A registration the cache invalidates because its device is gone fails its transfers
    /// at once with TransferRevoked (ENODEV) naming the device, posting nothing; other causes
    /// (the memory freed, the domain going) and foreign exports leave transfers to the
    /// provider.
    #[test]
    fn transfers_on_a_revoked_registration_are_refused() {
        let (registrar, log) = fake_registrar(Some(false), 0, 0);
        let endpoint = fake_endpoint(&registrar);
        let mr = register(&registrar).unwrap();
        let key = |device| RegKey {
            domain: registrar.domain(),
            export: ExportId::new(device, 1),
            range: ByteRange::new(0, 4096).unwrap(),
            access: Access::all(),
        };
        for cause in [Cause::Memory, Cause::Domain] {
            registrar.invalidated(&key(3), &mr, cause);
        }
        registrar.invalidated(&key(ExportId::FOREIGN), &mr, Cause::Device);
        assert_eq!(mr.revoked(), None);
        registrar.invalidated(&key(3), &mr, Cause::Device);
        let calls = log.calls().len();
        let err = endpoint.send(&mr, 0, 4096, Peer(0), 0).unwrap_err();
        assert!(
            matches!(err, LibfabricError::TransferRevoked { hbm_device: 3, .. }),
            "{err:?}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::NODEV));
        assert!(err
            .to_string()
            .contains("/dev/peerdirect3 was unbound, removed or reset"));
        assert_eq!(
            log.calls().len(),
            calls,
            "nothing posted: {:?}",
            log.calls()
        );
    }

    /// An operation that completed in error says libfabric's error and the provider's own,
    /// in the provider's words when it has them, and maps to the errno of libfabric's.
    #[test]
    fn a_completion_error_says_what_the_provider_says() {
        let completion = |prov_errno, prov_text: Option<&str>| LibfabricError::Completion {
            provider: "verbs;ofi_rxm".into(),
            call: "fi_read",
            errno: 5,
            text: "Input/output error".into(),
            prov_errno,
            prov_text: prov_text.map(str::to_owned),
        };
        let said = completion(10, Some("remote access error"));
        assert_eq!(
            said.to_string(),
            "verbs;ofi_rxm: fi_read completed in error: Input/output error (-5); the provider \
             says: remote access error (10)"
        );
        assert_eq!(said.errno(), Some(rustix::io::Errno::IO));
        assert!(completion(10, None)
            .to_string()
            .ends_with("the provider says: error 10"));
        assert!(completion(0, None)
            .to_string()
            .ends_with("the provider says: nothing more"));
        // tcp's strerror of prov_errno 0.
        assert!(completion(0, Some("Success"))
            .to_string()
            .ends_with("the provider says: nothing more"));
    }

    /// fi_mr_regattr's ENODEV for an export of a peerdirect device says which device's export
    /// is revoked; for a foreign dma-buf, or another errno, the call's error stays.
    #[test]
    fn a_registration_refused_with_enodev_names_the_revoked_device() {
        let call = |errno| LibfabricError::Call {
            provider: "verbs;ofi_rxm".into(),
            call: "fi_mr_regattr(FI_MR_DMABUF)",
            errno,
            text: "No such device".into(),
        };
        let err = revoked(call(19), ExportId::new(2, 7));
        assert!(
            matches!(
                err,
                LibfabricError::Revoked {
                    hbm_device: 2,
                    errno: 19,
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::NODEV));
        assert_eq!(
            err.to_string(),
            "verbs;ofi_rxm: fi_mr_regattr(FI_MR_DMABUF): No such device (-19): the export of \
             /dev/peerdirect2 is revoked: that HBM device is gone (unbound or removed), or was \
             reset (export again after a reset)"
        );
        let foreign = revoked(call(19), ExportId::new(ExportId::FOREIGN, 7));
        assert!(
            matches!(foreign, LibfabricError::Call { .. }),
            "{foreign:?}"
        );
        let other = revoked(call(12), ExportId::new(2, 7));
        assert!(matches!(other, LibfabricError::Call { .. }), "{other:?}");
    }

    /// A range that runs past the dma-buf's end is refused (EINVAL) with an error that says
    /// so, before any key is taken or MR made: no panic.
    #[test]
    fn a_range_past_the_dma_bufs_end_is_refused() {
        let (registrar, log) = fake_registrar(Some(false), 0, 0);
        let err = register_range(&registrar, ByteRange::new(4096, 8192).unwrap()).unwrap_err();
        assert!(
            matches!(err, LibfabricError::Range { len: 8192, .. }),
            "{err:?}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::INVAL));
        assert_eq!(
            err.to_string(),
            "bytes 0x1000..0x3000 of a 8192-byte dma-buf: the range runs past its end; ask for \
             bytes inside it"
        );
        assert_eq!(log.calls(), []);
    }

    /// In a domain with FI_MR_ENDPOINT and no endpoint named, a registration fails with an
    /// error that says to name one (EBADFD), before anything is registered.
    #[test]
    fn an_endpoint_mr_domain_with_no_endpoint_named_registers_nothing() {
        let (registrar, log) = fake_registrar(Some(true), 0, 0);
        let err = register(&registrar).unwrap_err();
        assert!(matches!(err, LibfabricError::NoEndpoint { .. }), "{err}");
        assert_eq!(err.errno(), Some(rustix::io::Errno::BADFD));
        assert_eq!(
            err.to_string(),
            "fake: the domain has FI_MR_ENDPOINT: a registration is usable only once bound to \
             an endpoint and enabled, and no endpoint is named; name the endpoint that will use \
             the registrations first (LibfabricRegistrar::set_endpoint; C: pd_domain_set_endpoint)"
        );
        let err = registrar.register_host(4096, Access::all()).unwrap_err();
        assert!(matches!(err, LibfabricError::NoEndpoint { .. }), "{err}");
        assert_eq!(log.calls(), [], "no MR was made, so none is left open");
    }

    /// A registration that cannot be bound (`fi_mr_bind`) or enabled (`fi_mr_enable`) is
    /// closed, and the error names the call, with libfabric's number as an errno.
    #[test]
    fn a_registration_that_cannot_be_bound_or_enabled_is_closed() {
        let einval = 22;
        let (registrar, log) = fake_registrar(Some(true), -einval, 0);
        registrar
            .set_endpoint(Some(raw(fake::foreign_endpoint())))
            .unwrap();
        let err = register(&registrar).unwrap_err();
        let calls = log.calls();
        let (_, made) = regattr(calls[0]);
        assert!(
            matches!(err, LibfabricError::EndpointBind { call: "fi_mr_bind", errno, .. } if errno == einval),
            "{err}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::INVAL));
        assert_eq!(
            err.to_string(),
            "fake: fi_mr_bind of a new registration to the endpoint named for the domain's \
             registrations: fake provider error (-22); the registration was closed"
        );
        assert!(matches!(calls[1], Call::Bind { .. }));
        assert_eq!(
            calls[2..],
            [Call::CloseMr { mr: made }],
            "closed, never enabled"
        );

        let opbadstate = bindings::FI_EOPBADSTATE as i32;
        let (registrar, log) = fake_registrar(Some(true), 0, -opbadstate);
        registrar
            .set_endpoint(Some(raw(fake::foreign_endpoint())))
            .unwrap();
        let err = registrar.register_host(4096, Access::all()).unwrap_err();
        assert!(
            matches!(err, LibfabricError::EndpointBind { call: "fi_mr_enable", errno, .. } if errno == opbadstate),
            "{err}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::BADFD));
        let calls = log.calls();
        let (_, made) = regattr(calls[0]);
        assert_eq!(
            calls[2..],
            [Call::Enable { mr: made }, Call::CloseMr { mr: made }]
        );
        let closes = calls
            .iter()
            .filter(|c| matches!(c, Call::CloseMr { .. }))
            .count();
        assert_eq!(closes, 1);
        // The key was given back: the next registration's request goes ahead.
        registrar.set_endpoint(None).unwrap();
    }

    /// A borrowed domain's mode is not known: an endpoint named for one without
    /// `FI_MR_ENDPOINT` fails to bind (tcp: `FI_ENOSYS`), and the error says to name none.
    #[test]
    fn a_bind_refused_by_a_borrowed_domain_says_to_name_no_endpoint() {
        let enosys = 38; // FI_ENOSYS, which is ENOSYS
        let (registrar, _log) = fake_registrar(None, -enosys, 0);
        registrar
            .set_endpoint(Some(raw(fake::foreign_endpoint())))
            .unwrap();
        let err = register(&registrar).unwrap_err().to_string();
        assert!(
            err.contains("fi_mr_bind of a new registration")
                && err
                    .contains("for one without, name none (C: pd_domain_set_endpoint(dom, NULL))"),
            "{err}"
        );
    }

    /// A domain opened without FI_MR_ENDPOINT neither binds nor enables, endpoint named or
    /// not; nor does a borrowed one with no endpoint named.
    #[test]
    fn a_domain_without_fi_mr_endpoint_binds_nothing() {
        let (registrar, log) = fake_registrar(Some(false), 0, 0);
        let mr = register(&registrar).unwrap();
        registrar
            .set_endpoint(Some(raw(fake::foreign_endpoint())))
            .unwrap_err(); // `mr` was made with no endpoint named
        drop(mr);
        registrar
            .set_endpoint(Some(raw(fake::foreign_endpoint())))
            .unwrap();
        let mr = register(&registrar).unwrap();
        let _host = registrar.register_host(4096, Access::all()).unwrap();
        let calls = log.calls();
        let (key, made) = regattr(calls[2]);
        assert!(
            matches!(
                calls[..],
                [
                    Call::Regattr { .. },
                    Call::CloseMr { .. },
                    Call::Regattr { .. },
                    Call::Regattr { .. }
                ]
            ),
            "{calls:?}"
        );
        assert_eq!(mr.key(), key);
        assert_ne!(made, 0);

        let (registrar, log) = fake_registrar(None, 0, 0);
        let _mr = register(&registrar).unwrap();
        assert!(
            matches!(log.calls()[..], [Call::Regattr { .. }]),
            "{:?}",
            log.calls()
        );
    }

    /// The endpoint named changes only while no registration made with the one before is open
    /// (each must be closed before its endpoint): EBUSY, and nothing changes; naming the same
    /// endpoint again is no change.
    #[test]
    fn the_endpoint_changes_only_while_no_registration_made_with_the_last_is_open() {
        let (registrar, log) = fake_registrar(Some(true), 0, 0);
        let (first, second) = (fake::foreign_endpoint(), fake::foreign_endpoint());
        registrar.set_endpoint(Some(raw(first))).unwrap();
        let mr = register(&registrar).unwrap();
        let err = registrar.set_endpoint(Some(raw(second))).unwrap_err();
        assert!(
            matches!(
                err,
                LibfabricError::EndpointBusy {
                    registrations: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.errno(), Some(rustix::io::Errno::BUSY));
        assert!(registrar.set_endpoint(None).is_err());
        registrar.set_endpoint(Some(raw(first))).unwrap();
        let again = register(&registrar).unwrap();
        drop((mr, again));
        registrar.set_endpoint(Some(raw(second))).unwrap();
        let _mr = register(&registrar).unwrap();
        let binds: Vec<usize> = log
            .calls()
            .iter()
            .filter_map(|c| match c {
                Call::Bind { fid, .. } => Some(*fid),
                _ => None,
            })
            .collect();
        assert_eq!(
            binds,
            [
                fake::fid_of(first),
                fake::fid_of(first),
                fake::fid_of(second)
            ]
        );
    }

    #[test]
    fn host_memory_copies_stay_in_bounds() {
        let a = sys::Memory::host(8192);
        let b = sys::Memory::host(4096);
        a.write(4000, b"bounce");
        b.copy_from(10, &a, 4000, 6);
        let mut out = [0; 6];
        b.read(10, &mut out);
        assert_eq!(&out, b"bounce");
        let r = std::panic::catch_unwind(|| b.copy_from(4095, &a, 0, 2));
        assert!(r.is_err());
    }

    /// A mapping refused because the dma-buf was revoked says to export again; other
    /// refusals say how to register without a mapping.
    #[test]
    fn a_mapping_refused_says_why_by_its_errno() {
        let text = |errno| LibfabricError::Map { len: 4096, errno }.to_string();
        let revoked = text(rustix::io::Errno::NODEV);
        assert!(
            revoked.contains("revoked it") && revoked.contains("export the memory again"),
            "{revoked}"
        );
        assert!(!revoked.contains("pd_register_dmabuf_at"), "{revoked}");
        let no_mmap = text(rustix::io::Errno::INVAL);
        assert!(no_mmap.contains("pd_register_dmabuf_at"), "{no_mmap}");
    }
}
