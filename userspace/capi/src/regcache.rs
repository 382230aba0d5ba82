//! The registration cache through the C ABI: `pd_regcache`, the libfabric domains the caller
//! opened and attached to it (`pd_domain`), `pd_register` into one of them, and the `pd_mr`
//! handles it returns.
//!
//! A `pd_regcache` is a `RegCache` of libfabric registrations. Each `pd_domain_attach` makes
//! a registrar borrowing the caller's domain (never closing it) with a domain identity of its
//! own, so a domain closed and another opened at the same address never share entries.
//! `pd_register` attaches the cache to the allocation's device, so that `pd_allocation_free`
//! invalidates the allocation's entries before the FREE command; it registers from one
//! read-write export of the whole allocation, made and mapped on the first call and kept by
//! the allocation handle until it is freed. The cache's invalidation listener calls the
//! caller's callback (`pd_regcache_set_invalidate_callback`) for every registration whose
//! memory, device or domain goes, so that a runtime can take back keys it gave peers.
//!
//! A C caller posts its own operations with the key and descriptor of a `pd_mr`, so a
//! host-bounce registration (whose key and descriptor name a host staging buffer) would have
//! peers' data land in host memory unless the caller copies through that buffer itself. So
//! the fallback is off unless the caller turns it on (`pd_regcache_set_host_bounce`), and a
//! provider's refusal is an error that says so.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
use std::sync::atomic::{
    fence, AtomicBool, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed},
};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use pd::cache::{Access, AddressTable, ByteRange, DomainId, ExportId, RegCache};
use pd::registrar::ibverbs::{self, IbverbsRegistrar};
use pd::registrar::libfabric::{
    DmaBufSource, Fabric, Iface, KeyAllocator, LibfabricError, LibfabricRegistrar, MappedDmaBuf,
    MrEndpoint,
};
use pd::{Cause, Device, Errno, Invalidated, RawExport, RegPath, Registrar, Registration};

use crate::abi::{self, FidDomain, FidEp, IbvPd, PdRegcacheStats};
use crate::addresses::At;
use crate::callback::CallbackSlot;
use crate::error::{guard_fast_path, guard_status, handle_guard, shield, Failure};
use crate::handle::{arg, inherited, put, take, Born, Handle, PdAllocation, PdDevice, Source};
use crate::registrar::AnyRegistrar;

/// `struct pd_invalidation`: a registration whose memory, device or domain goes, as the
/// callback of `pd_regcache_set_invalidate_callback` is told. Here rather than in `abi` with
/// the other structs of the header, since it names a [`PdDomain`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PdInvalidation {
    pub domain: *mut PdDomain,
    pub key: u64,
    pub addr: *mut c_void,
    pub length: u64,
    pub cause: u32,
    pub held: u32,
}

/// `pd_key_alloc_fn`: a domain's key allocator (`pd_domain_set_keys`).
pub type PdKeyAllocFn = unsafe extern "C" fn(ctx: *mut c_void, key: *mut u64) -> c_int;
/// `pd_key_release_fn`: gives a key back to it.
pub type PdKeyReleaseFn = unsafe extern "C" fn(ctx: *mut c_void, key: u64);

/// The caller's key allocator, which it promised may be called from any thread.
struct CKeys {
    alloc: PdKeyAllocFn,
    release: Option<PdKeyReleaseFn>,
    ctx: usize,
}

impl KeyAllocator for CKeys {
    fn allocate(&self) -> Option<u64> {
        let mut key = 0;
        // SAFETY: the caller of pd_domain_set_keys promised that `alloc` may be called with
        // its ctx from any thread while registrations are made; `key` outlives the call.
        let status = unsafe { (self.alloc)(self.ctx as *mut c_void, &mut key) };
        (status == 0).then_some(key)
    }

    fn release(&self, key: u64) {
        if let Some(release) = self.release {
            // SAFETY: as for `alloc`, until the last registration that had a key is closed.
            unsafe { release(self.ctx as *mut c_void, key) };
        }
    }
}

/// `pd_invalidate_fn`: the invalidation callback.
pub type PdInvalidateFn =
    unsafe extern "C" fn(ctx: *mut c_void, invalidation: *const PdInvalidation);

/// `pd_regcache`: a registration cache, shared with the `pd_domain` handles attached to it.
pub struct PdRegCache {
    shared: Arc<Shared>,
}

/// What a `pd_regcache` and its `pd_domain` handles share; it lives until the last of them is
/// released.
struct Shared {
    cache: Arc<RegCache<AnyRegistrar>>,
    /// The attached domains, for `pd_regcache_set_host_bounce`, the invalidation callback and
    /// `pd_regcache_free`.
    domains: Arc<Mutex<HashMap<DomainId, Attached>>>,
    /// Whether registrations may fall back to host bounce (`pd_regcache_set_host_bounce`).
    host_bounce: AtomicBool,
    /// Dma-bufs the caller passed by fd (`pd_register_dmabuf`: exported elsewhere;
    /// `pd_register_export`: by a peerdirect device): a duplicate of the caller's fd, mapped,
    /// by inode number, until `pd_regcache_invalidate_dmabuf` or the cache's end.
    foreign: Mutex<HashMap<u64, Arc<Source>>>,
    /// Where those of them registered at the caller's addresses (`pd_register_dmabuf_at`)
    /// are, for `pd_register_addr` to look up without a lock or a reference count written by
    /// every thread: set whenever `foreign` changes (under its lock).
    addresses: AddressTable<At>,
    /// The caller's invalidation callback, called by the cache's listener.
    callback: Arc<CallbackSlot<Callback>>,
    /// For the cache and its domains.
    born: Born,
}

impl Handle for PdRegCache {
    fn born(&self) -> Born {
        self.shared.born
    }
}

impl Handle for PdDomain {
    fn born(&self) -> Born {
        self.shared.born
    }
}

impl Handle for PdMr {
    fn born(&self) -> Born {
        self.born
    }
}

/// An attached domain: its handle's address (what the callback is told) and its registrar.
struct Attached {
    handle: usize,
    registrar: Weak<AnyRegistrar>,
}

/// `pd_invalidate_fn` and its context, which the caller promised may be used from any thread.
#[derive(Clone, Copy)]
struct Callback {
    function: PdInvalidateFn,
    ctx: usize,
}

/// `pd_domain`: a libfabric domain the caller opened, attached to a cache
/// (`pd_domain_attach`) until `pd_domain_detach`.
pub struct PdDomain {
    shared: Arc<Shared>,
    registrar: Arc<AnyRegistrar>,
    /// Calls registering in the domain through this handle now ([`Registering`]): a
    /// `pd_domain_detach` from inside one (a key allocator's) must not free the handle under
    /// it.
    registering: AtomicUsize,
}

/// A call registering in a domain, counted in [`PdDomain::registering`] while it runs.
struct Registering<'a>(&'a AtomicUsize);

impl<'a> Registering<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, AcqRel);
        Self(count)
    }
}

impl Drop for Registering<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

/// `pd_mr`: a registration handed out by `pd_register`, registered until released.
pub struct PdMr {
    registration: Registration<AnyRegistrar>,
    born: Born,
    /// Whether the handle is a `Box` (`pd_register`, ...) or lives in the caller's
    /// `pd_mr_storage` (`pd_register_in`, `pd_register_addr_in`), which `pd_mr_release` drops
    /// in place without freeing.
    boxed: bool,
}

impl PdMr {
    /// A handle of `registration`, made in the `fork` generation `born` (its domain's, which
    /// the caller checked is this process's).
    fn new(registration: Registration<AnyRegistrar>, born: Born, boxed: bool) -> Self {
        Self {
            registration,
            born,
            boxed,
        }
    }
}

/// `pd_mr_storage`: room for a `pd_mr` in the caller's memory (`pd_register_in`,
/// `pd_register_addr_in`), as `struct fi_context` is for a libfabric operation: a hit then
/// allocates nothing.
#[repr(C)]
pub struct PdMrStorage {
    pub internal: [u64; 12],
}

const _: () = assert!(
    size_of::<PdMr>() <= size_of::<PdMrStorage>()
        && align_of::<PdMr>() <= align_of::<PdMrStorage>()
);

/// Where [`PdDomain::register_into`] puts the handle it makes; the address of the handle
/// goes to `out` in both cases.
#[derive(Clone, Copy)]
enum Out {
    /// A new `Box`.
    Boxed { out: *mut *mut PdMr },
    /// The caller's storage.
    InPlace {
        storage: *mut PdMrStorage,
        out: *mut *mut PdMr,
    },
}

impl Out {
    /// What a C function that takes `storage` when `IN_PLACE` (a `const` generic: the C
    /// function passes no enum or name in memory, [`guard_fast_path`]) makes.
    #[inline(always)]
    fn of<const IN_PLACE: bool>(storage: *mut PdMrStorage, out: *mut *mut PdMr) -> Self {
        if IN_PLACE {
            Out::InPlace { storage, out }
        } else {
            Out::Boxed { out }
        }
    }

    /// Whether none of its pointers is NULL.
    #[inline]
    fn valid(self) -> bool {
        match self {
            Out::Boxed { out } => !out.is_null(),
            Out::InPlace { storage, out } => !storage.is_null() && !out.is_null(),
        }
    }

