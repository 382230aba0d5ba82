//! The handles that the C functions of the crate root and of `regcache` share, `pd_device`
//! and `pd_allocation`, and the checks of pointer arguments every C function makes. Below
//! both, so that neither needs the other's.

use std::sync::atomic::{AtomicBool, Ordering::Acquire};
use std::sync::{Arc, Mutex, OnceLock};

use pd::cache::{ByteRange, ExportId};
use pd::registrar::libfabric::DmaBufSource;
use pd::Device;

use crate::error::Failure;

/// The `fork` generation a handle was made in ([`pd::fork_generation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Born(u64);

impl Born {
    pub(crate) fn now() -> Self {
        Self(pd::fork_generation())
    }

    /// Whether the handle is its parent's: made before this process was forked from it.
    pub(crate) fn inherited(self) -> bool {
        self.0 != pd::fork_generation()
    }
}

/// A C handle, which knows the process it was made in.
pub(crate) trait Handle {
    fn born(&self) -> Born;
}

/// The failure of a call on a handle this process inherited across `fork`: `-ECHILD`.
pub(crate) fn inherited(function: &str, name: &str) -> Failure {
    Failure::new(
        pd::Errno::CHILD,
        format!(
            "{function}: {name} was made by the parent of this forked process; libfabric and \
             ibverbs objects and the library's threads do not survive fork: open the device \
             and make the cache and domains anew in the child"
        ),
    )
}

/// `pd_device`: an open `/dev/peerdirectN`. Allocations share it, so the file stays open until
/// the device handle is closed and every allocation made through it is freed.
pub struct PdDevice {
    pub(crate) device: Arc<Device>,
    pub(crate) born: Born,
}

impl Handle for PdDevice {
    fn born(&self) -> Born {
        self.born
    }
}

/// `pd_allocation`: HBM allocated through a `pd_device`, freed by `pd_allocation_free`.
///
/// The crate's `Allocation` borrows its `Device`, which a C handle cannot express; this keeps
/// the device alive instead and names the allocation by its handle, issuing the same
/// FREE and EXPORT commands as `Allocation` does.
pub struct PdAllocation {
    pub(crate) device: Arc<Device>,
    pub(crate) handle: u32,
    pub(crate) hbm_offset: u64,
    pub(crate) length: u64,
    /// The export `pd_register` registers from, made (and mapped) on its first call, and
    /// made again by the first call after a reset of the device revoked it. Closed when the
    /// handle is freed, after the device has invalidated its cache entries.
    pub(crate) source: Sources<Source>,
    pub(crate) born: Born,
}

impl Handle for PdAllocation {
    fn born(&self) -> Born {
        self.born
    }
}

/// What `pd_register` registers an allocation from: its export (mapped, or named by the
/// caller's address: `pd_register_dmabuf_at`) and that export's identity.
pub(crate) struct Source {
    pub(crate) source: DmaBufSource,
    pub(crate) export: ExportId,
    /// A registration through it succeeded. A dma-buf the caller passed by fd is kept (by
    /// its base address too) from its first call on; if no registration of it ever
    /// succeeds, the failed call forgets it again, so that a refusal binds nothing.
    pub(crate) registered: AtomicBool,
    /// For an export of a peerdirect device: the device's count of resets
    /// ([`pd::DeviceStatus::resets`]) read before the library first mapped or used it. Once
    /// the count differs, a reset has revoked the export. `None`: a dma-buf exported by
    /// something else, or a module without a status page, which cannot tell.
    pub(crate) resets: Option<u32>,
    /// For a peerdirect export registered at the caller's addresses (`pd_register_export_at`):
    /// its device, kept open so that a miss found by address ([`crate::regcache`]'s
    /// `pd_register_addr`) registers it watched, and so that a reset that revoked it is seen
    /// there ([`Source::revoked`]) even after the caller closed its own handle.
    pub(crate) device: Option<Arc<Device>>,
    /// The largest range a registration through it made so far ([`Source::registered_range`]):
    /// for a dma-buf at the caller's addresses, the runtime's pool, which a miss found by
    /// address registers again ([`Source::widened`]).
    widest: Mutex<Option<ByteRange>>,
}

