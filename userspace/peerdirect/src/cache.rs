//! The registration cache: registering memory with a NIC costs tens of microseconds to
//! milliseconds, so registrations are kept and handed out again, to any request inside one.
//!
//! [`RegCache`] is generic over what registers: a [`Registrar`] (libfabric with
//! `FI_MR_DMABUF`, ibverbs `ibv_reg_dmabuf_mr`, host bounce) makes and releases memory
//! regions; the cache decides when. A request is served by a cached registration of the same
//! domain and export whose range contains the request's and whose access includes it.
//!
//! ```
//! use std::sync::Arc;
//! use peerdirect::cache::{Access, ByteRange, CacheLimits, DomainId, ExportId, RegCache, RegKey, Registrar};
//!
//! /// Stands in for a NIC: a registration is a number.
//! struct Nic;
//!
//! impl Registrar for Nic {
//!     type Source = (); // what `register` reads the memory from, e.g. a `DmaBuf`
//!     type Mr = u64;
//!     type Error = std::convert::Infallible;
//!     fn domain(&self) -> DomainId {
//!         DomainId(1)
//!     }
//!     fn register(&self, _: &(), key: &RegKey) -> Result<u64, Self::Error> {
//!         Ok(key.range.offset() ^ 0x5eed)
//!     }
//!     fn deregister(&self, _: u64) {}
//! }
//!
//! let cache = RegCache::new(CacheLimits::default()); // or RegCache::from_env()?
//! let nic = Arc::new(Nic);
//! let export = ExportId::new(0, 1234); // device 0, the dma-buf's inode number
//! let whole = cache.get(&nic, &(), export, ByteRange::new(0, 8 << 20)?, Access::all())?;
//! let part = cache.get(&nic, &(), export, ByteRange::new(1 << 20, 4096)?, Access::REMOTE_WRITE)?;
//! assert_eq!(part.mr(), whole.mr()); // served by the first registration
//! assert_eq!(part.offset_in_mr(), 1 << 20);
//! assert_eq!((cache.stats().misses, cache.stats().hits), (1, 1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Cost
//!
//! With n cached entries, one read-write lock guards the index and the recency list; the
//! registrar is called outside it, so misses in different threads register in parallel.
//! The lock is crossbeam's `ShardedLock` (`cache/lock.rs`): a reader locks one of eight
//! shards, picked by its thread, instead of a word every reader shares.
//! - Hit: under the read lock only, so hits in different threads never wait for each other:
//!   one atomic load of each attached status page of the export's device, a hash lookup of
//!   the export, then per (domain, access) group of that export whose access suffices
//!   (typically one or two) the predecessor in a sorted vector, counted through up to 16
//!   entries and binary-searched beyond: O(log n), exact (see `cache/index.rs` for why the
//!   predecessor is enough), and the index points to the entry itself, so the recency list
//!   is not read. The hit is `get` itself, inlined; the miss is a call. Recency is a mark on
//!   the entry (an atomic flag, written only when it changes) and the hit count a per-thread
//!   stripe, and the handle a *pin* in a line of the thread's own (`cache/pin.rs`) instead of
//!   a count on the entry, so a hit writes no line that other threads' hits write, and makes
//!   no locked instruction but its shard's read lock and unlock (and a count when the
//!   thread's eight pins are in use). Dropping a pinned handle empties its pin with
//!   one locked instruction on that line.
//! - Eviction is CLOCK, an approximation of LRU that needs nothing from hits but the mark
//!   (and the pins, which a miss that evicts reads: one line per thread that has a slot):
//!   entries sit in insertion order; eviction passes them from the oldest, and one marked
//!   since it was last passed gets a second chance (moves to the newest end, unmarked)
//!   instead of going. An entry hit since the last eviction is evicted only after every entry
//!   that was not; among entries not hit, the oldest goes first. Amortised O(1) per eviction.
//! - Miss: the export's turn (misses of one export take turns, so that a storm of them
//!   registers once and the others hit), the search again, the registration, then under the
//!   write lock O(log n) to drop the k entries the new one
//!   contains and for each of the e evicted entries, and O(log n) to insert:
//!   O((1 + k + e) log n), plus moving the vector elements after each. In the steady state
//!   a miss allocates nothing: its entry takes the allocation of the one it evicted, what it
//!   dropped is listed inline unless it dropped more than one, the index reuses emptied
//!   vectors and eviction its list of victims. Eviction
//!   passes over the h entries in use that are older than the last one it evicts: O(h k)
//!   more. Entries in use are never evicted (as libfabric keeps them off its LRU list); when
//!   the limits leave no room for a new entry without evicting one, it is handed out
//!   uncached ([`Uncached::Full`]).
//! - Invalidating an export: O(k log n) for its k entries; a domain or a device: also a visit
//!   of every cached export.
//!
//! Entries the cache drops (evicted, superseded, invalidated) are deregistered outside the
//! lock, by the thread that dropped them, or later by whoever drops the last handle to them.
//!
//! # Freed and revoked memory
//!
//! A cached registration keeps its dma-buf, and so its HBM, alive, and must never be handed
//! out once the caller has freed the allocation or the device is gone. A cache in an `Arc`
//! [attaches](RegCache::attach) to every [`crate::Device`] whose exports it registers; the
//! device then invalidates, before `PEERDIRECT_IOC_FREE` of an allocation (an
//! [`crate::Allocation`] dropped or freed, [`crate::Device::free_raw`]) and before its file is
//! closed, every entry of every export made from that allocation through it, in every
//! attached cache; and every entry of the device when one of its commands fails with
//! `ENODEV` (revoked). The cache also watches each attached device's status page: once the
//! module has started revoking the device (unbind, removal, unload), or once it counts a reset
//! of the device that the entries were registered before (which revoked their exports), a
//! request for any of its exports drops all of the device's entries before one could be
//! handed out, with no system call on the hit path. Name exports with [`crate::Device::export_id`] so that the
//! identities agree. See [`crate::invalidation`].
//!
//! Whoever handed a registration's key to peers must take it back when its memory goes: a
//! [listener](RegCache::set_listener) is told once about every registration whose export,
//! device or domain is invalidated ([`Cause`]), cached or only held by handles (uncached,
//! superseded), before the cache lets go of it. The index finds the cached ones; for the others
//! the cache keeps a weak list of those handed out uncached and of those superseded while a
//! handle held them: O(1) for each, nothing for a registration that is cached and leaves the
//! cache idle, and each invalidation visits the list.
//! A registration made while an invalidation ran is handed out uncached
//! ([`Uncached::Invalidated`]) without telling the listener: that invalidation may have been of
//! other memory, so the caller decides from `uncached()`.

mod addresses;
mod index;
mod key;
mod lent;
mod limits;
mod lock;
mod lru;
#[cfg(all(test, loom))]
mod models;
mod notify;
mod pin;
#[cfg(test)]
mod point;
mod slot;
mod stripes;
mod sync;
#[cfg(test)]
mod tests;
mod turns;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use serde::Serialize;

pub use crate::invalidation::ExportId;
use crate::invalidation::Invalidate;
use crate::{Device, DeviceStatus};
pub use addresses::AddressTable;
use index::Index;
pub use key::{Access, ByteRange, DomainId, RangeError, RegKey};
use lent::Lent;
pub use limits::{CacheLimits, LimitsError, MAX_COUNT_VAR, MAX_SIZE_VAR};
use lock::{Lock, ReadGuard, WriteGuard};
use lru::{Lru, Slot};
use notify::{Delivery, Notifier};
use pin::{Held, Pinned};
use stripes::Stripes;
use turns::Turns;