    /// Refuses a NULL pointer among them.
    fn checked(self, function: &str) -> Result<Self, Failure> {
        match self {
            Out::Boxed { out } | Out::InPlace { out, .. } if out.is_null() => {
                Err(Failure::null(function, "out"))
            }
            Out::InPlace { storage, .. } if storage.is_null() => {
                Err(Failure::null(function, "storage"))
            }
            _ => Ok(self),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Only maps and options are updated under these locks; nothing panics while they are held.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl From<LibfabricError> for Failure {
    fn from(err: LibfabricError) -> Self {
        let errno = match &err {
            LibfabricError::NotFound(_)
            | LibfabricError::MissingSymbol(_)
            | LibfabricError::TooOld { .. } => Errno::NOSYS,
            // libfabric's own numbers (FI_ENOKEY, ...) mapped to errno values.
            LibfabricError::Call { .. }
            | LibfabricError::Completion { .. }
            | LibfabricError::Revoked { .. }
            | LibfabricError::TransferRevoked { .. }
            | LibfabricError::Map { .. }
            | LibfabricError::NoKey { .. }
            | LibfabricError::KeyRange { .. }
            | LibfabricError::NoEndpoint { .. }
            | LibfabricError::EndpointBind { .. }
            | LibfabricError::EndpointBusy { .. } => err.errno().unwrap_or(Errno::IO),
            LibfabricError::BadName(_)
            | LibfabricError::BaseAddr { .. }
            | LibfabricError::Range { .. } => Errno::INVAL,
            LibfabricError::DmaBufRefused { .. } => {
                return Failure::new(
                    Errno::OPNOTSUPP,
                    format!(
                    "{err}. Use a provider that registers dma-bufs (`peerdirect doctor` checks), \
                         or call pd_regcache_set_host_bounce(cache, 1) and copy through \
                         pd_mr_staging() around every operation"
                ),
                )
            }
            LibfabricError::DmaBufRefusedAtAddress { .. } => {
                return Failure::new(
                    Errno::OPNOTSUPP,
                    format!("{err} (`peerdirect doctor` checks the providers)"),
                )
            }
            _ => Errno::IO,
        };
        Failure::new(errno, err.to_string())
    }
}

/// `pd_regcache *pd_regcache_new(int *err)`: an empty cache with the limits of
/// `PEERDIRECT_MR_CACHE_MAX_COUNT` and `PEERDIRECT_MR_CACHE_MAX_SIZE`.
///
/// # Safety
///
/// `err` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_new(err: *mut c_int) -> *mut PdRegCache {
    let make = || {
        let cache = RegCache::from_env()
            .map_err(|e| Failure::new(Errno::INVAL, format!("pd_regcache_new: {e}")))?;
        let shared = Shared {
            cache: Arc::new(cache),
            domains: Arc::default(),
            host_bounce: AtomicBool::new(false),
            foreign: Mutex::default(),
            addresses: AddressTable::default(),
            callback: Arc::new(CallbackSlot::new()),
            born: Born::now(),
        };
        let (domains, callback) = (Arc::clone(&shared.domains), Arc::clone(&shared.callback));
        shared.cache.set_listener(Some(Arc::new(move |invalidated| {
            tell(&domains, &callback, invalidated);
        })));
        Ok(Box::into_raw(Box::new(PdRegCache {
            shared: Arc::new(shared),
        })))
    };
    // SAFETY: `err` is passed on under the same contract.
    unsafe { handle_guard("pd_regcache_new", err, make) }
}

/// Calls the caller's callback, if any, about a registration the cache invalidates.
fn tell(
    domains: &Mutex<HashMap<DomainId, Attached>>,
    callback: &CallbackSlot<Callback>,
    invalidated: &Invalidated<'_, AnyRegistrar>,
) {
    callback.call(|callback| call(domains, callback, invalidated));
}

/// Calls `callback` about `invalidated`.
fn call(
    domains: &Mutex<HashMap<DomainId, Attached>>,
    callback: Callback,
    invalidated: &Invalidated<'_, AnyRegistrar>,
) {
    let domain = lock(domains)
        .get(&invalidated.key.domain)
        .map_or(0, |attached| attached.handle);
    let (addr, length) = invalidated.mr.local().unwrap_or((0, 0));
    let event = PdInvalidation {
        domain: domain as *mut PdDomain,
        key: invalidated.mr.key(),
        addr: addr as *mut c_void,
        length,
        cause: match invalidated.cause {
            Cause::Memory => abi::PD_INVALIDATED_MEMORY,
            Cause::Device => abi::PD_INVALIDATED_DEVICE,
            Cause::Domain => abi::PD_INVALIDATED_DOMAIN,
        },
        held: u32::from(invalidated.held),
    };
    // The caller of `pd_regcache_set_invalidate_callback` promised that the function may be
    // called with its context from any thread until the callback is replaced or the cache freed.
    // SAFETY: that promise is the function's contract; `event` lives for the call.
    unsafe { (callback.function)(callback.ctx as *mut c_void, &event) };
}

/// `void pd_regcache_free(pd_regcache *cache)`: releases the cache (NULL is ignored). No
/// callback runs once it has started; cached registrations are deregistered now, those still
/// held by `pd_mr` handles when released; attached domains stay attached until detached.
///
/// # Safety
///
/// `cache` is NULL or a handle from `pd_regcache_new` not freed yet; it is not used after.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_free(cache: *mut PdRegCache) {
    const F: &str = "pd_regcache_free";
    // The closing deregistrations may touch the domains; a panic in a provider's close must
    // not unwind into C.
    guard_status(F, || {
        // SAFETY: the caller hands back a pointer from `Box::into_raw` in `pd_regcache_new`,
        // once.
        let Some(cache) = unsafe { take(F, "cache", cache) }? else {
            return Ok(());
        };
        let shared = &cache.shared;
        shared.callback.set(None);
        let domains: Vec<DomainId> = lock(&shared.domains).keys().copied().collect();
        for domain in domains {
            shared.cache.invalidate_domain(domain);
        }
        let mut foreign = lock(&shared.foreign);
        // Dropped once the lock is let go of (see `Shared::fd_source`).
        let sources = std::mem::take(&mut *foreign);
        shared.set_addresses(&foreign);
        drop(foreign);
        drop(sources);
        drop(cache);
        Ok(())
    });
}

/// `pd_domain *pd_domain_attach(pd_regcache *cache, struct fid_domain *domain, int *err)`: a
/// handle naming `domain` in `cache` for `pd_register`, new at each call.
///
/// # Safety
///
/// `cache` is NULL or a live handle; `domain` is NULL or an open `struct fid_domain` that the
/// caller keeps open and uses as the header says until the handle is detached; `err` is NULL
/// or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_domain_attach(
    cache: *mut PdRegCache,
    domain: *mut FidDomain,
    err: *mut c_int,
) -> *mut PdDomain {
    const F: &str = "pd_domain_attach";
    let make = || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        let domain = NonNull::new(domain).ok_or_else(|| Failure::null(F, "domain"))?;
        // SAFETY: the caller promises an open domain, kept open and used thread-safely while
        // attached, which is `from_raw_domain`'s contract.
        let fabric = unsafe { Fabric::from_raw_domain(domain.cast::<c_void>(), "libfabric") }
            .map_err(|err| Failure::from(err).prefixed(F))?;
        Ok(cache.attach(AnyRegistrar::Fabric(LibfabricRegistrar::new(fabric))))
    };
    // SAFETY: `err` is passed on under the same contract.
    unsafe { handle_guard(F, err, make) }
}

/// `pd_domain *pd_domain_attach_verbs(pd_regcache *cache, struct ibv_pd *pd, int *err)`: a
/// handle naming the caller's ibverbs protection domain `pd` in `cache`; registrations are
/// `ibv_reg_dmabuf_mr` in it.
///
/// # Safety
///
/// `cache` is NULL or a live handle; `pd` is NULL or a live `struct ibv_pd *` of the process'
/// libibverbs.so.1 that stays allocated (its context open) until the handle is detached and
/// every `pd_mr` of it released; `err` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn pd_domain_attach_verbs(
    cache: *mut PdRegCache,
    pd: *mut IbvPd,
    err: *mut c_int,
) -> *mut PdDomain {
    const F: &str = "pd_domain_attach_verbs";
    let make = || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        let pd = NonNull::new(pd).ok_or_else(|| Failure::null(F, "pd"))?;
        // SAFETY: the caller promises a live ibv_pd of the process' libibverbs.so.1 (the copy
        // `LIBRARY` names, already loaded), kept allocated while anything of it lives.
        let registrar = unsafe { IbverbsRegistrar::from_raw_pd(ibverbs::LIBRARY, pd.cast()) }
            .map_err(|err| Failure::from(err).prefixed(F))?;
        Ok(cache.attach(AnyRegistrar::Verbs(registrar)))
    };
    // SAFETY: `err` is passed on under the same contract.
    unsafe { handle_guard(F, err, make) }
}

impl PdRegCache {
    /// A new `pd_domain` handle for `registrar`.
    fn attach(&self, registrar: AnyRegistrar) -> *mut PdDomain {
        let registrar = Arc::new(registrar);
        let shared = &self.shared;
        let mut domains = lock(&shared.domains);
        registrar.set_host_bounce(shared.host_bounce.load(Relaxed));
        let handle = Box::into_raw(Box::new(PdDomain {
            shared: Arc::clone(shared),
            registrar: Arc::clone(&registrar),
            registering: AtomicUsize::new(0),
        }));
        domains.insert(
            registrar.domain(),
            Attached {
                handle: handle as usize,
                registrar: Arc::downgrade(&registrar),
            },
        );
        handle
    }
}