impl Source {
    pub(crate) fn new(source: DmaBufSource, export: ExportId, resets: Option<u32>) -> Self {
        Self {
            source,
            export,
            registered: AtomicBool::new(false),
            resets,
            device: None,
            widest: Mutex::new(None),
        }
    }

    /// The same, kept with `device`, which exported it ([`Source::device`]).
    pub(crate) fn of(mut self, device: Arc<Device>) -> Self {
        self.device = Some(device);
        self
    }

    /// Whether `device`, whose export this is, revoked it since `resets` was read: it was
    /// reset, or it is gone (unbound, removed, a companion removed).
    pub(crate) fn revoked_by(&self, device: &Device) -> bool {
        self.resets.is_some_and(|then| {
            device
                .status()
                .is_none_or(|now| now.resets() != then || now.revoked())
        })
    }

    /// Whether it is at the caller's addresses, for lookups to find: named by them (not
    /// mapped), and registered (set once a registration through it succeeded, so that a
    /// lookup racing the first one finds nothing rather than registering its own piece).
    pub(crate) fn at_addresses(&self) -> bool {
        !self.source.is_mapped() && self.registered.load(Acquire)
    }

    /// The addresses `[base, end)` that name it.
    pub(crate) fn addresses(&self) -> (u64, u64) {
        let base = self.source.base_addr();
        (base, base + self.source.dma_buf().length())
    }

    /// Whether it is named by the caller's addresses (registered yet or not) and any of
    /// `[base, end)` is among them.
    pub(crate) fn overlaps(&self, base: u64, end: u64) -> bool {
        let (start, stop) = self.addresses();
        !self.source.is_mapped() && start < end && base < stop
    }

    /// Notes that a registration of `range` through it was made.
    pub(crate) fn registered_range(&self, range: ByteRange) {
        let mut widest = self.widest.lock().unwrap_or_else(|e| e.into_inner());
        if widest.is_none_or(|w| w.length() < range.length()) {
            *widest = Some(range);
        }
    }

    /// The largest range registered through it so far, if it covers `range`: what a miss of
    /// `range` found by address registers, so that the buffers of a pool whose registration
    /// went (evicted once no handle held it) find one registration again, not one each.
    pub(crate) fn widened(&self, range: ByteRange) -> Option<ByteRange> {
        let widest = *self.widest.lock().unwrap_or_else(|e| e.into_inner());
        widest.filter(|w| w.contains(range))
    }

    /// Whether the device it was kept with ([`Source::of`]) revoked it: false for
    /// a source kept without one, which nothing watches.
    pub(crate) fn revoked(&self) -> bool {
        self.device.as_ref().is_some_and(|d| self.revoked_by(d))
    }
}

/// A [`Source`] made on first use and read without a lock after that: every `pd_register` of
/// an allocation reads its export, from any number of threads at once, and a hit must not
/// write a line the others read (no lock, no reference count). A source that can no longer
/// serve (its export revoked by a reset) is replaced by a new one; the one replaced stays
/// until the handle goes, for a hit may be reading it, and so do the registrations still held
/// of it. Each replacement is a link more in a chain of [`OnceLock`]s, which a read follows to
/// its end: one link, one load, until the device is reset.
pub(crate) struct Sources<T> {
    first: OnceLock<Link<T>>,
    /// Held while a source is made, so that calls racing to make one make one export.
    making: Mutex<()>,
}

struct Link<T> {
    source: T,
    next: OnceLock<Box<Link<T>>>,
}

impl<T> Link<T> {
    fn new(source: T) -> Self {
        Self {
            source,
            next: OnceLock::new(),
        }
    }
}

impl<T> Default for Sources<T> {
    fn default() -> Self {
        Self {
            first: OnceLock::new(),
            making: Mutex::new(()),
        }
    }
}