/// Makes and releases registrations (memory regions) in one domain.
pub trait Registrar: Send + Sync + 'static {
    /// What [`Registrar::register`] finds the memory in, e.g. a [`crate::DmaBuf`]. The cache
    /// only passes it through: it must be the export that the key's [`ExportId`] names.
    type Source: ?Sized;
    /// A registration, e.g. an `fid_mr` or an `ibv_mr`.
    type Mr: Send + Sync + 'static;
    /// Why a registration failed.
    type Error;

    /// The domain its registrations live in. Must not change.
    fn domain(&self) -> DomainId;

    /// Registers `key.range` of `source` with `key.access`. Called outside the cache's
    /// locks, during the turn that misses of `key.export` take, which other threads' misses
    /// of it wait for: it may call the cache itself (a request of any export, which then
    /// registers on its own rather than wait for a turn; an invalidation), but must not wait
    /// for another thread that requests `key.export`.
    fn register(&self, source: &Self::Source, key: &RegKey) -> Result<Self::Mr, Self::Error>;

    /// Releases `mr`. Called exactly once for each registration, when neither the cache nor
    /// any [`Registration`] handle holds it any more.
    fn deregister(&self, mr: Self::Mr);

    /// Told that `mr`, registered for `key`, is invalidated for `cause`, as soon as the cache
    /// knows (on the thread that invalidates it, before the listener is told, outside the
    /// cache's lock), while [`Registration`] handles may still hold it: a registrar whose
    /// transfers wait on the registration's memory can stop waiting for memory that is gone
    /// ([`Cause::Device`]: revoked by the kernel). May be told more than once; must not call
    /// into the cache. Does nothing unless implemented.
    fn invalidated(&self, key: &RegKey, mr: &Self::Mr, cause: Cause) {
        let _ = (key, mr, cause);
    }
}

/// Where the limits meet the reasons a registration is not cached (here, so that the limits'
/// module needs nothing of this one).
impl CacheLimits {
    /// Why a registration of `length` bytes would not be cached under these limits
    /// ([`Uncached::Disabled`] or [`Uncached::TooLarge`]); `None` if it can be, room
    /// permitting. A caller choosing what to register (a runtime's whole pool, or the buffer
    /// it asked for) asks it before registering more than it needs.
    #[inline]
    pub fn uncached(&self, length: u64) -> Option<Uncached> {
        if self.max_count == 0 {
            Some(Uncached::Disabled)
        } else if length > self.max_bytes {
            Some(Uncached::TooLarge)
        } else {
            None
        }
    }
}

/// [`RegCache::get_from`]'s contract: `export` is of `device`.
#[track_caller]
fn exported_by(export: ExportId, device: &Device) {
    assert_eq!(
        export.device(),
        device.index(),
        "RegCache::get_from: {export:?} is not an export of /dev/peerdirect{}: the cache would \
         watch the wrong device; make it with that device's export_id",
        device.index()
    );
}

/// Why a registration was handed out without being cached. It is deregistered when its last
/// handle is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Uncached {
    /// The cache's `max_count` is 0.
    Disabled,
    /// The range is larger than the cache's `max_bytes`.
    TooLarge,
    /// An invalidation ran while it was being registered, of this memory or maybe of other
    /// memory (the cache does not tell them apart): it might belong to memory that is going
    /// away.
    Invalidated,
    /// The cache is full of registrations in use: only entries no [`Registration`] holds are
    /// evicted, and too few of them would go to make room.
    Full,
}

/// Why registrations were invalidated ([`Invalidated::cause`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// Their memory is going: the allocation it came from is being freed, or the caller
    /// invalidated the export ([`RegCache::invalidate_export`]).
    Memory,
    /// Their device is gone: unbound, removed or reset, its dma-bufs revoked
    /// ([`RegCache::invalidate_device`], or the module's revocation seen by an attached cache).
    Device,
    /// Their domain is going ([`RegCache::invalidate_domain`]).
    Domain,
}

/// A registration whose memory, device or domain is going, as told to an invalidation
/// listener ([`RegCache::set_listener`]).
pub struct Invalidated<'a, R: Registrar> {
    /// What is registered.
    pub key: &'a RegKey,
    /// The registration: its key is what peers were given and must stop using.
    pub mr: &'a R::Mr,
    /// Why.
    pub cause: Cause,
    /// Whether a [`Registration`] handle still holds it: it stays registered until the last
    /// one is dropped (else it is deregistered right after the listener returns).
    pub held: bool,
}

/// Told once about every registration of the cache (cached, or only held by handles) whose
/// memory, device or domain goes.
///
/// Called on the cache's own thread (`peerdirect-tell`, started at the first invalidation
/// with a listener), one call at a time, never on a thread that calls into the cache, so
/// never with the cache's lock or a lock of the caller's held:
/// - what a request, a command failing with `ENODEV` or the device's watcher discovers (a
///   revoked or reset device) is queued; the request returns without waiting;
/// - an explicit invalidation ([`RegCache::invalidate_export`], `_device`, `_domain`, a free
///   through the crate) returns once the listener has been told and the registrations no
///   handle holds are deregistered: do not make one holding a lock the listener takes.
///
/// The listener may call into the cache: what that invalidates is told at once, nested.
/// [`RegCache::set_listener`] returns once no call of the listener it replaces runs or is
/// queued; [`RegCache::wait_told`] waits for what is queued.
///
/// A listener must not panic. If it does, the registrations of that invalidation not told yet
/// are not told (and are deregistered all the same, unless held); the panic resumes in the
/// explicit invalidation that waited for it, or is printed on standard error for a queued one;
/// the cache stays usable. A registrar that panics deregistering them is reported the same
/// way, after the listener, as a panic of its own ("deregistering an invalidated registration
/// panicked (a bug in the registrar): ..."); with the listener's panic too, the listener's
/// goes on and the registrar's is printed.
pub type Listener<R> = Arc<dyn Fn(&Invalidated<'_, R>) + Send + Sync>;

/// What a [`RegCache`] did so far. Each counter is exact; a snapshot of several is not taken
/// atomically.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CacheStats {
    /// Requests served by a cached registration.
    pub hits: u64,
    /// Requests that had to register.
    pub misses: u64,
    /// Successful registrations.
    pub registrations: u64,
    /// Registrations the registrar refused (or panicked in).
    pub failed_registrations: u64,
    /// Deregistrations. `registrations - deregistrations` registrations are alive: cached,
    /// or held by handles.
    pub deregistrations: u64,
    /// Entries dropped as least recently used to make room.
    pub evictions: u64,
    /// Entries dropped because a new one contains them (same domain and export, no more
    /// access).
    pub superseded: u64,
    /// Entries dropped by `invalidate_*`.
    pub invalidations: u64,
    /// Registrations handed out without caching them ([`Uncached`]).
    pub uncached: u64,
    /// Entries cached now.
    pub entries: u64,
    /// Bytes the cached entries cover now.
    pub bytes: u64,
    /// The limit on `entries`.
    pub max_count: u64,
    /// The limit on `bytes`.
    pub max_bytes: u64,
    /// Times the cache's lock was taken for writing (a miss, an eviction, an invalidation,
    /// the first attach of a device; never a hit): each waits for every reader and locks
    /// every shard.
    pub writes: u64,
}