/// `int pd_domain_detach(pd_domain *domain)`: unless `pd_mr` handles still hold registrations
/// in the domain (`-EBUSY`: nothing dropped, the handle stays valid), drops the cache's
/// registrations in it and releases the handle; returns how many cached entries were dropped.
/// NULL returns 0.
///
/// # Safety
///
/// `domain` is NULL or a handle from `pd_domain_attach` not released yet; after a return of
/// 0 or more it is not used again.
#[no_mangle]
pub unsafe extern "C" fn pd_domain_detach(domain: *mut PdDomain) -> c_int {
    const F: &str = "pd_domain_detach";
    if domain.is_null() {
        return 0;
    }
    let mut dropped = 0;
    let status = guard_status(F, || {
        // SAFETY: the caller promises a live handle.
        let attached = unsafe { arg(F, "domain", domain.cast_const()) }?;
        let id = attached.registrar.domain();
        let busy = |held: usize| {
            Failure::new(
                Errno::BUSY,
                format!(
                    "{F}: {held} registration(s) in the domain are still held by pd_mr handles: \
                     pd_mr_release() them, then detach again (the domain stays attached, with \
                     its cached registrations, and must stay open until then)"
                ),
            )
        };
        let count = attached
            .shared
            .cache
            .invalidate_domain_unless_held(id)
            .map_err(busy)?;
        dropped = c_int::try_from(count).unwrap_or(c_int::MAX);
        // Every live registration of the domain holds its registrar, through the binding
        // they share. The cache held none, or has closed them: one left is held by a handle
        // of a cache freed meanwhile (whose entries no longer count them), or being made.
        if attached.registering.load(Acquire) == 0 && Arc::strong_count(&attached.registrar) > 1 {
            return Err(Failure::new(
                Errno::BUSY,
                format!(
                    "{F}: registrations in the domain are still held by pd_mr handles (the \
                     cache was freed meanwhile, or a call racing this one is making one): \
                     pd_mr_release() them, then detach again (the domain stays attached and \
                     must stay open until then)"
                ),
            ));
        }
        // A call on this handle is registering in the domain: this one runs inside it (a
        // key allocator's), or races its release.
        if attached.registering.load(Acquire) > 0 {
            return Err(Failure::new(
                Errno::BUSY,
                format!(
                    "{F}: a call on this domain handle is registering in it while it is \
                     detached (from another thread, or from inside that call: its key \
                     allocator): let that call return and pd_mr_release() its handle, then \
                     detach again (the domain stays attached and must stay open until then)"
                ),
            ));
        }
        lock(&attached.shared.domains).remove(&id);
        // SAFETY: the caller hands back a pointer from `Box::into_raw` in `pd_domain_attach`,
        // and does not use it after this success.
        drop(unsafe { Box::from_raw(domain) });
        Ok(())
    });
    if status < 0 {
        status
    } else {
        dropped
    }
}

/// The libfabric registrar of a `pd_domain`, or `-EOPNOTSUPP` for an ibverbs domain.
fn fabric_registrar<'a>(
    function: &str,
    domain: &'a PdDomain,
) -> Result<&'a LibfabricRegistrar, Failure> {
    match &*domain.registrar {
        AnyRegistrar::Fabric(registrar) => Ok(registrar),
        AnyRegistrar::Verbs(_) => Err(Failure::new(
            Errno::OPNOTSUPP,
            format!(
                "{function}: an ibverbs domain: keys, the memory's iface and endpoint binding \
                 are libfabric's (ibverbs picks its own keys, and binds memory regions to \
                 protection domains only)"
            ),
        )),
    }
}

/// `int pd_domain_set_keys(pd_domain *domain, pd_key_alloc_fn alloc, pd_key_release_fn
/// release, void *ctx, size_t key_size)`: the keys new registrations in the domain request.
///
/// # Safety
///
/// `domain` is NULL or a live handle; `alloc` and `release` (NULL or functions) may be called
/// with `ctx` from any thread until the last registration of the domain made with them is
/// closed.
#[no_mangle]
pub unsafe extern "C" fn pd_domain_set_keys(
    domain: *mut PdDomain,
    alloc: Option<PdKeyAllocFn>,
    release: Option<PdKeyReleaseFn>,
    ctx: *mut c_void,
    key_size: usize,
) -> c_int {
    const F: &str = "pd_domain_set_keys";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let domain = unsafe { arg(F, "domain", domain.cast_const()) }?;
        let registrar = fabric_registrar(F, domain)?;
        match alloc {
            Some(alloc) => registrar.set_keys(
                Arc::new(CKeys {
                    alloc,
                    release,
                    ctx: ctx as usize,
                }),
                key_size,
            ),
            None => registrar.set_process_keys(),
        }
        Ok(())
    })
}

/// `int pd_domain_set_iface(pd_domain *domain, uint32_t iface, int device)`: where the memory
/// of new registrations in the domain lives (`PD_IFACE_*`).
///
/// # Safety
///
/// `domain` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_domain_set_iface(
    domain: *mut PdDomain,
    iface: u32,
    device: c_int,
) -> c_int {
    const F: &str = "pd_domain_set_iface";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let domain = unsafe { arg(F, "domain", domain.cast_const()) }?;
        let iface = match iface {
            abi::PD_IFACE_SYSTEM => Iface::System,
            abi::PD_IFACE_SYNAPSEAI => Iface::SynapseAi { device },
            other => {
                return Err(Failure::new(
                    Errno::INVAL,
                    format!("{F}: iface {other} is none of PD_IFACE_SYSTEM, PD_IFACE_SYNAPSEAI"),
                ))
            }
        };
        fabric_registrar(F, domain)?.set_iface(iface);
        Ok(())
    })
}

/// `int pd_domain_set_endpoint(pd_domain *domain, struct fid_ep *ep)`: the endpoint new
/// registrations in the domain are bound to and enabled with (`FI_MR_ENDPOINT`), or none.
/// Cached registrations made with another endpoint (or none) are dropped first, unless `pd_mr`
/// handles hold some: `-EBUSY`, nothing dropped and the endpoint unchanged (also while a
/// registration is under way, which may come after the cached ones were dropped).
///
/// # Safety
///
/// `domain` is NULL or a live handle; `ep` is NULL or an open, enabled `struct fid_ep` of the
/// attached domain, kept open until every registration bound to it is closed (its `pd_mr`
/// handles released and the domain detached or named another endpoint).
#[no_mangle]
pub unsafe extern "C" fn pd_domain_set_endpoint(domain: *mut PdDomain, ep: *mut FidEp) -> c_int {
    const F: &str = "pd_domain_set_endpoint";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let domain = unsafe { arg(F, "domain", domain.cast_const()) }?;
        let registrar = fabric_registrar(F, domain)?;
        let endpoint = || {
            NonNull::new(ep).map(|ep| {
                // `from_raw`'s contract is the caller's promise (the domain's thread rule too).
                // SAFETY: an open endpoint of the domain, open until its registrations close.
                unsafe { MrEndpoint::from_raw(ep.cast::<c_void>()) }
            })
        };
        match registrar.set_endpoint(endpoint()) {
            Err(LibfabricError::EndpointBusy { .. }) => {}
            done => return done.map_err(|err| Failure::from(err).prefixed(F)),
        }
        let busy = |registrations: usize| {
            Failure::new(
                Errno::BUSY,
                format!(
                    "{F}: {registrations} registration(s) in the domain made with the endpoint \
                     named before are still held by pd_mr handles (or being made): \
                     pd_mr_release() them, then call again (each must be closed before the \
                     endpoint it is bound to; the endpoint named stays as it was)"
                ),
            )
        };
        // Registrations made with the endpoint named before are open: unless handles hold
        // some, the cache's go now (the invalidation callback is told) and the endpoint may
        // change.
        domain
            .shared
            .cache
            .invalidate_domain_unless_held(domain.registrar.domain())
            .map_err(busy)?;
        match registrar.set_endpoint(endpoint()) {
            Err(LibfabricError::EndpointBusy { registrations, .. }) => Err(busy(registrations)),
            done => done.map_err(|err| Failure::from(err).prefixed(F)),
        }
    })
}

/// `int pd_regcache_set_invalidate_callback(pd_regcache *cache, pd_invalidate_fn function,
/// void *ctx)`: from now on, `function(ctx, invalidation)` is called once for every
/// registration of the cache whose memory, device or domain goes (NULL: no callback).
///
/// # Safety
///
/// `cache` is NULL or a live handle; `function` is NULL or may be called with `ctx` from any
/// thread until it is replaced or the cache freed.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_set_invalidate_callback(
    cache: *mut PdRegCache,
    function: Option<PdInvalidateFn>,
    ctx: *mut c_void,
) -> c_int {
    const F: &str = "pd_regcache_set_invalidate_callback";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        cache.shared.callback.set(function.map(|function| Callback {
            function,
            ctx: ctx as usize,
        }));
        Ok(())
    })
}

/// `int pd_register(pd_domain *domain, const pd_allocation *alloc, uint64_t offset, uint64_t
/// length, uint32_t access, pd_mr **out)`.
///
/// # Safety
///
/// `domain` and `alloc` are NULL or live handles, and `alloc` is not being freed meanwhile;
/// `out` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn pd_register(
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let storage = std::ptr::null_mut();
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_alloc::<false>(domain, alloc, offset, length, access, storage, out) }
}

/// `int pd_register_in(pd_domain *domain, const pd_allocation *alloc, uint64_t offset,
/// uint64_t length, uint32_t access, pd_mr_storage *storage, pd_mr **out)`: as `pd_register`,
/// the handle made in the caller's `storage` (its address stored in `*out`).
///
/// # Safety
///
/// As for `pd_register`; `storage` is NULL or valid for writing a `pd_mr_storage` and holds
/// no handle that is not released.
#[no_mangle]
pub unsafe extern "C" fn pd_register_in(
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_alloc::<true>(domain, alloc, offset, length, access, storage, out) }
}

/// The C functions of [`register_alloc`]: the handle boxed, and in place ([`named`]).
const REGISTER_ALLOC: (&str, &str) = ("pd_register", "pd_register_in");

/// The name of the C function of `functions` (as [`REGISTER_ALLOC`]) that makes its handle in
/// place if `in_place`.
const fn named(in_place: bool, functions: (&'static str, &'static str)) -> &'static str {
    if in_place {
        functions.1
    } else {
        functions.0
    }
}

/// Registers bytes `[offset, offset + length)` of `alloc` in `domain` and makes a handle
/// where [`Out::of`] says.
///
/// # Safety
///
/// `domain` and `alloc` are NULL or live handles, and the allocation is not being freed
/// meanwhile; `storage` (if `IN_PLACE`) and `out` are NULL or valid for writing.
#[inline(always)]
unsafe fn register_alloc<const IN_PLACE: bool>(
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    guard_fast_path(named(IN_PLACE, REGISTER_ALLOC), || {
        // SAFETY: passed on under the caller's contract.
        unsafe { at_alloc::<IN_PLACE>(domain, alloc, offset, length, access, storage, out) }
    })
}

/// [`register_alloc`]'s guarded call: the hit, or else the miss. Out of line, for
/// [`guard_fast_path`].
///
/// # Safety
///
/// As for [`register_alloc`].
#[inline(never)]
unsafe fn at_alloc<const IN_PLACE: bool>(
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    let function = named(IN_PLACE, REGISTER_ALLOC);
    let out = Out::of::<IN_PLACE>(storage, out);
    // SAFETY: passed on under the caller's contract.
    match unsafe { hit_alloc(domain, alloc, offset, length, access, out) } {
        Some(()) => 0,
        // SAFETY: as above.
        None => unsafe { missed_alloc(function, domain, alloc, offset, length, access, out) },
    }
}