impl<T> Sources<T> {
    /// The last link, if a source was made.
    #[inline]
    fn last(&self) -> Option<&Link<T>> {
        let mut link = self.first.get()?;
        while let Some(next) = link.next.get() {
            link = next;
        }
        Some(link)
    }

    /// The newest source, if one was made.
    #[inline]
    pub(crate) fn get(&self) -> Option<&T> {
        self.last().map(|link| &link.source)
    }

    /// The newest source if `usable` says it is; otherwise (or if none was made, or the
    /// making failed) a new one made by `make`, which becomes the newest.
    pub(crate) fn get_or_make(
        &self,
        usable: impl Fn(&T) -> bool,
        make: impl FnOnce() -> Result<T, Failure>,
    ) -> Result<&T, Failure> {
        if let Some(source) = self.get().filter(|source| usable(source)) {
            return Ok(source);
        }
        let _making = self.making.lock().unwrap_or_else(|e| e.into_inner());
        let last = self.last();
        if let Some(link) = last.filter(|link| usable(&link.source)) {
            return Ok(&link.source);
        }
        let link = Link::new(make()?);
        // Only calls holding `making` add links, and `last` was the last when this one took
        // it: the cell it sets is empty.
        Ok(match last {
            None => &self.first.get_or_init(|| link).source,
            Some(last) => &last.next.get_or_init(|| Box::new(link)).source,
        })
    }
}

/// Converts a C handle argument, refusing NULL and a handle inherited across `fork`.
///
/// # Safety
///
/// `ptr` is NULL or points to a live `T` that nothing mutates for `'a`.
#[inline]
pub(crate) unsafe fn arg<'a, T: Handle>(
    function: &str,
    name: &str,
    ptr: *const T,
) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises `ptr` is NULL (refused by `as_ref`) or valid for `'a`.
    let handle = unsafe { ptr.as_ref() }.ok_or_else(|| Failure::null(function, name))?;
    if handle.born().inherited() {
        return Err(inherited(function, name));
    }
    Ok(handle)
}

/// Takes back a handle `Box::into_raw` made, to release it; a handle inherited across `fork`
/// is left alone instead (its parent's objects must not be closed from the child), with
/// `-ECHILD`. `None` for NULL.
///
/// # Safety
///
/// `ptr` is NULL or a pointer from `Box::into_raw` not released yet; it is not used after.
pub(crate) unsafe fn take<T: Handle>(
    function: &str,
    name: &str,
    ptr: *mut T,
) -> Result<Option<Box<T>>, Failure> {
    if ptr.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL; the caller promises a live handle, not used by anything else now.
    if unsafe { &*ptr }.born().inherited() {
        return Err(inherited(function, name));
    }
    // SAFETY: the caller hands back a pointer from `Box::into_raw`, once.
    Ok(Some(unsafe { Box::from_raw(ptr) }))
}