/// A thread-safe cache of registrations made by registrars of type `R`, bounded by a number
/// of entries and a number of bytes ([`CacheLimits`]), evicting the least recently used
/// approximately (CLOCK).
pub struct RegCache<R: Registrar> {
    limits: CacheLimits,
    /// Read-held by hits, write-held by everything that changes what is cached. A read locks
    /// a shard of the reading thread's ([`lock`]): hits in different threads write no common
    /// line.
    state: Lock<State<R>>,
    counters: Arc<Counters>,
    /// Hits, counted by each thread in the stripe of its [`slot`] (summed by `stats`), so
    /// that hits in different threads do not write one cache line, and a thread that owns a
    /// slot counts without a locked instruction.
    hits: Stripes,
    /// Tells the listener, on a thread of its own ([`Listener`]).
    notifier: Notifier<Listener<R>>,
    /// Taken by misses, by export ([`RegCache::miss`]).
    turns: Turns,
}

/// What the index holds of a cached entry: where it is on the recency list, and a pointer
/// to it lent from the list's reference ([`lent`]), so that a hit goes from the index to the
/// entry without the list (one dependent load less, 7 ns of a hit's 88 where that was
/// measured) and a miss does not pay for a second reference.
type Cached<R> = (Slot, Lent<Entry<R>>);

/// What [`RegCache::invalidate_domain`] and [`RegCache::invalidate_domain_unless_held`] take
/// out of the index: `domain`'s entries.
fn remove_domain<V>(domain: DomainId) -> impl FnOnce(&mut Index<V>, &mut Vec<V>) {
    move |index, removed| index.remove_where(|_, d| d == domain, removed)
}

/// How many references the cache itself holds to an entry it caches: the recency list's. An
/// entry with no more is idle: no [`Registration`] holds it.
const CACHE_REFERENCES: usize = 1;

/// What a request or `stats` panics with when the lock is poisoned (see [`RegCache::read`]).
const POISONED: &str = "a thread panicked while updating the registration cache";

/// What the lock guards.
///
/// Every entry the index points to is on the recency list, which holds the cache's reference
/// to it ([`Lent`]): the two change together, under the write lock.
struct State<R: Registrar> {
    index: Index<Cached<R>>,
    lru: Lru<Arc<Entry<R>>>,
    bytes: u64,
    /// Bumped by every invalidation, so that a miss can tell whether one happened while it
    /// was registering.
    epoch: u64,
    evictions: u64,
    superseded: u64,
    invalidations: u64,
    /// The status pages of the device files attached with [`RegCache::attach`], by device
    /// index; each let go of when its file is being closed ([`Invalidate::file_closing`],
    /// under the write lock), since a mapping keeps its file open. So a hit reads a page it
    /// holds with two atomic loads, under the read lock.
    watched: Vec<Watched>,
    /// The registrations that only handles may hold: handed out uncached, or superseded or
    /// invalidated while held. (The index has the cached ones; an evicted one was idle.) An
    /// invalidation tells the listener about those of them it affects and was not told yet;
    /// [`State::held`] counts them all. Pruned of dead ones as it grows.
    live: Vec<Weak<Entry<R>>>,
    /// `live.len()` after the last pruning.
    live_pruned: usize,
    /// The slots [`State::make_room`] picks to evict, kept between misses for its capacity.
    evicting: Vec<Slot>,
    /// The entries pinned by handles ([`pin`]), as a writer saw them; kept for its capacity.
    pinned: Pinned,
    /// The bindings of the registrars whose registrations live, by the registrar's address:
    /// held weakly, so that a binding goes with its registrar's last registration.
    bindings: Vec<(usize, Weak<Binding<R>>)>,
}

/// Counted outside the lock, some of them when an entry is dropped. Those of every miss in
/// the stripes of the counting threads' slots, like hits.
#[derive(Default)]
struct Counters {
    registrations: Stripes,
    failed_registrations: AtomicU64,
    deregistrations: Stripes,
    uncached: AtomicU64,
    /// Times the state was locked for writing.
    writes: AtomicU64,
}

/// What the registrations of one registrar share: the registrar, which deregisters them, and
/// the cache's counters, which count that. An entry holds one reference to this instead of
/// one to each: two locked instructions less per miss (one when it is made, one when it goes).
struct Binding<R: Registrar> {
    registrar: Arc<R>,
    counters: Arc<Counters>,
}

/// One registration; deregistered when the last `Arc` to it goes.
struct Entry<R: Registrar> {
    key: RegKey,
    /// Taken only by `drop`.
    mr: Option<R::Mr>,
    binding: Arc<Binding<R>>,
    uncached: Option<Uncached>,
    /// Set when the listener has been told that it is invalidated.
    told: AtomicBool,
    /// Set by a hit, cleared when eviction passes the entry over once for it (the second
    /// chance of the CLOCK algorithm): hits only read-lock the cache and write this.
    referenced: AtomicBool,
}

impl<R: Registrar> Entry<R> {
    fn new(key: RegKey, mr: R::Mr, binding: Arc<Binding<R>>, uncached: Option<Uncached>) -> Self {
        Self {
            key,
            mr: Some(mr),
            binding,
            uncached,
            told: AtomicBool::new(false),
            referenced: AtomicBool::new(false),
        }
    }
}

impl<R: Registrar> Drop for Entry<R> {
    fn drop(&mut self) {
        if let Some(mr) = self.mr.take() {
            release(&*self.binding.registrar, &self.binding.counters, mr);
        }
    }
}

/// Deregisters `mr` and counts it.
fn release<R: Registrar>(registrar: &R, counters: &Counters, mr: R::Mr) {
    registrar.deregister(mr);
    counters.deregistrations.add(slot::current());
}

/// A handle to a registration that serves a request. The registration stays registered at
/// least as long as a handle to it exists, even after the cache evicted or invalidated it.
pub struct Registration<R: Registrar> {
    /// Pinned when a hit made it, so that it writes no line other threads' hits write
    /// ([`pin`]); else counted.
    entry: Held<Entry<R>>,
    requested: ByteRange,
}

impl<R: Registrar> Registration<R> {
    /// The registration (memory region).
    pub fn mr(&self) -> &R::Mr {
        self.entry
            .mr
            .as_ref()
            .expect("taken only when the entry is dropped")
    }

    /// What is registered: it may be more than was asked for, in range and in access.
    pub fn key(&self) -> &RegKey {
        &self.entry.key
    }

    /// The range that was asked for.
    pub fn requested(&self) -> ByteRange {
        self.requested
    }

    /// Where the requested range starts in the registration: add it to the registration's
    /// base address or offset when posting work requests.
    pub fn offset_in_mr(&self) -> u64 {
        self.requested.offset() - self.entry.key.range.offset()
    }

    /// Why the registration is not cached, if it never was.
    pub fn uncached(&self) -> Option<Uncached> {
        self.entry.uncached
    }

    /// The same handle, serving `range` instead of the range it was asked for: for a caller
    /// that registered more than one request needs (a runtime's whole pool, for one buffer
    /// in it) and hands the registration out for that buffer, whose
    /// [`Registration::offset_in_mr`] is then the buffer's. `Err(self)` unless the
    /// registration covers `range`.
    pub fn narrowed(self, range: ByteRange) -> Result<Self, Self> {
        if self.entry.key.range.contains(range) {
            Ok(Self {
                requested: range,
                ..self
            })
        } else {
            Err(self)
        }
    }
}

