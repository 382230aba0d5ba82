//! Which thread is which, for the cache's per-thread state: each of up to [`SLOTS`] threads at a
//! time owns a slot, a small index, from its first use of any cache until it ends, when the
//! slot goes back for another thread to take. A cache keeps one cache line per slot where
//! only the slot's owner writes (the hit counter's stripe; every cache shares the slot's pins,
//! [`super::pin`]), so that threads hitting one cache never write a line another thread
//! writes.
//!
//! Threads beyond the first [`SLOTS`] alive at once get none and take the caches' shared
//! paths, which are correct for any number of threads, only slower.

use std::sync::atomic::Ordering::SeqCst;

use super::sync::{AtomicUsize, Mutex};

/// How many threads at a time own a slot.
#[cfg(not(loom))]
pub(super) const SLOTS: usize = 63;

/// In the models (`cache/models.rs`), two: as many as their threads own at once, so that each
/// slot is scanned, and a third thread takes one given back.
#[cfg(loom)]
pub(super) const SLOTS: usize = 2;

/// The slots given back by threads that ended.
#[cfg(not(loom))]
static RETURNED: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// How many slots were ever handed out: slots `0..HANDED_OUT` are or were owned, the others
/// never were. Grows (under `RETURNED`'s lock), never shrinks.
#[cfg(not(loom))]
static HANDED_OUT: AtomicUsize = AtomicUsize::new(0);

// Loom's mutex and atomics are made inside each run of a model, so its statics are too.
#[cfg(loom)]
loom::lazy_static! {
    static ref RETURNED: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    static ref HANDED_OUT: AtomicUsize = AtomicUsize::new(0);
}

/// A thread's slot, given back when the thread ends.
struct Owned(Option<usize>);

impl Owned {
    fn claim() -> Self {
        let mut returned = RETURNED.lock().unwrap_or_else(|e| e.into_inner());
        Self(returned.pop().or_else(|| {
            let next = HANDED_OUT.load(SeqCst);
            // The owner fills its slot's pins only under a cache's read lock, taken after
            // this store: a writer that takes the lock after that read sees the new count
            // (the lock's release and acquire), and scans the slot.
            (next < SLOTS).then(|| {
                HANDED_OUT.store(next + 1, SeqCst);
                next
            })
        }))
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            // The next owner takes it under this lock: whatever this thread wrote in the
            // slot's lines happens before the next owner's first access.
            let mut returned = RETURNED.lock().unwrap_or_else(|e| e.into_inner());
            returned.push(slot);
        }
    }
}

#[cfg(not(loom))]
thread_local! {
    static MINE: Owned = Owned::claim();
}

#[cfg(loom)]
loom::thread_local! {
    static MINE: Owned = Owned::claim();
}

/// The calling thread's slot: `None` if it has none (more than [`SLOTS`] threads alive at
/// once), or while its thread-local values are being destroyed.
#[inline]
pub(super) fn current() -> Option<usize> {
    MINE.try_with(|mine| mine.0).ok().flatten()
}

/// How many slots were ever handed out (at most [`SLOTS`]): no thread owns or owned a slot
/// at or above it.
#[inline]
pub(super) fn handed_out() -> usize {
    HANDED_OUT.load(SeqCst)
}

/// How many slots were given back and not taken again. The models wait for every slot handed
/// out to be given back before a run ends: loom's `join` returns before the joined thread's
/// thread-locals (its slot) are dropped, and the run's statics go with the run.
#[cfg(all(test, loom))]
pub(super) fn given_back() -> usize {
    RETURNED.lock().unwrap_or_else(|e| e.into_inner()).len()
}