/// Writes an output argument, refusing NULL.
///
/// # Safety
///
/// `ptr` is NULL or valid for writing a `T` (alignment included).
pub(crate) unsafe fn put<T>(
    function: &str,
    name: &str,
    ptr: *mut T,
    value: T,
) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::null(function, name));
    }
    // SAFETY: not NULL, and the caller promises it is valid and aligned for a `T`. `write`
    // does not drop the old contents, which may be uninitialized.
    unsafe { ptr.write(value) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
    use std::sync::Barrier;
    use std::time::Duration;

    use pd::Errno;

    use super::*;

    /// A source in the tests: its number, and whether a "reset" revoked it.
    #[derive(Default)]
    struct Made {
        number: usize,
        revoked: AtomicBool,
    }

    /// Eight threads calling `get_or_make` at once (each sleeping in `make`, long enough for
    /// all to find nothing usable) and what each got; how many sources were made meanwhile.
    fn race_to_make(sources: &Sources<Made>, made: &AtomicUsize) -> Vec<usize> {
        const THREADS: usize = 8;
        let barrier = Barrier::new(THREADS);
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        barrier.wait();
                        let source = sources
                            .get_or_make(
                                |s| !s.revoked.load(SeqCst),
                                || {
                                    std::thread::sleep(Duration::from_millis(20));
                                    Ok(Made {
                                        number: made.fetch_add(1, SeqCst),
                                        ..Made::default()
                                    })
                                },
                            )
                            .expect("made");
                        source as *const Made as usize
                    })
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().expect("thread"))
                .collect()
        })
    }

    /// Eight first `pd_register`s of one allocation at once make one export, and every one
    /// gets it; a failed first make leaves the next call to make it.
    #[test]
    fn first_calls_racing_make_the_source_once_and_a_failure_is_retried() {
        let sources = Sources::default();
        let made = AtomicUsize::new(0);
        let got = race_to_make(&sources, &made);
        assert_eq!(made.load(SeqCst), 1, "the export was made more than once");
        assert!(got.iter().all(|&p| p == got[0]));

        let failing = Sources::<usize>::default();
        let err = failing.get_or_make(
            |_| true,
            || Err(Failure::new(Errno::NODEV, "gone".to_owned())),
        );
        assert!(err.is_err());
        assert_eq!(
            *failing
                .get_or_make(|_| true, || Ok(7))
                .expect("made on retry"),
            7
        );
    }

    /// After each "reset" (the newest source revoked), eight calls at once make one new
    /// source, which every one gets and `get` reads from then on; a failed remake leaves the
    /// revoked one newest, to be made again by the next call. Every source made stays readable
    /// through the references taken to it before it was replaced.
    #[test]
    fn a_revoked_source_is_replaced_once_and_the_old_one_stays_readable() {
        let sources = Sources::default();
        let made = AtomicUsize::new(0);
        let mut held: Vec<&Made> = Vec::new();
        for reset in 0..4 {
            let got = race_to_make(&sources, &made);
            assert_eq!(
                made.load(SeqCst),
                reset + 1,
                "made more than once after reset {reset}"
            );
            assert!(got.iter().all(|&p| p == got[0]));
            let newest = sources.get().expect("a source");
            assert_eq!(newest as *const Made as usize, got[0]);
            assert_eq!(newest.number, reset);
            held.push(newest);
            newest.revoked.store(true, SeqCst);
        }
        let err = sources.get_or_make(|s| !s.revoked.load(SeqCst), || Err(Failure::null("f", "x")));
        assert!(err.is_err());
        assert_eq!(
            sources.get().map(|s| s.number),
            Some(3),
            "a failed remake replaced nothing"
        );
        for (number, source) in held.iter().enumerate() {
            assert_eq!(source.number, number, "a replaced source was not kept");
        }
    }

    /// Hits read the newest source while others replace it (as after resets): each reads a
    /// whole source, never an older one than it read before, and the last replacement is seen.
    #[test]
    fn hits_read_whole_sources_while_they_are_replaced() {
        const READERS: usize = 4;
        const REPLACEMENTS: usize = 200;
        let sources = Sources::default();
        let made = AtomicUsize::new(0);
        let make = || {
            Ok(Made {
                number: made.fetch_add(1, SeqCst),
                ..Made::default()
            })
        };
        let usable = |s: &Made| !s.revoked.load(SeqCst);
        sources.get_or_make(usable, make).expect("made");
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for _ in 0..READERS {
                scope.spawn(|| {
                    let mut last = 0;
                    loop {
                        // Read before `get`: once it is set, the last replacement was made.
                        let finished = done.load(SeqCst);
                        let number = sources.get().expect("a source").number;
                        assert!(number >= last, "read source {number} after {last}");
                        last = number;
                        if finished {
                            assert_eq!(number, REPLACEMENTS, "the last replacement not seen");
                            break;
                        }
                    }
                });
            }
            for _ in 0..REPLACEMENTS {
                sources.get().expect("a source").revoked.store(true, SeqCst);
                sources.get_or_make(usable, make).expect("remade");
            }
            done.store(true, SeqCst);
        });
        assert_eq!(made.load(SeqCst), REPLACEMENTS + 1);
    }
}