impl<R: Registrar> Clone for Registration<R> {
    fn clone(&self) -> Self {
        Self {
            entry: self.entry.clone(),
            requested: self.requested,
        }
    }
}

impl<R: Registrar> fmt::Debug for Registration<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("key", &self.entry.key)
            .field("requested", &self.requested)
            .field("uncached", &self.entry.uncached)
            .finish_non_exhaustive()
    }
}

impl<R: Registrar> RegCache<R> {
    /// An empty cache that holds at most `limits`.
    pub fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            state: Lock::new(State {
                index: Index::default(),
                lru: Lru::new(),
                bytes: 0,
                epoch: 0,
                evictions: 0,
                superseded: 0,
                invalidations: 0,
                watched: Vec::new(),
                live: Vec::new(),
                live_pruned: 0,
                evicting: Vec::new(),
                pinned: Pinned::default(),
                bindings: Vec::new(),
            }),
            counters: Arc::default(),
            hits: Stripes::default(),
            notifier: Notifier::default(),
            turns: Turns::default(),
        }
    }

    /// Tells `listener` (from now on; `None`: nobody) about every registration whose memory,
    /// device or domain goes, once each, whether the cache still had it or only handles did.
    /// Returns once no call of the listener it replaces runs or is queued (except when called
    /// from that listener, which cannot wait for itself). The cache keeps the listener until
    /// it is replaced: one that holds the cache's `Arc` keeps the cache, and its
    /// registrations, alive for good; hold a `Weak` instead.
    pub fn set_listener(&self, listener: Option<Listener<R>>) {
        self.notifier.set(listener);
    }

    /// Returns once the listener has been told of every invalidation made before the call,
    /// and the registrations no handle holds are deregistered. Invalidations that requests,
    /// failed commands and the device watcher discover are told on the cache's thread
    /// without their finder waiting ([`Listener`]); this waits for them.
    pub fn wait_told(&self) {
        self.notifier.wait_told();
    }

    /// An empty cache with the limits of [`MAX_COUNT_VAR`] and [`MAX_SIZE_VAR`]
    /// ([`CacheLimits::from_env`]).
    pub fn from_env() -> Result<Self, LimitsError> {
        CacheLimits::from_env().map(Self::new)
    }

    /// Its limits.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// A registration of `range` of `export` in `registrar`'s domain with at least `access`:
    /// a cached one that contains it, or a new one from `registrar.register(source, ..)`,
    /// which is then cached unless [`Registration::uncached`] says why not.
    ///
    /// `source` must be the export that `export` names.
    #[inline]
    pub fn get(
        &self,
        registrar: &Arc<R>,
        source: &R::Source,
        export: ExportId,
        range: ByteRange,
        access: Access,
    ) -> Result<Registration<R>, R::Error> {
        match self.look_up(registrar, export, range, access, None) {
            Lookup::Hit(registration) => Ok(registration),
            Lookup::Miss(key, bypass, seen) => self.miss(registrar, source, key, bypass, seen),
            Lookup::Unwatched => unreachable!("a lookup that names no device finds it watched"),
        }
    }

    /// The cached registration that [`RegCache::get`] of the same request would hand out, or
    /// `None` where it would register (or bypass the cache): a lookup that never calls the
    /// registrar, for a caller that finds the request's source only when it must register.
    /// A hit costs what one through `get` does, and is counted as one.
    #[inline]
    pub fn get_cached(
        &self,
        registrar: &Arc<R>,
        export: ExportId,
        range: ByteRange,
        access: Access,
    ) -> Option<Registration<R>> {
        match self.look_up(registrar, export, range, access, None) {
            Lookup::Hit(registration) => Some(registration),
            Lookup::Miss(..) | Lookup::Unwatched => None,
        }
    }

    /// [`RegCache::get`] of an export of `device`, attaching the cache to `device` first if
    /// it is not ([`RegCache::attach`]), as the C ABI does at every registration: whether it
    /// is attached is read under the lookup's own read lock, so that a hit through this costs
    /// what one through `get` does. A device file without a status page (a module older than
    /// the crate) has nothing to read it in: every call attaches again (a no-op that takes the
    /// device's locks), and its hits cost several times more.
    ///
    /// # Panics
    ///
    /// If it would register or attach for an `export` that is not of `device`
    /// ([`ExportId::device`] is not [`Device::index`]): the cache would watch the wrong device,
    /// and a reset of the export's own would leave its registration cached. Build `export`
    /// with `device.export_id`. A hit is handed out without the check, as `get` hands it.
    #[inline]
    pub fn get_from(
        self: &Arc<Self>,
        device: &Device,
        registrar: &Arc<R>,
        source: &R::Source,
        export: ExportId,
        range: ByteRange,
        access: Access,
    ) -> Result<Registration<R>, R::Error>
    where
        R: 'static,
    {
        let Some(status) = device.status_page() else {
            // No status page (an older module): nothing to watch, so nothing tells whether
            // the cache subscribed; subscribing again is a no-op.
            exported_by(export, device);
            self.attach(device);
            return self.get(registrar, source, export, range, access);
        };
        match self.look_up(registrar, export, range, access, Some(status)) {
            Lookup::Hit(registration) => Ok(registration),
            Lookup::Miss(key, bypass, seen) => {
                exported_by(export, device);
                self.miss(registrar, source, key, bypass, seen)
            }
            Lookup::Unwatched => {
                exported_by(export, device);
                self.attach(device);
                self.get(registrar, source, export, range, access)
            }
        }
    }

    /// [`RegCache::get_from`]'s lookup only, which never registers nor attaches: the
    /// registration if the cache watches `device` (as `get_from` leaves it) and holds one that
    /// serves the request; `None` otherwise, for `get_from` to do the rest.
    #[inline]
    pub fn get_cached_from(
        &self,
        device: &Device,
        registrar: &Arc<R>,
        export: ExportId,
        range: ByteRange,
        access: Access,
    ) -> Option<Registration<R>> {
        let status = device.status_page()?;
        match self.look_up(registrar, export, range, access, Some(status)) {
            Lookup::Hit(registration) => Some(registration),
            Lookup::Miss(..) | Lookup::Unwatched => None,
        }
    }

    /// The lookup of [`RegCache::get`] and [`RegCache::get_from`]: a hit, or what a miss
    /// needs; with `watching`, [`Lookup::Unwatched`] if the cache does not watch that status
    /// page (under the same read lock).
    #[inline(always)]
    fn look_up(
        &self,
        registrar: &Arc<R>,
        export: ExportId,
        range: ByteRange,
        access: Access,
        watching: Option<&DeviceStatus>,
    ) -> Lookup<R> {
        let key = RegKey {
            domain: registrar.domain(),
            export,
            range,
            access,
        };
        let bypass = self.limits.uncached(range.length());
        let seen = match bypass {
            // No cached entry can serve it: skip the lookup.
            Some(_) => {
                if let Some(status) = watching {
                    if !self.read().watches(status) {
                        return Lookup::Unwatched;
                    }
                }
                Seen::default()
            }
            None => {
                let slot = slot::current();
                let read = self.read();
                if let Some(status) = watching {
                    if !read.watches(status) {
                        return Lookup::Unwatched;
                    }
                }
                let (hit, seen) = if read.stale(export.device()) {
                    drop(read);
                    self.find_stale(&key)
                } else {
                    (read.hold(&key, slot), read.seen())
                };
                if let Some(entry) = hit {
                    self.hits.add(slot);
                    return Lookup::Hit(Registration {
                        entry,
                        requested: range,
                    });
                }
                seen
            }
        };
        Lookup::Miss(key, bypass, seen)
    }

    /// [`RegCache::get`]'s lookup when `key`'s device is being revoked or was reset: its
    /// entries go before any is handed out.
    #[cold]
    fn find_stale(&self, key: &RegKey) -> (Option<Held<Entry<R>>>, Seen) {
        let mut doomed = Vec::new();
        let mut state = self.write();
        let passed = state.drop_stale(key.export.device(), &mut doomed);
        let found = (state.hold(key, slot::current()), state.seen());
        drop(state);
        drop(passed);
        self.tell(doomed, Cause::Device, Delivery::Queue);
        found
    }

    /// [`RegCache::get`] when no cached entry served `key` (looked up as `seen`, unless
    /// `bypass` says why not): registers it and caches the registration if it can. Out of
    /// line, so that a hit's code is short.
    ///
    /// Misses of one export take turns, as libfabric's and UCX's caches make theirs: the
    /// first registers and caches, and those that waited for it look again and find its entry
    /// if it serves them, instead of each registering the same memory with the provider (a
    /// NIC's registration pins and maps it). A miss looks again once it has its turn, so no
    /// entry that serves it can be cached while it registers. Requests that bypass the cache
    /// register on their own, without turns, and so do those of threads that may be waited
    /// for ([`Turns`]) where they would wait.
    #[inline(never)]
    fn miss(
        &self,
        registrar: &Arc<R>,
        source: &R::Source,
        key: RegKey,
        bypass: Option<Uncached>,
        seen: Seen,
    ) -> Result<Registration<R>, R::Error> {
        let RegKey {
            export,
            range,
            access,
            ..
        } = key;
        let turn = match bypass {
            Some(_) => None,
            None => self.turns.take(export),
        };
        let seen = match turn {
            None => seen,
            Some(_) => match self.look_up(registrar, export, range, access, None) {
                Lookup::Hit(registration) => return Ok(registration),
                Lookup::Miss(_, _, seen) => seen,
                Lookup::Unwatched => {
                    unreachable!("a lookup that names no device finds it watched")
                }
            },
        };
        // A miss is a registration made or failed: `stats` counts it from those. One that
        // panics failed too: counted as the panic leaves.
        let failed = FailedUnlessMade(&self.counters.failed_registrations);
        let mr = registrar.register(source, &key)?;
        std::mem::forget(failed);
        self.counters.registrations.add(slot::current());
        // `self.write()`'s count, without its panic: a poisoned lock must not leak the MR.
        self.counters.writes.fetch_add(1, Relaxed);
        let Ok(mut state) = self.state.write() else {
            // No entry holds it yet: deregistered here.
            release(&**registrar, &self.counters, mr);
            panic!("{POISONED}");
        };
        let mut dropped = Dropped::new(registrar, &self.counters);
        let uncached = if bypass.is_some() {
            bypass
        } else if state.epoch != seen.epoch || state.stale(export.device()) {
            Some(Uncached::Invalidated)
        } else if state.make_room(&key, self.limits, &mut dropped) {
            None
        } else {
            Some(Uncached::Full)
        };
        let entry = match uncached {
            None => {
                let entry = dropped.recycle(key, mr).unwrap_or_else(|mr| {
                    let binding = state.binding(registrar, &self.counters);
                    Arc::new(Entry::new(key, mr, binding, None))
                });
                state.insert(Arc::clone(&entry));
                entry
            }
            Some(why) => {
                let binding = state.binding(registrar, &self.counters);
                let entry = Arc::new(Entry::new(key, mr, binding, Some(why)));
                state.track(&entry);
                entry
            }
        };
        drop(state);
        // Cached: those waiting for the turn find it. What it evicted goes after.
        drop(turn);
        drop(dropped);
        if entry.uncached.is_some() {
            self.counters.uncached.fetch_add(1, Relaxed);
        }
        Ok(Registration {
            entry: Held::counted(entry),
            requested: range,
        })
    }

    /// Drops every cached registration of `export`, in all domains, and returns how many.
    /// Call it before the export's memory goes away: before its dma-buf is closed for the last
    /// time or its allocation freed. Once it returns no request gets one of those entries,
    /// and a registration of the export that was being made meanwhile is not cached
    /// ([`Uncached::Invalidated`]). Registrations still in use are deregistered when their
    /// last handle is dropped; the others before this returns.
    pub fn invalidate_export(&self, export: ExportId) -> usize {
        self.invalidate(
            Cause::Memory,
            Delivery::Wait,
            |key| key.export == export,
            |index, removed| index.remove_export(export, removed),
        )
    }

    /// Drops every cached registration of exports of `/dev/peerdirect<device>`, e.g. before
    /// the device is unbound or reset, and returns how many. Like
    /// [`RegCache::invalidate_export`].
    pub fn invalidate_device(&self, device: u32) -> usize {
        self.invalidate_device_told(device, Delivery::Wait)
    }

    /// Drops every cached registration in `domain`, e.g. before the domain is closed, and
    /// returns how many. Like [`RegCache::invalidate_export`].
    pub fn invalidate_domain(&self, domain: DomainId) -> usize {
        self.invalidate(
            Cause::Domain,
            Delivery::Wait,
            |key| key.domain == domain,
            remove_domain(domain),
        )
    }

    /// [`RegCache::invalidate_domain`], unless a handle holds a registration in `domain`
    /// (cached or not): then it drops nothing, tells the listener nothing, and returns how
    /// many are held as the error. For a caller about to close the domain, which must keep
    /// its cached registrations while it cannot. A registration being made in `domain` while
    /// this runs is not counted: make none meanwhile.
    pub fn invalidate_domain_unless_held(&self, domain: DomainId) -> Result<usize, usize> {
        let affected = |key: &RegKey| key.domain == domain;
        let mut doomed = Vec::new();
        // References `held` took, dropped once the lock is let go of (see `held_too`).
        let mut looked_at = Vec::new();
        let result = {
            let mut state = self.write();
            // Decided under the same write lock as the dropping.
            match state.held(&affected, &mut looked_at) {
                0 => Ok(state.invalidate_locked(&affected, remove_domain(domain), &mut doomed)),
                held => Err(held),
            }
        };
        drop(looked_at);
        let (count, passed) = result?;
        drop(passed);
        self.tell(doomed, Cause::Domain, Delivery::Wait);
        Ok(count)
    }

    /// Subscribes the cache to `device`'s frees and revocation: from now on, freeing an
    /// allocation of `device` through the crate first invalidates every cached registration of
    /// the exports made from it ([`RegCache::invalidate_export`]), and a command of `device`
    /// failing with `ENODEV` invalidates all of the device's
    /// ([`RegCache::invalidate_device`]). Attaching twice is attaching once; the device holds
    /// the cache weakly, so dropping the cache detaches it.
    ///
    /// The cache also watches the device's status page ([`Device::status`]): once the module
    /// has started revoking the device (unbind, removal, unload), the next request for any of
    /// its exports drops all of the device's entries instead of handing one out, and new
    /// registrations of them are not cached ([`Uncached::Invalidated`]). This needs no system
    /// call on the hit path: one atomic load.
    pub fn attach(self: &Arc<Self>, device: &Device)
    where
        R: 'static,
    {
        // Attached already: one read, no write lock (which would wait for every reader). A
        // device is watched only once subscribed, below.
        if let Some(status) = device.status_page() {
            if self.read().watches(status) {
                return;
            }
        }
        let hook: Weak<Self> = Arc::downgrade(self);
        device.subscribe(hook);
        if let Some(status) = device.status() {
            let mut state = self.write();
            if !state.watched.iter().any(|w| w.status.is(&status)) {
                // Entries of the device registered before this count of resets (its exports
                // made before the last) would already be stale, and cannot be told apart:
                // the first hit after a reset drops them all.
                let resets = status.resets();
                state.watched.push(Watched {
                    device: device.index(),
                    status,
                    resets,
                });
            }
        }
    }

    /// What the cache did so far, and holds now.
    pub fn stats(&self) -> CacheStats {
        let (evictions, superseded, invalidations, entries, bytes) = {
            let state = self.read();
            (
                state.evictions,
                state.superseded,
                state.invalidations,
                state.lru.len() as u64,
                state.bytes,
            )
        };
        // Deregistrations before registrations, so that a snapshot never has more of them.
        // A registration is counted before its entry exists, so before its deregistration
        // (whose count an acquiring sum synchronizes with).
        let deregistrations = self.counters.deregistrations.sum();
        let registrations = self.counters.registrations.sum();
        let failed_registrations = self.counters.failed_registrations.load(Relaxed);
        CacheStats {
            hits: self.hits.sum(),
            misses: registrations + failed_registrations,
            registrations,
            failed_registrations,
            deregistrations,
            evictions,
            superseded,
            invalidations,
            uncached: self.counters.uncached.load(Relaxed),
            entries,
            bytes,
            max_count: self.limits.max_count as u64,
            max_bytes: self.limits.max_bytes,
            writes: self.counters.writes.load(Relaxed),
        }
    }

    /// The cached registrations, in the order eviction passes them last (the most recently
    /// inserted or given a second chance first).
    #[cfg(test)]
    fn cached(&self) -> Vec<Registration<R>> {
        self.read()
            .lru
            .iter()
            .map(|entry| Registration {
                entry: Held::counted(Arc::clone(entry)),
                requested: entry.key.range,
            })
            .collect()
    }

    /// Drops the cached entries `remove` takes out of the index, and tells the listener about
    /// them and about every other live registration `affected` matches.
    fn invalidate(
        &self,
        cause: Cause,
        delivery: Delivery,
        affected: impl Fn(&RegKey) -> bool,
        remove: impl FnOnce(&mut Index<Cached<R>>, &mut Vec<Cached<R>>),
    ) -> usize {
        let mut doomed = Vec::new();
        let (count, passed) = self
            .write()
            .invalidate_locked(&affected, remove, &mut doomed);
        drop(passed);
        self.tell(doomed, cause, delivery);
        count
    }

    /// Tells the listener of each of `doomed` it was not told of yet, then lets them go
    /// (deregistering those no handle holds): on the notifier's thread ([`Listener`]).
    fn tell(&self, doomed: Vec<Arc<Entry<R>>>, cause: Cause, delivery: Delivery) {
        if doomed.is_empty() {
            return;
        }
        for entry in &doomed {
            if let Some(mr) = entry.mr.as_ref() {
                entry.binding.registrar.invalidated(&entry.key, mr, cause);
            }
        }
        self.notifier.tell(
            move |listener: Option<&Listener<R>>| {
                let told = listener.and_then(|listener| {
                    notify::caught(|| {
                        for entry in &doomed {
                            if entry.told.swap(true, Relaxed) {
                                continue;
                            }
                            let Some(mr) = entry.mr.as_ref() else {
                                continue;
                            };
                            listener(&Invalidated {
                                key: &entry.key,
                                mr,
                                cause,
                                // `doomed` holds one reference to each, and holds each once.
                                held: Arc::strong_count(entry) > 1,
                            });
                        }
                    })
                });
                // Deregistered whether or not the listener panicked, and not while its panic
                // unwinds (a registrar's panic then would abort the process).
                let deregistered = notify::caught(move || drop(doomed));
                notify::resume(told, deregistered);
            },
            delivery,
        );
    }

    /// [`RegCache::invalidate_device`], the listener told as `delivery` says: a revocation
    /// the crate discovered (a command's `ENODEV`, the watcher) is told without waiting.
    fn invalidate_device_told(&self, device: u32, delivery: Delivery) -> usize {
        self.invalidate(
            Cause::Device,
            delivery,
            |key| key.export.device() == device,
            |index, removed| index.remove_where(|export, _| export.device() == device, removed),
        )
    }

    // Only this module's bookkeeping runs under the lock (registrars are called outside it),
    // so a poisoned lock is a bug in it; the index may be inconsistent.
    fn read(&self) -> ReadGuard<'_, State<R>> {
        self.state.read().expect(POISONED)
    }

    fn write(&self) -> WriteGuard<'_, State<R>> {
        self.counters.writes.fetch_add(1, Relaxed);
        self.state.write().expect(POISONED)
    }
}