/// [`register_alloc_missed`], guarded on its own: the miss of [`at_alloc`], which passes it
/// its arguments as they are (captured by a closure there, they were stored before the hit).
///
/// # Safety
///
/// As for [`register_alloc`].
#[cold]
#[inline(never)]
unsafe fn missed_alloc(
    function: &'static str,
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    out: Out,
) -> c_int {
    guard_status(function, || {
        // SAFETY: passed on under the caller's contract.
        unsafe { register_alloc_missed(function, domain, alloc, offset, length, access, out) }
    })
}

/// [`register_alloc`]'s cache hit, which has no failure to report: `None` for a miss, before
/// the allocation's first registration or the cache's first watch of its device, and for
/// whatever [`register_alloc_missed`] refuses (and says why).
///
/// # Safety
///
/// As for [`register_alloc`].
#[inline(always)]
unsafe fn hit_alloc(
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    out: Out,
) -> Option<()> {
    // SAFETY: the caller promises NULL or a live handle.
    let domain = unsafe { domain.as_ref() }?;
    // SAFETY: the caller promises NULL or a live handle, not freed during this call.
    let alloc = unsafe { alloc.as_ref() }?;
    let access = known_access(access)?;
    if domain.born().inherited() || alloc.born().inherited() || !out.valid() {
        return None;
    }
    let range = range_in(alloc.length, offset, length)?;
    let source = alloc.source.get()?;
    let registration = domain.shared.cache.get_cached_from(
        &alloc.device,
        &domain.registrar,
        source.export,
        range,
        access,
    )?;
    // SAFETY: `out`'s pointers are not NULL (`valid`) and the caller promises them valid.
    unsafe { domain.hand_out(registration, out) };
    Some(())
}

/// [`register_alloc`] when [`hit_alloc`] made no handle: the arguments checked, each refusal
/// said, the allocation's export made on its first registration, and registered through the
/// cache, which attaches to the device first. Out of line, so that the code of a hit stays
/// short.
///
/// # Safety
///
/// As for [`register_alloc`].
#[cold]
#[inline(never)]
unsafe fn register_alloc_missed(
    function: &str,
    domain: *mut PdDomain,
    alloc: *const PdAllocation,
    offset: u64,
    length: u64,
    access: u32,
    out: Out,
) -> Result<(), Failure> {
    // SAFETY: the caller promises NULL or a live handle.
    let domain = unsafe { arg(function, "domain", domain.cast_const()) }?;
    // SAFETY: the caller promises NULL or a live handle, not freed during this call.
    let alloc = unsafe { arg(function, "alloc", alloc) }?;
    let out = out.checked(function)?;
    let access = checked_access(function, access)?;
    let range = checked_range(function, "allocation", alloc.length, offset, length)?;
    let source = source(alloc)?;
    // SAFETY: `out`'s pointers are not NULL (checked) and the caller promises them valid.
    unsafe {
        domain.register_into(
            function,
            Some(&alloc.device),
            source,
            range,
            None,
            access,
            out,
        )
    }
}

/// `int pd_register_dmabuf(pd_domain *domain, int fd, uint64_t offset, uint64_t length,
/// uint32_t access, pd_mr **out)`: as `pd_register`, for a dma-buf exported by something else
/// (habanalabs, a GPU, udmabuf).
///
/// # Safety
///
/// `domain` is NULL or a live handle; `fd` is open for the call; `out` as for `pd_register`.
#[no_mangle]
pub unsafe extern "C" fn pd_register_dmabuf(
    domain: *mut PdDomain,
    fd: c_int,
    offset: u64,
    length: u64,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let request = FdRequest {
        fd,
        offset,
        length,
        base_addr: None,
        access,
    };
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_fd("pd_register_dmabuf", domain, None, &request, out) }
}

/// A registration of a dma-buf fd, as `pd_register_dmabuf` and `pd_register_export` (mapped:
/// `base_addr` `None`) and their `_at` siblings ask for it.
struct FdRequest {
    fd: c_int,
    offset: u64,
    length: u64,
    base_addr: Option<u64>,
    access: u32,
}

/// Registers `request` in `domain` and stores a new handle in `out`: a dma-buf exported
/// elsewhere (`dev` `None`), or one that the device `dev` exported, registered under its
/// identity on that device, watched.
///
/// # Safety
///
/// `domain` is NULL or a live handle, and so is `dev` if given; `request.fd` is open for the
/// call; `out` is NULL or valid for writing a pointer.
unsafe fn register_fd(
    function: &'static str,
    domain: *mut PdDomain,
    dev: Option<*const PdDevice>,
    request: &FdRequest,
    out: *mut *mut PdMr,
) -> c_int {
    guard_status(function, || {
        // SAFETY: the caller promises NULL or a live handle.
        let domain = unsafe { arg(function, "domain", domain.cast_const()) }?;
        let device = match dev {
            // SAFETY: the caller promises NULL or a live handle.
            Some(dev) => Some(&unsafe { arg(function, "dev", dev) }?.device),
            None => None,
        };
        let out = Out::Boxed { out }.checked(function)?;
        let access = checked_access(function, request.access)?;
        let (source, range) = domain.shared.fd_source(
            function,
            request.fd,
            device,
            request.base_addr,
            request.offset,
            request.length,
        )?;
        // SAFETY: `out` is not NULL (checked) and the caller promises it valid for writing.
        unsafe {
            domain.register_source(function, device.map(|d| &**d), source, range, access, out)
        }
    })
}

/// `int pd_register_dmabuf_at(pd_domain *domain, int fd, uint64_t offset, uint64_t length,
/// void *base_addr, uint32_t access, pd_mr **out)`: as `pd_register_dmabuf`, by the fd alone:
/// the dma-buf is not mapped, and its first byte is named `base_addr` in the registration
/// (ibverbs: bytes `offset..` at IOVA `base_addr + offset`).
///
/// # Safety
///
/// `domain` is NULL or a live handle; `fd` is open for the call; `out` as for `pd_register`.
/// `base_addr` is only passed on to the provider, never dereferenced here.
#[no_mangle]
pub unsafe extern "C" fn pd_register_dmabuf_at(
    domain: *mut PdDomain,
    fd: c_int,
    offset: u64,
    length: u64,
    base_addr: *mut c_void,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let request = FdRequest {
        fd,
        offset,
        length,
        base_addr: Some(base_addr as u64),
        access,
    };
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_fd("pd_register_dmabuf_at", domain, None, &request, out) }
}

/// `int pd_register_addr(pd_domain *domain, const void *addr, uint64_t length, uint32_t
/// access, pd_mr **out)`: bytes `[addr, addr + length)` of a dma-buf registered at the caller's
/// addresses (`pd_register_dmabuf_at`), found by those addresses, as a runtime's registration
/// cache finds the registration covering a buffer: a hit when one covers them.
///
/// # Safety
///
/// `domain` is NULL or a live handle; `out` as for `pd_register`. `addr` is only compared,
/// never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn pd_register_addr(
    domain: *mut PdDomain,
    addr: *const c_void,
    length: u64,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let storage = std::ptr::null_mut();
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_at_addr::<false>(domain, addr, length, access, storage, out) }
}

/// `int pd_register_addr_in(pd_domain *domain, const void *addr, uint64_t length, uint32_t
/// access, pd_mr_storage *storage, pd_mr **out)`: as `pd_register_addr`, the handle made in
/// the caller's `storage` (its address stored in `*out`).
///
/// # Safety
///
/// As for `pd_register_addr`; `storage` as for `pd_register_in`.
#[no_mangle]
pub unsafe extern "C" fn pd_register_addr_in(
    domain: *mut PdDomain,
    addr: *const c_void,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_at_addr::<true>(domain, addr, length, access, storage, out) }
}

/// The C functions of [`register_at_addr`], as [`REGISTER_ALLOC`].
const REGISTER_AT_ADDR: (&str, &str) = ("pd_register_addr", "pd_register_addr_in");

/// Registers bytes `[addr, addr + length)` of the dma-buf registered at those addresses in
/// `domain` and makes a handle where [`Out::of`] says.
///
/// # Safety
///
/// `domain` is NULL or a live handle; `storage` (if `IN_PLACE`) and `out` are NULL or valid
/// for writing.
#[inline(always)]
unsafe fn register_at_addr<const IN_PLACE: bool>(
    domain: *mut PdDomain,
    addr: *const c_void,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    let addr = addr as u64;
    guard_fast_path(named(IN_PLACE, REGISTER_AT_ADDR), || {
        // SAFETY: passed on under the caller's contract.
        unsafe { at_addr::<IN_PLACE>(domain, addr, length, access, storage, out) }
    })
}

/// [`register_at_addr`]'s guarded call: the hit, or else the miss. Out of line, for
/// [`guard_fast_path`].
///
/// # Safety
///
/// As for [`register_at_addr`].
#[inline(never)]
unsafe fn at_addr<const IN_PLACE: bool>(
    domain: *mut PdDomain,
    addr: u64,
    length: u64,
    access: u32,
    storage: *mut PdMrStorage,
    out: *mut *mut PdMr,
) -> c_int {
    let function = named(IN_PLACE, REGISTER_AT_ADDR);
    let out = Out::of::<IN_PLACE>(storage, out);
    // SAFETY: passed on under the caller's contract.
    match unsafe { hit_at_addr(domain, addr, length, access, out) } {
        Some(()) => 0,
        // SAFETY: as above.
        None => unsafe { missed_at_addr(function, domain, addr, length, access, out) },
    }
}

