//! Handles that a hit hands out without writing its entry: pins in its thread's own line.
//!
//! A handle keeps its registration alive. Counted in the entry's `Arc`, that is a locked
//! increment on the entry's line, which every thread hitting the same entry writes: with threads
//! on several CPUs the line moves between them, and a hit waits for it. Instead a hit *pins*
//! the entry: it stores the entry's address in an empty pin of its [slot](super::slot), on a
//! line that only that thread's hits fill. A [`Held`] is either kind of handle.
//!
//! # Why a pinned entry lives as long as its handle
//!
//! - A pin is filled only by its slot's owner, under the read lock of the cache that holds the
//!   entry ([`Held::pin`]), in a pin it found empty. Anyone holding the handle empties it.
//! - While the entry is cached, the cache's reference keeps it alive.
//! - An entry leaves its cache only under the cache's write lock, while no pin of it can be
//!   filled; every pin of it that was filled before is seen by the writer (a reader's unlock is
//!   a release that the writer's lock acquires, `lock.rs`).
//! - Eviction takes only entries of which it saw no pin ([`Pinned`]): one it saw empty was
//!   emptied with a release its acquiring load synchronizes with, so the handle's last use
//!   happened before the entry can go.
//! - Every other way out of the cache (superseded, invalidated, the cache dropped) *converts*
//!   the entry's pins first ([`Pinned::convert`]): for each pin holding the entry's address it
//!   takes a reference for the handle, then marks the pin converted with a compare-exchange
//!   from the address to the address with its low bit set. The handle empties its pin with a
//!   swap; finding the mark, it lets go of that reference. One of the two wins: a pin the
//!   handle emptied first fails the exchange, and the writer gives the reference back (never
//!   the last: it holds the cache's). The reference is taken before the exchange, since the
//!   handle may let go of it as soon as the mark is set. A pin found emptied since the scan
//!   was emptied with a release, which the writer acquires before it lets go of the entry.
//!
//! `cache/models.rs` model-checks this with loom (Documentation/testing.md).
//!
//! A thread without a slot, or with all its pins full ([`PINS`] handles of its hits alive),
//! gets a counted handle, as does a clone of a handle.

#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Deref;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};
use std::sync::Arc;

use super::lent::Lent;
use super::slot::{self, SLOTS};
use super::sync::{fence, AtomicUsize, Shared};

/// Pins per slot: one line.
pub(super) const PINS: usize = 8;

/// A pin's mark: the cache let go of the entry and gave the handle a reference instead.
const CONVERTED: usize = 1;

/// A slot's pins: empty (0), an entry's address, or that address with [`CONVERTED`] set.
#[repr(align(64))]
struct Line([AtomicUsize; PINS]);

/// Every slot's pins, shared by all caches: a handle may outlive its cache, and its pin must
/// outlive the handle.
#[cfg(not(loom))]
static LINES: [Line; SLOTS] = [const { Line([const { AtomicUsize::new(0) }; PINS]) }; SLOTS];

// Loom's atomics are made inside each run of a model, so its statics are too.
#[cfg(loom)]
loom::lazy_static! {
    static ref LINES: [Line; SLOTS] =
        std::array::from_fn(|_| Line(std::array::from_fn(|_| AtomicUsize::new(0))));
}

/// A handle to the value of an `Arc<T>` (an `A`: std's, or loom's in the models, [`Shared`]):
/// one reference of its own, or a pin.
pub(super) struct Held<T, A: Shared<T> = Arc<T>> {
    value: NonNull<T>,
    /// The pin that holds `value`; `None`: this handle owns a reference.
    pin: Option<&'static AtomicUsize>,
    arc: PhantomData<fn() -> A>,
}

impl<T, A: Shared<T>> Held<T, A> {
    /// A handle that owns `arc`'s reference.
    pub(super) fn counted(arc: A) -> Self {
        let raw = A::into_raw(arc).cast_mut();
        Self {
            value: NonNull::new(raw).expect("an Arc's pointer is not null"),
            pin: None,
            arc: PhantomData,
        }
    }

    /// A handle to `lent`'s value, pinned in `slot` (the calling thread's, [`slot::current`])
    /// if it has an empty pin, else counted.
    ///
    /// # Safety
    ///
    /// The caller holds the read (or write) lock of the cache whose recency list holds the
    /// `Arc` that `lent` was lent from, and that cache converts the pins of an entry before it
    /// lets go of it, and evicts no entry of which [`Pinned`] saw a pin (module proof).
    #[inline]
    pub(super) unsafe fn pin(lent: &Lent<T, A>, slot: Option<usize>) -> Self {
        let value = lent.as_non_null();
        if let Some(slot) = slot {
            for pin in &LINES[slot].0 {
                // Only this thread fills its slot's pins: one seen empty stays empty until
                // it does. Relaxed: the lock orders the store before the writer's loads.
                if pin.load(Relaxed) == 0 {
                    pin.store(value.as_ptr() as usize, Relaxed);
                    return Self {
                        value,
                        pin: Some(pin),
                        arc: PhantomData,
                    };
                }
            }
        }
        // SAFETY: under the caller's lock the list's reference lives until this returns.
        Self::counted(unsafe { lent.to_arc() })
    }
}