impl<R: Registrar> Invalidate for RegCache<R> {
    fn exports_freed(&self, exports: &[ExportId]) {
        for &export in exports {
            self.invalidate_export(export);
        }
    }

    fn device_gone(&self, device: u32) {
        self.invalidate_device_told(device, Delivery::Queue);
    }

    /// Drops the device's entries now if its status page counts a reset they do not know of,
    /// as the next request for one of them would (entries registered since stay).
    fn device_reset(&self, device: u32) {
        let mut doomed = Vec::new();
        let passed = self.write().drop_stale(device, &mut doomed);
        drop(passed);
        self.tell(doomed, Cause::Device, Delivery::Queue);
    }

    fn file_closing(&self, status: &DeviceStatus) {
        let released: Vec<DeviceStatus> = {
            let mut state = self.write();
            let (gone, kept) = state.watched.drain(..).partition(|w| w.status.is(status));
            state.watched = kept;
            gone.into_iter().map(|w: Watched| w.status).collect()
        };
        // Unmapped (if this was the last mapping) outside the lock.
        drop(released);
    }
}

impl<R: Registrar> fmt::Debug for RegCache<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegCache")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// Counts a failed registration when dropped: by an error's return or a panic of the
/// registrar; forgotten once the registration is made.
struct FailedUnlessMade<'a>(&'a AtomicU64);