/// [`register_at_addr_missed`], guarded on its own: the miss of [`at_addr`] (as
/// [`missed_alloc`] is [`at_alloc`]'s).
///
/// # Safety
///
/// As for [`register_at_addr`].
#[cold]
#[inline(never)]
unsafe fn missed_at_addr(
    function: &'static str,
    domain: *mut PdDomain,
    addr: u64,
    length: u64,
    access: u32,
    out: Out,
) -> c_int {
    guard_status(function, || {
        // SAFETY: passed on under the caller's contract.
        unsafe { register_at_addr_missed(function, domain, addr, length, access, out) }
    })
}

/// [`register_at_addr`]'s cache hit, which has no failure to report: `None` for a miss and
/// for whatever [`register_at_addr_missed`] refuses (and says why).
///
/// # Safety
///
/// As for [`register_at_addr`].
#[inline(always)]
unsafe fn hit_at_addr(
    domain: *mut PdDomain,
    addr: u64,
    length: u64,
    access: u32,
    out: Out,
) -> Option<()> {
    // SAFETY: the caller promises NULL or a live handle.
    let domain = unsafe { domain.as_ref() }?;
    let access = known_access(access)?;
    if domain.born().inherited() || length == 0 || !out.valid() {
        return None;
    }
    let shared = &domain.shared;
    // A hit reads the table and the cache and writes nothing other threads' hits read.
    // An entry read just before its dma-buf was dropped names an export that no other
    // dma-buf can take (the kernel numbers dma-buf inodes from a 64-bit counter, never
    // reused: dma_buf_getfile), so the cache has nothing for it, or the registration that
    // the lookup, ordered before the drop, may hand out.
    let end = addr.checked_add(length)?;
    let at = shared.addresses.find(|at| at.covers(addr, end))?;
    let range = range_in(at.size, addr - at.base, length)?;
    let registration = shared
        .cache
        .get_cached(&domain.registrar, at.export, range, access)?;
    // SAFETY: `out`'s pointers are not NULL (`valid`) and the caller promises them valid.
    unsafe { domain.hand_out(registration, out) };
    Some(())
}

/// [`register_at_addr`] when [`hit_at_addr`] made no handle: the arguments checked, each
/// refusal said, and the dma-buf found under the lock of the caller's dma-bufs and
/// registered through the cache (a hit there too if it was registered meanwhile). Out of
/// line, so that the code of a hit stays short.
///
/// # Safety
///
/// As for [`register_at_addr`].
#[cold]
#[inline(never)]
unsafe fn register_at_addr_missed(
    function: &str,
    domain: *mut PdDomain,
    addr: u64,
    length: u64,
    access: u32,
    out: Out,
) -> Result<(), Failure> {
    // SAFETY: the caller promises NULL or a live handle.
    let domain = unsafe { arg(function, "domain", domain.cast_const()) }?;
    let out = out.checked(function)?;
    let access = checked_access(function, access)?;
    if length == 0 {
        return Err(Failure::new(
            Errno::INVAL,
            format!("{function}: length 0; name the bytes the operation uses"),
        ));
    }
    let source = domain.shared.source_at(function, addr, length)?;
    let range = checked_range(
        function,
        "dma-buf",
        source.source.dma_buf().length(),
        addr - source.source.base_addr(),
        length,
    )?;
    // The dma-buf's largest registration, if it covers the bytes and the cache can keep it:
    // a runtime registered its pool, which was evicted once no handle held it; registered
    // again whole, the pool's other buffers hit it, as before, instead of each registering.
    let limits = domain.shared.cache.limits();
    let wide = source
        .widened(range)
        .filter(|wide| *wide != range && limits.uncached(wide.length()).is_none());
    // SAFETY: `out`'s pointers are not NULL (checked) and the caller promises them valid.
    unsafe {
        domain.register_into(
            function,
            source.device.as_deref(),
            &source,
            range,
            wide,
            access,
            out,
        )
    }
}

/// `int pd_register_export(pd_domain *domain, const pd_device *dev, int fd, uint64_t offset,
/// uint64_t length, uint32_t access, pd_mr **out)`: as `pd_register_dmabuf`, for a dma-buf
/// that `dev` exported (`pd_export_range` on a companion, or `pd_export`): registered under
/// its identity on that device, with the cache watching the device, so that its removal
/// invalidates the registration (and tells the callback) as for `pd_register`.
///
/// # Safety
///
/// `domain` and `dev` are NULL or live handles; `fd` is open for the call; `out` as for
/// `pd_register`.
#[no_mangle]
pub unsafe extern "C" fn pd_register_export(
    domain: *mut PdDomain,
    dev: *const PdDevice,
    fd: c_int,
    offset: u64,
    length: u64,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let request = FdRequest {
        fd,
        offset,
        length,
        base_addr: None,
        access,
    };
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_fd("pd_register_export", domain, Some(dev), &request, out) }
}

/// `int pd_register_export_at(pd_domain *domain, const pd_device *dev, int fd, uint64_t
/// offset, uint64_t length, void *base_addr, uint32_t access, pd_mr **out)`: as
/// `pd_register_dmabuf_at` (by the fd alone, its first byte named `base_addr`, found by
/// address with `pd_register_addr`), for a dma-buf that `dev` exported, registered as
/// `pd_register_export` registers it: watched, so that a reset or the removal of the device
/// drops its registrations and tells the callback. The cache keeps `dev`'s file open while it
/// knows the dma-buf, so that misses found by address register it watched too.
///
/// # Safety
///
/// As for `pd_register_export`; `base_addr` as for `pd_register_dmabuf_at`.
#[no_mangle]
pub unsafe extern "C" fn pd_register_export_at(
    domain: *mut PdDomain,
    dev: *const PdDevice,
    fd: c_int,
    offset: u64,
    length: u64,
    base_addr: *mut c_void,
    access: u32,
    out: *mut *mut PdMr,
) -> c_int {
    let request = FdRequest {
        fd,
        offset,
        length,
        base_addr: Some(base_addr as u64),
        access,
    };
    // SAFETY: the arguments are passed on under the same contract.
    unsafe { register_fd("pd_register_export_at", domain, Some(dev), &request, out) }
}

/// Whether `dma_buf` was exported by the peerdirect device `index`: its exporter and the name
/// peerdirect gives its dma-bufs (`peerdirectN:...`), as `/proc/self/fdinfo` shows them.
fn exported_by(dma_buf: &pd::DmaBuf, index: u32) -> bool {
    let fd = dma_buf.as_fd().as_raw_fd();
    let Ok(info) = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")) else {
        return false;
    };
    let field = |key: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
    };
    field("exp_name:") == Some("peerdirect")
        && field("name:").is_some_and(|name| name.starts_with(&format!("peerdirect{index}:")))
}

/// `int pd_regcache_invalidate_dmabuf(pd_regcache *cache, int fd)`: drops every cached
/// registration of the dma-buf `fd` (registered with `pd_register_dmabuf`) and the cache's
/// reference to it; returns how many entries were dropped, or a negative errno.
///
/// # Safety
///
/// `cache` is NULL or a live handle; `fd` is open for the call.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_invalidate_dmabuf(cache: *mut PdRegCache, fd: c_int) -> c_int {
    const F: &str = "pd_regcache_invalidate_dmabuf";
    let mut dropped = 0;
    let status = guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        let foreign = ExportId::foreign(&borrowed_dma_buf(F, fd)?)
            .map_err(|errno| Failure::new(errno, format!("{F}: fstat of fd {fd}: {errno}")))?;
        // Registered with pd_register_export, it is known under its device's identity.
        let source = {
            let mut sources = lock(&cache.shared.foreign);
            let source = sources.remove(&foreign.dma_buf_inode());
            cache.shared.set_addresses(&sources);
            source
        };
        let export = source.map_or(foreign, |source| source.export);
        // Its mapping and duplicate fd go once no registration uses them.
        let count = cache.shared.cache.invalidate_export(export);
        dropped = c_int::try_from(count).unwrap_or(c_int::MAX);
        Ok(())
    });
    if status < 0 {
        status
    } else {
        dropped
    }
}

/// A duplicate of the caller's dma-buf `fd`, which must be open for the call.
fn borrowed_dma_buf(function: &str, fd: c_int) -> Result<pd::DmaBuf, Failure> {
    if fd < 0 {
        return Err(Failure::new(
            Errno::BADF,
            format!("{function}: fd {fd} is not a file descriptor"),
        ));
    }
    // SAFETY: the caller promises `fd` is open for the duration of the call; it is only
    // duplicated here.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    pd::DmaBuf::from_borrowed(borrowed).map_err(|err| Failure::from(err).prefixed(function))
}

#[inline]
fn checked_access(function: &str, access: u32) -> Result<Access, Failure> {
    known_access(access).ok_or_else(|| {
        Failure::new(
            Errno::INVAL,
            format!(
                "{function}: access {access:#x}: give one or more PD_ACCESS_* and nothing else"
            ),
        )
    })
}

/// `access` if it is one or more `PD_ACCESS_*` and nothing else.
#[inline]
fn known_access(access: u32) -> Option<Access> {
    let known = abi::PD_ACCESS_LOCAL_READ
        | abi::PD_ACCESS_LOCAL_WRITE
        | abi::PD_ACCESS_REMOTE_READ
        | abi::PD_ACCESS_REMOTE_WRITE;
    (access != 0 && access & !known == 0).then(|| Access::from_bits_truncate(access as u8))
}

/// `offset..offset + length` of `what` (an allocation, a dma-buf), `size` bytes; `length` 0 is
/// up to the end.
#[inline]
fn checked_range(
    function: &str,
    what: &str,
    size: u64,
    offset: u64,
    length: u64,
) -> Result<ByteRange, Failure> {
    range_in(size, offset, length).ok_or_else(|| {
        Failure::new(
            Errno::INVAL,
            format!(
                "{function}: {length} bytes at offset {offset} do not fit in the {size}-byte \
                 {what}"
            ),
        )
    })
}

/// `offset..offset + length` if it fits in `size` bytes; `length` 0 is up to the end.
#[inline]
fn range_in(size: u64, offset: u64, length: u64) -> Option<ByteRange> {
    let length = if length == 0 {
        size.saturating_sub(offset)
    } else {
        length
    };
    ByteRange::new(offset, length)
        .ok()
        .filter(|range| range.end() <= size)
}