impl<T, A: Shared<T>> Held<T, A> {
    /// Whether a pin holds it (else a reference of its own).
    #[cfg(test)]
    pub(super) fn is_pinned(&self) -> bool {
        self.pin.is_some()
    }
}

impl<T, A: Shared<T>> Deref for Held<T, A> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // A counted handle owns a reference; a pinned one's entry is kept by its cache until
        // its pin is converted, then by the reference the conversion took for it (module proof).
        // SAFETY: either lasts until this handle is dropped, so the value is alive and shared.
        unsafe { self.value.as_ref() }
    }
}

impl<T, A: Shared<T>> Clone for Held<T, A> {
    /// A counted handle.
    fn clone(&self) -> Self {
        // SAFETY: `value` is an `Arc`'s pointer (`into_raw`'s, or `Lent`'s, which is too),
        // whose value this handle keeps alive (see `deref`) while the count is raised.
        unsafe { A::increment_strong_count(self.value.as_ptr().cast_const()) };
        Self {
            value: self.value,
            pin: None,
            arc: PhantomData,
        }
    }
}

impl<T, A: Shared<T>> Drop for Held<T, A> {
    #[inline]
    fn drop(&mut self) {
        if let Some(pin) = self.pin {
            // AcqRel: this handle's reads of the value happen before a writer that sees the
            // pin empty lets go of the value; and a conversion seen happened before.
            if pin.swap(0, AcqRel) & CONVERTED == 0 {
                return;
            }
        }
        // SAFETY: this handle owns one reference to the `Arc` whose pointer `value` is: its
        // own (counted), or the one a conversion took for its pin; it is let go of once.
        unsafe { A::decrement_strong_count(self.value.as_ptr().cast_const()) };
    }
}

// SAFETY: a `Held<T>` gives access to a `T` and may let go of the last reference to it, as an
// `Arc<T>` does, which is `Send` when `T: Send + Sync`; its pin is an atomic.
unsafe impl<T: Send + Sync, A: Shared<T>> Send for Held<T, A> {}

// SAFETY: sharing a `Held<T>` shares `&T` and the ability to clone it, as for `Arc<T>`.
unsafe impl<T: Send + Sync, A: Shared<T>> Sync for Held<T, A> {}

/// The entries pinned when a cache's writer looked (under its write lock): for that cache's
/// entries, a superset of those pinned until it lets go of the lock, since none can be pinned
/// meanwhile. Kept by the cache between uses for its capacity.
#[derive(Default)]
pub(super) struct Pinned {
    addresses: Vec<usize>,
    taken: bool,
}

impl Pinned {
    /// Forgets what it saw: call when the write lock is taken, before [`Pinned::holds`].
    pub(super) fn reset(&mut self) {
        self.taken = false;
    }

    /// Whether `arc`'s value was pinned when first asked under this lock (a handle may have
    /// let go since: then it is merely treated as held).
    pub(super) fn holds<T, A: Shared<T>>(&mut self, arc: &A) -> bool {
        if !self.taken {
            #[cfg(test)]
            super::point::reached("pin scan");
            self.addresses.clear();
            for line in &LINES[..slot::handed_out()] {
                // Most lines are empty (a miss's handle is counted): eight independent loads
                // tell, where a branch on each would wait for it.
                if line.0.iter().fold(0, |any, pin| any | pin.load(Relaxed)) == 0 {
                    continue;
                }
                for pin in &line.0 {
                    let address = pin.load(Relaxed) & !CONVERTED;
                    if address != 0 {
                        self.addresses.push(address);
                    }
                }
            }
            // A pin seen empty was emptied (a release) after its handle's last use: that use
            // happens before what the caller does next.
            fence(Acquire);
            self.taken = true;
        }
        let address = A::as_ptr(arc) as usize;
        self.addresses.contains(&address)
    }

    /// Converts every pin of `arc`'s value, which its cache is letting go of under its write
    /// lock: each handle pinning it gets a reference of its own. It is then forgotten as
    /// pinned, so that converting it again under the same lock (a superseded entry, converted
    /// before its count is read and again as it is taken off the list) scans nothing.
    pub(super) fn convert<T, A: Shared<T>>(&mut self, arc: &A) {
        if !self.holds(arc) {
            return;
        }
        let address = A::as_ptr(arc) as usize;
        for line in &LINES[..slot::handed_out()] {
            for pin in &line.0 {
                if pin.load(Relaxed) != address {
                    continue;
                }
                // The reference first: the handle may let go of it as soon as it sees the mark.
                let reference = A::clone(arc);
                if pin
                    .compare_exchange(address, address | CONVERTED, AcqRel, Relaxed)
                    .is_ok()
                {
                    std::mem::forget(reference);
                }
            }
        }
        // A pin seen empty here (by the load or the failed exchange) that the scan saw holding
        // the value was emptied since, with a release after its handle's last use: that use
        // happens before the caller lets go of the value, maybe its last reference.
        fence(Acquire);
        // None can be pinned again: it is out of the index, and hits are locked out.
        self.addresses.retain(|&pinned| pinned != address);
    }
}