impl Drop for FailedUnlessMade<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Relaxed);
    }
}

/// The entries a miss drops under the lock, released once it has let go of it: the first
/// without allocating (a miss in a full cache evicts one, typically), the others in a vector.
struct Dropped<'a, R: Registrar> {
    first: Option<Arc<Entry<R>>>,
    more: Vec<Arc<Entry<R>>>,
    /// The registration [`Dropped::recycle`] took out of the first one's allocation, made by
    /// the miss's registrar.
    recycled: Option<R::Mr>,
    registrar: &'a Arc<R>,
    counters: &'a Counters,
}

impl<'a, R: Registrar> Dropped<'a, R> {
    /// For a miss of `registrar` in the cache that counts in `counters`.
    fn new(registrar: &'a Arc<R>, counters: &'a Counters) -> Self {
        Self {
            first: None,
            more: Vec::new(),
            recycled: None,
            registrar,
            counters,
        }
    }

    /// A new cached entry for `mr` of `key`, in the allocation of the first dropped entry if
    /// nothing else refers to that one (an evicted entry: no handle, no weak reference) and
    /// the miss's registrar made it; its registration is then released with the others.
    /// Saves a miss that evicts an allocation and its freeing, and four locked instructions
    /// (the dropped entry's two decrements, strong and weak, and the binding's increment and
    /// decrement: the entry keeps its binding) for the one of `Arc::get_mut`'s check. Else
    /// gives `mr` back.
    fn recycle(&mut self, key: RegKey, mr: R::Mr) -> Result<Arc<Entry<R>>, R::Mr> {
        let Some(old) = self.first.as_mut().and_then(Arc::get_mut) else {
            return Err(mr);
        };
        if !Arc::ptr_eq(&old.binding.registrar, self.registrar) {
            return Err(mr);
        }
        self.recycled = old.mr.replace(mr);
        old.key = key;
        old.uncached = None;
        // The listener is told only of entries that are out of the cache: not of an evicted one.
        debug_assert!(
            !*old.told.get_mut(),
            "{} was told of and then evicted",
            old.key
        );
        *old.referenced.get_mut() = false;
        Ok(self.first.take().expect("just seen"))
    }
}