/// The allocation's export, made and mapped on first use, and again once a reset of the
/// device revoked it.
fn source(alloc: &PdAllocation) -> Result<&Source, Failure> {
    alloc.source.get_or_make(
        |made| !made.revoked_by(&alloc.device),
        || {
            let resets = || alloc.device.status().map(|status| status.resets());
            // Read before the export: a reset after it revokes it, and then the count
            // differs from this one.
            let before = resets();
            match export_mapped(alloc, before) {
                // A reset between the export and its mapping revoked it (the mapping fails
                // with ENODEV): the allocation is exported once more.
                Err(err) if err.errno() == Errno::NODEV && resets() != before => {
                    export_mapped(alloc, resets())
                }
                made => made,
            }
        },
    )
}

/// A new export of all of `alloc`, read-write, and its mapping, as `pd_register` registers
/// it; `resets` read before.
fn export_mapped(alloc: &PdAllocation, resets: Option<u32>) -> Result<Source, Failure> {
    let mut raw = RawExport::<0>::new();
    raw.export.handle = alloc.handle;
    raw.export.flags = abi::PD_EXPORT_CLOEXEC | abi::PD_EXPORT_RDWR;
    let dma_buf = alloc.device.export_raw(&mut raw)?;
    let export = alloc.device.export_id(&dma_buf).map_err(|errno| {
        Failure::new(errno, format!("pd_register: fstat of the dma-buf: {errno}"))
    })?;
    let source = MappedDmaBuf::new(dma_buf)?.into_source();
    Ok(Source::new(source, export, resets))
}

impl PdDomain {
    /// Registers `range` of `source` in the domain through the cache and makes a handle where
    /// `out` says; the cache attached to `device` first if `source` is its export. With
    /// `wide` (a range that covers `range`), that is registered instead and the handle made
    /// for `range` in it; if the provider refuses `wide`, `range` alone.
    ///
    /// # Safety
    ///
    /// `out`'s pointers are not NULL ([`Out::checked`]) and are valid for writing what they
    /// point to; its storage holds no handle that is not released.
    #[allow(clippy::too_many_arguments)]
    unsafe fn register_into(
        &self,
        function: &str,
        device: Option<&Device>,
        source: &Source,
        range: ByteRange,
        wide: Option<ByteRange>,
        access: Access,
        out: Out,
    ) -> Result<(), Failure> {
        if let Some(device) = device.filter(|d| d.status().is_some_and(|s| s.revoked())) {
            // Its exports are revoked: a provider would register the revoked dma-buf (tcp
            // through a mapping that faults) and the cache could not keep it.
            return Err(Failure::new(
                Errno::NODEV,
                format!(
                    "{function}: /dev/peerdirect{} is gone (its device unbound or removed, or \
                     the companion removed), which revoked its exports: export the memory \
                     again once the device is back (a companion added again is a new \
                     /dev/peerdirectN)",
                    device.index()
                ),
            ));
        }
        let cache = &self.shared.cache;
        let (registrar, export) = (&self.registrar, source.export);
        let _registering = Registering::new(&self.registering);
        let get = |range| match device {
            Some(device) => {
                cache.get_from(device, registrar, &source.source, export, range, access)
            }
            None => cache.get(registrar, &source.source, export, range, access),
        };
        // A provider may refuse the larger registration (its limits, its resources) and
        // still take the bytes asked for: then those alone. A registration of `wide` covers
        // `range` (`widened` keeps only ranges that contain it), so narrowing it cannot fail;
        // were it to, the handle would name the wrong bytes, so `range` is registered instead.
        let registration = match wide.map(|wide| get(wide).map(|r| r.narrowed(range))) {
            Some(Ok(Ok(narrowed))) => Ok(narrowed),
            Some(Ok(Err(_)) | Err(_)) | None => get(range),
        };
        let registration = registration.map_err(|err| err.prefixed(function))?;
        if !source.source.is_mapped() {
            source.registered_range(registration.key().range);
        }
        // Set while this call's reference to `source` still counts: see
        // `Shared::forget_unregistered`. The first registration through a dma-buf at the
        // caller's addresses puts it at them.
        if !source.registered.swap(true, AcqRel) {
            self.shared.publish(source);
        }
        // SAFETY: passed on under the same contract.
        unsafe { self.hand_out(registration, out) };
        Ok(())
    }

    /// Registers `range` of a dma-buf the caller passed by fd ([`Shared::fd_source`]) through
    /// the cache, as [`PdDomain::register_into`]. A refusal of a dma-buf that no registration
    /// ever took forgets it ([`Shared::forget_unregistered`]): it is not left at its base
    /// address, nor its duplicate fd kept.
    ///
    /// # Safety
    ///
    /// As for [`PdDomain::register_into`].
    unsafe fn register_source(
        &self,
        function: &str,
        device: Option<&Device>,
        source: Arc<Source>,
        range: ByteRange,
        access: Access,
        out: Out,
    ) -> Result<(), Failure> {
        let result = {
            // SAFETY: `out` is this function's, whose pointers its caller promises are not
            // NULL, valid for writing and holding no unreleased handle: register_into's contract.
            unsafe { self.register_into(function, device, &source, range, None, access, out) }
        };
        if result.is_err() {
            self.shared.forget_unregistered(source);
        }
        result
    }

    /// Makes a handle of `registration` where `out` says.
    ///
    /// # Safety
    ///
    /// As for [`PdDomain::register_into`].
    #[inline]
    unsafe fn hand_out(&self, registration: Registration<AnyRegistrar>, out: Out) {
        let born = self.shared.born;
        match out {
            Out::Boxed { out } => {
                let mr = Box::into_raw(Box::new(PdMr::new(registration, born, true)));
                // SAFETY: not NULL (the caller checked) and valid for writing a pointer.
                unsafe { out.write(mr) };
            }
            Out::InPlace { storage, out } => {
                // A `PdMrStorage` is as large and as aligned as a `PdMr` (asserted at its
                // definition); the caller's holds no live handle, so nothing needs dropping.
                let mr = storage.cast::<PdMr>();
                // SAFETY: not NULL (checked), valid for writing a `PdMrStorage`, room for a
                // `PdMr` (above), and no handle in it is overwritten.
                unsafe { mr.write(PdMr::new(registration, born, false)) };
                // SAFETY: as `storage`, not NULL and valid for writing a pointer.
                unsafe { out.write(mr) };
            }
        }
    }
}

impl Shared {
    /// The dma-buf registered at the caller's addresses (`pd_register_dmabuf_at`) whose bytes
    /// `[addr, addr + length)` are; `ENOENT` if none. Under the lock of `foreign`: the path of
    /// a miss, or of dma-bufs that [`Shared::addresses`] has no room for.
    fn source_at(&self, function: &str, addr: u64, length: u64) -> Result<Arc<Source>, Failure> {
        let end = addr.checked_add(length);
        let foreign = lock(&self.foreign);
        let source = foreign
            .values()
            .find(|s| {
                let base = s.source.base_addr();
                s.at_addresses()
                    && base <= addr
                    && end.is_some_and(|end| end <= base + s.source.dma_buf().length())
            })
            .ok_or_else(|| {
                // The dma-buf whose bytes the first one is, if any: the range is too long.
                let first = foreign.values().find(|s| {
                    let base = s.source.base_addr();
                    s.at_addresses() && base <= addr && addr - base < s.source.dma_buf().length()
                });
                Failure::new(
                    Errno::NOENT,
                    match first {
                        Some(s) => format!(
                            "{function}: {addr:#x} (+{length:#x}) runs past the end of the \
                             dma-buf registered at {:#x} (+{:#x}); name bytes inside it",
                            s.source.base_addr(),
                            s.source.dma_buf().length()
                        ),
                        None => format!(
                            "{function}: no dma-buf registered at the caller's addresses \
                             (pd_register_dmabuf_at, pd_register_export_at) covers {addr:#x} \
                             (+{length:#x}); register the memory it is in first"
                        ),
                    },
                )
            })?;
        if let Some(device) = source.device.as_ref().filter(|_| source.revoked()) {
            // Kept (its fd is refused as revoked too) until a new dma-buf takes its addresses,
            // but no longer in the table: lookups of its bytes come here.
            self.set_addresses(&foreign);
            return Err(Failure::new(
                Errno::NODEV,
                format!(
                    "{function}: the dma-buf registered at {:#x} (+{:#x}) is an export of \
                     /dev/peerdirect{} that a reset or the removal of the device revoked: \
                     export the memory again and register the new dma-buf there \
                     (pd_register_export_at)",
                    source.source.base_addr(),
                    source.source.dma_buf().length(),
                    device.index()
                ),
            ));
        }
        Ok(Arc::clone(source))
    }