impl<R: Registrar> Drop for Dropped<'_, R> {
    fn drop(&mut self) {
        if let Some(mr) = self.recycled.take() {
            release(&**self.registrar, self.counters, mr);
        }
    }
}

impl<R: Registrar> Extend<Arc<Entry<R>>> for Dropped<'_, R> {
    fn extend<I: IntoIterator<Item = Arc<Entry<R>>>>(&mut self, entries: I) {
        for entry in entries {
            if self.first.is_none() {
                self.first = Some(entry);
            } else {
                self.more.push(entry);
            }
        }
    }
}

/// A device file's status page the cache reads, and the device's resets its entries know of:
/// every entry of the device was registered after the last of them (the entries of exports
/// made before are dropped, under the write lock, once the page counts more).
struct Watched {
    device: u32,
    status: DeviceStatus,
    resets: u32,
}

impl Watched {
    /// Whether the page says the device's entries must go: it is being revoked, or it was
    /// reset since they were registered.
    fn stale(&self) -> bool {
        self.status.revoked() || self.status.resets() != self.resets
    }
}

/// What [`RegCache::look_up`] found.
enum Lookup<R: Registrar> {
    Hit(Registration<R>),
    /// No cached entry serves the key: what a miss needs.
    Miss(RegKey, Option<Uncached>, Seen),
    /// The cache does not watch the device the lookup named.
    Unwatched,
}

/// What a miss saw of the state when it looked up its key.
#[derive(Clone, Copy, Default)]
struct Seen {
    epoch: u64,
}

impl<R: Registrar> Drop for State<R> {
    /// The cache is going: the handles pinning its entries get references of their own.
    fn drop(&mut self) {
        let mut pinned = Pinned::default();
        for entry in self.lru.iter() {
            pinned.convert(entry);
        }
    }
}

impl<R: Registrar> State<R> {
    fn seen(&self) -> Seen {
        Seen { epoch: self.epoch }
    }

    /// Whether a watched, still open file of `device` says its entries must go: it is being
    /// revoked, or it was reset since they were registered.
    #[inline(always)]
    fn stale(&self, device: u32) -> bool {
        self.watched.iter().any(|w| w.device == device && w.stale())
    }

    /// Whether the cache watches the device whose status page this is ([`RegCache::attach`]).
    fn watches(&self, status: &DeviceStatus) -> bool {
        self.watched.iter().any(|w| w.status.is(status))
    }

    /// If `device` is being revoked or was reset, takes all of its entries, and the live
    /// registrations only handles hold (into `dropped`, for the caller to release and tell
    /// once it has let go of the lock); after a reset, entries registered from now on are of
    /// exports made after it. Bumps the epoch even when the cache held none of them: a miss
    /// registering meanwhile may have registered an export the reset revoked, and must not
    /// cache it once the reset no longer shows as stale.
    /// Returns references to drop once the lock is let go of ([`State::held_too`]).
    #[must_use = "dropped under the lock, a reference may deregister there"]
    fn drop_stale(&mut self, device: u32, dropped: &mut Vec<Arc<Entry<R>>>) -> Vec<Arc<Entry<R>>> {
        if !self.stale(device) {
            return Vec::new();
        }
        for w in self.watched.iter_mut().filter(|w| w.device == device) {
            w.resets = w.status.resets();
        }
        self.epoch += 1;
        let mut removed = Vec::new();
        self.index
            .remove_where(|export, _| export.device() == device, &mut removed);
        self.invalidations += removed.len() as u64;
        self.take(removed, dropped, &mut Pinned::default());
        self.held_too(&|key: &RegKey| key.export.device() == device, dropped)
    }

    /// The binding of `registrar`: the one its live registrations share, or a new one.
    fn binding(&mut self, registrar: &Arc<R>, counters: &Arc<Counters>) -> Arc<Binding<R>> {
        let address = Arc::as_ptr(registrar) as usize;
        // A binding that still lives holds its registrar: no other registrar lives at its
        // address, so the one found there is `registrar`'s.
        let live = self
            .bindings
            .iter()
            .find(|(bound, _)| *bound == address)
            .and_then(|(_, binding)| binding.upgrade());
        if let Some(binding) = live {
            debug_assert!(Arc::ptr_eq(&binding.registrar, registrar));
            return binding;
        }
        let binding = Arc::new(Binding {
            registrar: Arc::clone(registrar),
            counters: Arc::clone(counters),
        });
        self.bindings
            .retain(|(bound, binding)| *bound != address && binding.strong_count() > 0);
        self.bindings.push((address, Arc::downgrade(&binding)));
        binding
    }

    /// Remembers `entry` as a live registration, and forgets dead ones once their number has
    /// doubled since the last time.
    fn track(&mut self, entry: &Arc<Entry<R>>) {
        if self.live.len() >= 2 * self.live_pruned.max(32) {
            self.live.retain(|weak| weak.strong_count() > 0);
            self.live_pruned = self.live.len();
        }
        self.live.push(Arc::downgrade(entry));
    }

    /// How many registrations `affected` matches that handles hold: cached entries pinned or
    /// counted, and live ones out of the cache. Under the write lock no handle can be made,
    /// so none is missed; one let go of meanwhile may be counted.
    /// The live ones are upgraded into `looked_at`, for the caller to drop once it has let
    /// go of the lock: a handle dropped meanwhile leaves one of them the last.
    fn held(
        &mut self,
        affected: &dyn Fn(&RegKey) -> bool,
        looked_at: &mut Vec<Arc<Entry<R>>>,
    ) -> usize {
        let mut pinned = std::mem::take(&mut self.pinned);
        pinned.reset();
        // The pins before the count, as in `make_room` (see there).
        let cached = self
            .lru
            .iter()
            .filter(|entry| {
                affected(&entry.key)
                    && (pinned.holds(*entry) || Arc::strong_count(entry) > CACHE_REFERENCES)
            })
            .count();
        self.pinned = pinned;
        // Each live one that upgrades is held by a handle, or was until just now.
        let mut uncached = 0;
        for entry in self.live.iter().filter_map(Weak::upgrade) {
            uncached += usize::from(affected(&entry.key));
            looked_at.push(entry);
        }
        cached + uncached
    }