    /// The cache's source for the dma-buf `fd`: its own duplicate, made on first use and
    /// mapped, or named by the caller's `base_addr` (not mapped); known as a foreign export,
    /// or as one of `device`'s (`EINVAL` if `device` did not export it). A dma-buf is
    /// registered one way only: mapped or at one base address (`EINVAL` otherwise).
    ///
    /// `offset` and `length` (0: to the end) are checked first, against the dma-buf's size,
    /// and returned as the range to register: a range that does not fit binds nothing.
    fn fd_source(
        &self,
        function: &str,
        fd: c_int,
        device: Option<&Arc<Device>>,
        base_addr: Option<u64>,
        offset: u64,
        length: u64,
    ) -> Result<(Arc<Source>, ByteRange), Failure> {
        let dma_buf = borrowed_dma_buf(function, fd)?;
        let range = checked_range(function, "dma-buf", dma_buf.length(), offset, length)?;
        // Sources a reset revoked that the new one takes the place of. Declared before the
        // lock so that they are dropped after it: the last reference to a source may close
        // its device, which joins the device's watcher thread and takes the cache's write
        // lock (to stop watching it): work kept out from under the map's lock, which every
        // registration by fd and every lookup miss by address takes.
        let mut replaced = Vec::new();
        let export = match device {
            None => ExportId::foreign(&dma_buf),
            Some(device) => {
                if !exported_by(&dma_buf, device.index()) {
                    return Err(Failure::new(
                        Errno::INVAL,
                        format!(
                            "{function}: fd {fd} is not a dma-buf exported by /dev/peerdirect{}: \
                             register other dma-bufs with pd_register_dmabuf",
                            device.index()
                        ),
                    ));
                }
                device.export_id(&dma_buf)
            }
        }
        .map_err(|errno| Failure::new(errno, format!("{function}: fstat: {errno}")))?;
        let mut foreign = lock(&self.foreign);
        if let Some(source) = foreign.get(&export.dma_buf_inode()) {
            if let Some(device) = device.filter(|d| source.export == export && source.revoked_by(d))
            {
                // Its mapping faults and providers refuse it: forget it (registrations still
                // held keep it until released). One at the caller's addresses stays there, so
                // that lookups of its bytes say it was revoked, until a new dma-buf takes
                // them ([`Shared::publish`]).
                if source.source.is_mapped() {
                    replaced.extend(foreign.remove(&export.dma_buf_inode()));
                }
                self.set_addresses(&foreign);
                return Err(Failure::new(
                    Errno::NODEV,
                    format!(
                        "{function}: fd {fd} is an export of /dev/peerdirect{} made before a \
                         reset or the removal of the device, which revoked it: export the \
                         memory again (pd_export, pd_export_range) and register the new \
                         dma-buf",
                        device.index()
                    ),
                ));
            }
            let known = &source.source;
            let same_base = match base_addr {
                None => known.is_mapped(),
                Some(base) => !known.is_mapped() && known.base_addr() == base,
            };
            if source.export == export && !same_base {
                return Err(Failure::new(
                    Errno::INVAL,
                    format!(
                        "{function}: fd {fd} is registered {} already; register a dma-buf at \
                         one address only (pd_regcache_invalidate_dmabuf() first to change it)",
                        if known.is_mapped() {
                            "through its mapping (pd_register_dmabuf)".to_owned()
                        } else {
                            format!("at base address {:#x}", known.base_addr())
                        }
                    ),
                ));
            }
            if source.export == export {
                return Ok((Arc::clone(source), range));
            }
            // Known under the other identity: registered both ways, each is its own export.
            return Err(Failure::new(
                Errno::INVAL,
                format!(
                    "{function}: fd {fd} is registered with {} already; register a dma-buf one \
                     way only",
                    match (device.is_some(), source.source.is_mapped()) {
                        (true, true) => "pd_register_dmabuf",
                        (true, false) => "pd_register_dmabuf_at",
                        (false, true) => "pd_register_export",
                        (false, false) => "pd_register_export_at",
                    }
                ),
            ));
        }
        // An export of a peerdirect device: its count of resets, read before the dma-buf is
        // first mapped or used (Source::revoked_by_reset).
        let resets = device
            .and_then(|device| device.status())
            .map(|status| status.resets());
        let source = match base_addr {
            None => MappedDmaBuf::new(dma_buf)?.into_source(),
            Some(base) => {
                let source = DmaBufSource::at(dma_buf, base)
                    .map_err(|err| Failure::from(err).prefixed(function))?;
                // Its addresses name it alone: pd_register_addr finds it by them. A dma-buf
                // there that a reset revoked gives them up once this one is registered
                // ([`Shared::publish`]): nothing registers through it any more.
                let end = base + source.dma_buf().length();
                if let Some(other) = foreign
                    .values()
                    .find(|other| !other.revoked() && other.overlaps(base, end))
                {
                    return Err(Failure::new(
                        Errno::INVAL,
                        format!(
                            "{function}: fd {fd} at {base:#x}..{end:#x} overlaps the dma-buf \
                             registered at {:#x} (+{:#x}); one address names one byte: to put \
                             a new dma-buf there, drop the old one first with \
                             pd_regcache_invalidate_dmabuf() (an export registered with \
                             pd_register_export_at gives its addresses up by itself once a \
                             reset or the removal of its device revokes it)",
                            other.source.base_addr(),
                            other.source.dma_buf().length()
                        ),
                    ));
                }
                source
            }
        };
        let mut source = Source::new(source, export, resets);
        if let (Some(device), false) = (device, source.source.is_mapped()) {
            source = source.of(Arc::clone(device));
        }
        let source = Arc::new(source);
        foreign.insert(export.dma_buf_inode(), Arc::clone(&source));
        self.set_addresses(&foreign);
        Ok((source, range))
    }

    /// After a refused registration through `source` (a dma-buf the caller passed by fd):
    /// forgets it if no registration through it ever succeeded and no other call uses it
    /// now, as if the refused call had not been made.
    fn forget_unregistered(&self, source: Arc<Source>) {
        let mut foreign = lock(&self.foreign);
        // The map's reference and this one only: no other call holds it, and none can take
        // it while the lock is held. A call that registered through it set `registered`
        // before letting go of its reference (a release) that this count read.
        if Arc::strong_count(&source) != 2 {
            return;
        }
        fence(Acquire);
        if source.registered.load(Relaxed) {
            return;
        }
        let inode = source.export.dma_buf_inode();
        if foreign
            .get(&inode)
            .is_some_and(|known| Arc::ptr_eq(known, &source))
        {
            foreign.remove(&inode);
            self.set_addresses(&foreign);
        }
    }

    /// Puts `source`, a dma-buf at the caller's addresses through which a registration just
    /// succeeded for the first time, at those addresses: lookups find it from now on (before,
    /// a lookup racing the registration would have registered its own piece of it). A dma-buf
    /// there that a reset revoked leaves: nothing registers through it any more.
    fn publish(&self, source: &Source) {
        if source.source.is_mapped() {
            return;
        }
        let (base, end) = source.addresses();
        let mut foreign = lock(&self.foreign);
        let revoked: Vec<u64> = foreign
            .iter()
            .filter(|(_, other)| other.revoked() && other.overlaps(base, end))
            .map(|(inode, _)| *inode)
            .collect();
        // Dropped once the lock is let go of (see `Shared::fd_source`).
        let replaced: Vec<Arc<Source>> = revoked
            .iter()
            .filter_map(|inode| foreign.remove(inode))
            .collect();
        self.set_addresses(&foreign);
        drop(foreign);
        drop(replaced);
    }

    /// Sets [`Shared::addresses`] from `foreign`, whose lock the caller holds.
    fn set_addresses(&self, foreign: &HashMap<u64, Arc<Source>>) {
        let at: Vec<At> = foreign
            .values()
            .filter(|s| s.at_addresses() && !s.revoked())
            .map(|s| At {
                base: s.source.base_addr(),
                size: s.source.dma_buf().length(),
                export: s.export,
            })
            .collect();
        self.addresses.set(&at);
    }
}

/// `int pd_regcache_set_host_bounce(pd_regcache *cache, int allow)`: whether later
/// registrations the provider refuses as dma-bufs fall back to host bounce (off by default).
/// Registrations already made keep their path.
///
/// # Safety
///
/// `cache` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_set_host_bounce(
    cache: *mut PdRegCache,
    allow: c_int,
) -> c_int {
    const F: &str = "pd_regcache_set_host_bounce";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        let domains = lock(&cache.shared.domains);
        cache.shared.host_bounce.store(allow != 0, Relaxed);
        for registrar in domains.values().filter_map(|d| d.registrar.upgrade()) {
            registrar.set_host_bounce(allow != 0);
        }
        Ok(())
    })
}

/// `int pd_regcache_stats(const pd_regcache *cache, struct pd_regcache_stats *out)`.
///
/// # Safety
///
/// `cache` is NULL or a live handle; `out` is NULL or valid for writing the struct.
#[no_mangle]
pub unsafe extern "C" fn pd_regcache_stats(
    cache: *const PdRegCache,
    out: *mut PdRegcacheStats,
) -> c_int {
    const F: &str = "pd_regcache_stats";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let cache = unsafe { arg(F, "cache", cache) }?;
        let stats = PdRegcacheStats::from(&cache.shared.cache.stats());
        // SAFETY: the caller promises `out` is NULL (refused) or valid for writing.
        unsafe { put(F, "out", out, stats) }
    })
}

/// `void pd_mr_release(pd_mr *mr)`: releases the handle (NULL is ignored); the registration is
/// deregistered once neither the cache nor another handle holds it. A handle in the caller's
/// storage (`pd_register_in`) is dropped there, and the storage may then be used again.
///
/// # Safety
///
/// `mr` is NULL or a handle from `pd_register` or its siblings not released yet; it is not
/// used after.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_release(mr: *mut PdMr) {
    const F: &str = "pd_mr_release";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle, used by nothing else now.
        let Some(handle) = (unsafe { mr.as_ref() }) else {
            return Ok(());
        };
        if handle.boxed {
            // SAFETY: the caller hands back a pointer from `Box::into_raw` in
            // `register_into`, once.
            drop(unsafe { take(F, "mr", mr) }?);
        } else if handle.born.inherited() {
            return Err(inherited(F, "mr"));
        } else {
            // SAFETY: `register_into` wrote a `PdMr` there, which the caller hands back once.
            unsafe { std::ptr::drop_in_place(mr) };
        }
        Ok(())
    });
}

/// Reads a field of a live `pd_mr`, or `default` for NULL.
///
/// # Safety
///
/// `mr` is NULL or a live handle.
unsafe fn with_mr<T: Copy>(
    function: &str,
    mr: *const PdMr,
    default: T,
    f: impl FnOnce(&PdMr) -> T,
) -> T {
    shield(function, default, || {
        // SAFETY: the caller promises NULL or a live handle.
        unsafe { mr.as_ref() }.map_or(default, f)
    })
}

/// `uint64_t pd_mr_key(const pd_mr *mr)`: `fi_mr_key` (0 for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_key(mr: *const PdMr) -> u64 {
    // SAFETY: passed on under the same contract.
    unsafe { with_mr("pd_mr_key", mr, 0, |m| m.registration.mr().key()) }
}

/// `uint32_t pd_mr_lkey(const pd_mr *mr)`: the local key of an ibverbs registration, for
/// `ibv_sge.lkey` (0 for libfabric registrations and for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_lkey(mr: *const PdMr) -> u32 {
    // SAFETY: passed on under the same contract.
    unsafe { with_mr("pd_mr_lkey", mr, 0, |m| m.registration.mr().lkey()) }
}