    /// What an invalidation does under the write lock: takes the entries `remove` takes out
    /// of the index, and the live ones `affected` matches, into `doomed`; returns how many
    /// were cached, and the references to drop once the lock is let go of
    /// ([`State::held_too`]).
    #[must_use = "dropped under the lock, a reference may deregister there"]
    fn invalidate_locked(
        &mut self,
        affected: &dyn Fn(&RegKey) -> bool,
        remove: impl FnOnce(&mut Index<Cached<R>>, &mut Vec<Cached<R>>),
        doomed: &mut Vec<Arc<Entry<R>>>,
    ) -> (usize, Vec<Arc<Entry<R>>>) {
        self.epoch += 1;
        let mut removed = Vec::new();
        remove(&mut self.index, &mut removed);
        self.invalidations += removed.len() as u64;
        self.take(removed, doomed, &mut Pinned::default());
        let count = doomed.len();
        (count, self.held_too(affected, doomed))
    }

    /// Adds to `doomed` the live registrations `affected` matches that are not in it yet (each
    /// once): those only handles hold. Returns the references it took to the others, for the
    /// caller to drop once it has let go of the lock: a handle dropped meanwhile leaves one of
    /// them the last, whose drop deregisters.
    #[must_use = "dropped under the lock, a reference may deregister there"]
    fn held_too(
        &self,
        affected: &dyn Fn(&RegKey) -> bool,
        doomed: &mut Vec<Arc<Entry<R>>>,
    ) -> Vec<Arc<Entry<R>>> {
        let mut seen: HashSet<*const Entry<R>> = doomed.iter().map(Arc::as_ptr).collect();
        let mut passed = Vec::new();
        for weak in &self.live {
            let Some(entry) = weak.upgrade() else {
                continue;
            };
            #[cfg(test)]
            point::reached("held_too: upgraded");
            if affected(&entry.key) && !entry.told.load(Relaxed) && seen.insert(Arc::as_ptr(&entry))
            {
                doomed.push(entry);
            } else {
                passed.push(entry);
            }
        }
        passed
    }

    /// A handle to a cached entry that serves `key`, pinned in `slot` (the calling thread's)
    /// if it can be, and the entry marked as used (under the read lock: the mark is an atomic,
    /// written only when it changes, so that hits on one entry share its line).
    #[allow(unsafe_code)]
    #[inline]
    fn hold(&self, key: &RegKey, slot: Option<usize>) -> Option<Held<Entry<R>>> {
        let (_, lent) = self.index.find(key)?;
        // The recency list holds a reference to every entry the index points to (`State`),
        // `&self` is borrowed from a guard of the lock under which both change, and the cache
        // converts an entry's pins whenever it lets go of it otherwise than by eviction
        // (`take`, `drop`), and evicts only entries of which it saw no pin (`make_room`).
        // SAFETY: so `Held::pin`'s contract holds.
        let entry = unsafe { Held::pin(lent, slot) };
        if !entry.referenced.load(Relaxed) {
            entry.referenced.store(true, Relaxed);
        }
        Some(entry)
    }

    /// Makes room to cache a registration of `key`, which no cached entry serves: drops the
    /// entries it contains (superseded), then idle entries (no [`Registration`] holds them)
    /// from the oldest until it fits, giving each that was hit since eviction last passed it
    /// a second chance (CLOCK: it moves to the newest end, its mark cleared, and is passed
    /// again only after every older entry). Entries in use are never evicted: their holders
    /// would keep them registered while a request for the same range registered it again,
    /// and the live registrations would exceed the limits. Returns `false`, evicting nothing
    /// (the second chances it gave stay given), when evicting every idle entry would not make
    /// room. The dropped entries go to `dropped`, for the caller to release once it has let
    /// go of the lock.
    ///
    /// An entry no handle holds has only the list's reference ([`CACHE_REFERENCES`]) and no
    /// pin ([`pin`]); under the lock no handle can be made (hits pin or count under it, and
    /// cloning a [`Registration`] needs one), so an idle entry stays idle while the lock is
    /// held.
    fn make_room(
        &mut self,
        key: &RegKey,
        limits: CacheLimits,
        dropped: &mut impl Extend<Arc<Entry<R>>>,
    ) -> bool {
        let length = key.range.length();
        let mut covered = Vec::new();
        self.index.remove_covered(key, &mut covered);
        let covered_bytes: u64 = covered
            .iter()
            .map(|&(slot, _)| self.lru.get(slot).key.range.length())
            .sum();
        let (mut count, mut bytes) = (self.lru.len() - covered.len(), self.bytes - covered_bytes);
        let fits = |count: usize, bytes: u64| {
            count < limits.max_count && bytes.saturating_add(length) <= limits.max_bytes
        };
        let mut evicted = std::mem::take(&mut self.evicting);
        let mut pinned = std::mem::take(&mut self.pinned);
        pinned.reset();
        let mut next = self.lru.oldest();
        while !fits(count, bytes) {
            let Some(slot) = next else {
                // Not even with every idle entry gone: leave the cache as it was.
                for (slot, lent) in covered {
                    let key = self.lru.get(slot).key;
                    self.index.insert(&key, (slot, lent));
                }
                evicted.clear();
                self.evicting = evicted;
                self.pinned = pinned;
                return false;
            };
            next = self.lru.newer(slot);
            let entry = self.lru.get(slot);
            // A covered entry is out of the index but still on the list. The pins are looked
            // at before the count: a pinned handle cloned (counted) and then dropped (its pin
            // emptied with a release the scan acquires) shows in a count read after the scan,
            // not necessarily in one read before it.
            if !covered.iter().any(|&(covered, _)| covered == slot)
                && !pinned.holds(entry)
                && Arc::strong_count(entry) == CACHE_REFERENCES
            {
                if entry.referenced.load(Relaxed) {
                    entry.referenced.store(false, Relaxed);
                    // Hit since last passed: a second chance. `next` is unchanged, so the
                    // walk reaches it again at the newest end, unmarked.
                    self.lru.touch(slot);
                    if next.is_none() {
                        next = Some(slot);
                    }
                    continue;
                }
                count -= 1;
                bytes -= entry.key.range.length();
                evicted.push(slot);
            }
        }
        self.superseded += covered.len() as u64;
        self.take(covered, dropped, &mut pinned);
        self.pinned = pinned;
        for slot in evicted.drain(..) {
            let entry = self.lru.remove(slot);
            let indexed = self.index.remove(&entry.key);
            debug_assert!(
                indexed.is_some_and(|(_, lent)| lent.is(&entry)),
                "{} is not in the index",
                entry.key
            );
            self.bytes -= entry.key.range.length();
            self.evictions += 1;
            dropped.extend([entry]);
        }
        self.evicting = evicted;
        true
    }

    /// Caches `entry`, for which [`State::make_room`] made room, as the most recently used.
    fn insert(&mut self, entry: Arc<Entry<R>>) {
        let key = entry.key;
        let (entry, lent) = Lent::lend(entry);
        let slot = self.lru.insert(entry);
        self.index.insert(&key, (slot, lent));
        self.bytes += key.range.length();
    }

    /// Takes the entries `removed` from the index off the LRU list, their pins converted
    /// (`pinned`: what this write lock's holder saw, if it looked).
    fn take(
        &mut self,
        removed: Vec<Cached<R>>,
        dropped: &mut impl Extend<Arc<Entry<R>>>,
        pinned: &mut Pinned,
    ) {
        for (slot, _) in removed {
            let entry = self.lru.remove(slot);
            pinned.convert(&entry);
            self.bytes -= entry.key.range.length();
            // Those a handle holds live on uncached: invalidations must still find them, and
            // `held` count them. Their pins are converted first, so that the count says
            // whether a handle holds them.
            if Arc::strong_count(&entry) > CACHE_REFERENCES {
                self.track(&entry);
            }
            dropped.extend([entry]);
        }
    }
}