/// `void *pd_mr_desc(const pd_mr *mr)`: `fi_mr_desc` (NULL for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_desc(mr: *const PdMr) -> *mut c_void {
    // SAFETY: passed on under the same contract.
    unsafe {
        with_mr("pd_mr_desc", mr, std::ptr::null_mut(), |m| {
            m.registration.mr().desc() as *mut c_void
        })
    }
}

/// `uint64_t pd_mr_offset(const pd_mr *mr)`: where the requested range starts in the
/// registration, which may be larger (0 for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_offset(mr: *const PdMr) -> u64 {
    // SAFETY: passed on under the same contract.
    unsafe { with_mr("pd_mr_offset", mr, 0, |m| m.registration.offset_in_mr()) }
}

/// `uint32_t pd_mr_path(const pd_mr *mr)`: `PD_PATH_*` (0 for NULL).
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_path(mr: *const PdMr) -> u32 {
    // SAFETY: passed on under the same contract.
    unsafe {
        with_mr("pd_mr_path", mr, 0, |m| match m.registration.mr().path() {
            RegPath::DmaBuf => abi::PD_PATH_DMABUF,
            RegPath::HostBounce { .. } => abi::PD_PATH_HOST_BOUNCE,
            RegPath::PeerMemVa => abi::PD_PATH_PEERMEM_VA,
        })
    }
}

/// `const char *pd_mr_reason(const pd_mr *mr)`: why the registration is host bounce; NULL
/// when it is direct (or `mr` is NULL). Valid until the handle is released.
///
/// # Safety
///
/// `mr` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_reason(mr: *const PdMr) -> *const std::ffi::c_char {
    // SAFETY: passed on under the same contract.
    unsafe {
        with_mr("pd_mr_reason", mr, std::ptr::null(), |m| {
            m.registration
                .mr()
                .reason()
                .map_or(std::ptr::null(), CStr::as_ptr)
        })
    }
}

/// `void *pd_mr_staging(const pd_mr *mr, uint64_t *length)`: the host staging buffer of a
/// host-bounce registration, which its key and descriptor name, and its length in `*length`
/// (if not NULL); NULL (and 0) when the registration is direct or `mr` is NULL.
///
/// # Safety
///
/// `mr` is NULL or a live handle; `length` is NULL or valid for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_staging(mr: *const PdMr, length: *mut u64) -> *mut c_void {
    // SAFETY: passed on under the same contract.
    let staging = unsafe { with_mr("pd_mr_staging", mr, None, |m| m.registration.mr().staging()) };
    if !length.is_null() {
        let len = staging.map_or(0, |(_, len)| len as u64);
        // SAFETY: not NULL, and the caller promises it is valid for writing.
        unsafe { length.write(len) };
    }
    staging.map_or(std::ptr::null_mut(), |(ptr, _)| ptr.as_ptr().cast())
}

/// `int pd_mr_remote(const pd_mr *mr, int virt_addr, uint64_t *addr, uint64_t *key)`: what a
/// peer needs to reach the requested range with RMA (`fi_read`, `fi_write`): the address of
/// its first byte, virtual when the caller's domain uses `FI_MR_VIRT_ADDR` (`virt_addr`) else
/// the offset from the registration's start (ibverbs: the IOVA, `base_addr` + offset for
/// `pd_register_dmabuf_at`), and the key. `-EOPNOTSUPP` for host bounce (RMA would reach the
/// staging buffer, not HBM).
///
/// # Safety
///
/// `mr` is NULL or a live handle; `addr` and `key` are NULL or valid for writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_remote(
    mr: *const PdMr,
    virt_addr: c_int,
    addr: *mut u64,
    key: *mut u64,
) -> c_int {
    const F: &str = "pd_mr_remote";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let mr = unsafe { arg(F, "mr", mr) }?;
        // Bad arguments first, whatever the registration.
        if addr.is_null() {
            return Err(Failure::null(F, "addr"));
        }
        if key.is_null() {
            return Err(Failure::null(F, "key"));
        }
        let registration = &mr.registration;
        let remote = registration
            .mr()
            .remote(registration.offset_in_mr(), virt_addr != 0)
            .ok_or_else(|| {
                Failure::new(
                    Errno::OPNOTSUPP,
                    "pd_mr_remote: the registration is a host bounce (see pd_mr_reason): a peer's RMA would reach the staging buffer, not HBM; use tagged messages, or a provider that takes FI_MR_DMABUF",
                )
            })?;
        // SAFETY: the caller promises each is NULL (refused) or valid for writing.
        unsafe { put(F, "addr", addr, remote.addr) }?;
        // SAFETY: as above.
        unsafe { put(F, "key", key, remote.key) }
    })
}

/// `int pd_mr_local(const pd_mr *mr, void **addr, uint64_t *length)`: the local address of
/// the requested range's first byte and its length: the `buf` (with `pd_mr_desc`) of the
/// caller's own operations on it. `-EOPNOTSUPP` for host bounce (the descriptor names the
/// staging buffer: `pd_mr_staging`).
///
/// # Safety
///
/// `mr` is NULL or a live handle; `addr` is NULL or valid for writing a pointer, `length` for
/// writing a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn pd_mr_local(
    mr: *const PdMr,
    addr: *mut *mut c_void,
    length: *mut u64,
) -> c_int {
    const F: &str = "pd_mr_local";
    guard_status(F, || {
        // SAFETY: the caller promises NULL or a live handle.
        let mr = unsafe { arg(F, "mr", mr) }?;
        if addr.is_null() {
            return Err(Failure::null(F, "addr"));
        }
        if length.is_null() {
            return Err(Failure::null(F, "length"));
        }
        let registration = &mr.registration;
        let (start, _) = registration.mr().local().ok_or_else(|| {
            Failure::new(
                Errno::OPNOTSUPP,
                "pd_mr_local: the registration is a host bounce (see pd_mr_reason): its descriptor names the staging buffer; post operations on pd_mr_staging() and copy HBM through it",
            )
        })?;
        // Inside the registration: no overflow.
        let first = start.wrapping_add(registration.offset_in_mr()) as *mut c_void;
        // SAFETY: the caller promises each is NULL (refused) or valid for writing.
        unsafe { put(F, "addr", addr, first) }?;
        // SAFETY: as above.
        unsafe { put(F, "length", length, registration.requested().length()) }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_must_be_known_bits() {
        let access = |bits| checked_access("pd_register_addr", bits);
        assert_eq!(access(0xf).unwrap(), Access::all());
        assert_eq!(access(8).unwrap(), Access::REMOTE_WRITE);
        assert!(access(0).is_err());
        let refused = access(0x10).unwrap_err();
        assert_eq!(
            refused.message(),
            "pd_register_addr: access 0x10: give one or more PD_ACCESS_* and nothing else"
        );
    }

    #[test]
    fn ranges_stay_inside_the_allocation() {
        let range = |size, offset, length| checked_range("f", "allocation", size, offset, length);
        let r = range(1 << 20, 4096, 0).unwrap();
        assert_eq!((r.offset(), r.length()), (4096, (1 << 20) - 4096));
        assert_eq!(range(8192, 0, 8192).unwrap().length(), 8192);
        assert!(range(8192, 8192, 0).is_err()); // empty
        assert!(range(8192, u64::MAX, 2).is_err());
        let refused = checked_range("pd_register_dmabuf", "dma-buf", 8192, 4096, 8192);
        assert_eq!(
            refused.unwrap_err().message(),
            "pd_register_dmabuf: 8192 bytes at offset 4096 do not fit in the 8192-byte dma-buf"
        );
    }

    /// libfabric's own error numbers reach C as errno values: `FI_ENOKEY` (266) as
    /// `-ENOKEY`, not -266, which `strerror` calls "Unknown error 266".
    #[test]
    fn libfabric_errors_reach_c_as_errno_values() {
        let call = |errno| LibfabricError::Call {
            provider: "tcp".into(),
            call: "fi_mr_regattr",
            errno,
            text: "libfabric's text".into(),
        };
        assert_eq!(Failure::from(call(266)).code(), -126); // ENOKEY
        assert_eq!(Failure::from(call(270)).code(), -14); // EFAULT
        assert_eq!(Failure::from(call(11)).code(), -11); // EAGAIN

        // FI_MR_ENDPOINT: no endpoint named, a bind or enable refused, the endpoint in use.
        let provider = || "cxi".to_owned();
        let none = LibfabricError::NoEndpoint {
            provider: provider(),
        };
        assert_eq!(Failure::from(none).code(), -77); // EBADFD
        let bind = LibfabricError::EndpointBind {
            provider: provider(),
            call: "fi_mr_enable",
            errno: 258, // FI_EOPBADSTATE
            text: "libfabric's text".into(),
            mode_known: true,
        };
        assert_eq!(Failure::from(bind).code(), -77); // EBADFD
        let busy = LibfabricError::EndpointBusy {
            provider: provider(),
            registrations: 2,
        };
        assert_eq!(Failure::from(busy).code(), -16); // EBUSY

        // A revoked export, a transfer on revoked HBM, an operation completed in error.
        let revoked = LibfabricError::Revoked {
            provider: provider(),
            call: "fi_mr_regattr(FI_MR_DMABUF)",
            errno: 19,
            text: "No such device".into(),
            hbm_device: 0,
        };
        assert_eq!(Failure::from(revoked).code(), -19); // ENODEV
        let transfer = LibfabricError::TransferRevoked {
            provider: provider(),
            hbm_device: 0,
        };
        assert_eq!(Failure::from(transfer).code(), -19); // ENODEV
        let completion = LibfabricError::Completion {
            provider: provider(),
            call: "fi_read",
            errno: 265, // FI_ETRUNC
            text: "libfabric's text".into(),
            prov_errno: 10,
            prov_text: Some("remote access error".into()),
        };
        let text = completion.to_string();
        assert!(
            text.ends_with("the provider says: remote access error (10)"),
            "{text}"
        );
        assert_eq!(Failure::from(completion).code(), -90); // EMSGSIZE
    }
}
