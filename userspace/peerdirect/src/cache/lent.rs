//! The index's way to a cached entry: a pointer that holds no reference of its own.
//!
//! The recency list holds the cache's one reference to each cached entry; the index, which a
//! hit goes through, holds a [`Lent`] pointer to the same entry. A miss that caches an entry
//! and the eviction of another then cost two locked instructions less (the index's increment
//! and decrement of the entry's count) than with a second `Arc` in the index.
//!
//! What keeps it sound is the cache's invariant (`cache.rs`, `State`): every `Lent` in the
//! index points to an entry whose `Arc` the recency list holds, the two change together
//! under the cache's write lock, and a `Lent` is followed only under the lock.

#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

use super::sync::Shared;

/// A pointer to the value of an `Arc` (an `A`: std's, or loom's in the models, [`Shared`])
/// that another holder keeps alive.
pub(super) struct Lent<T, A = Arc<T>>(NonNull<T>, PhantomData<fn() -> A>);

impl<T, A: Shared<T>> Lent<T, A> {
    /// `arc` back, and a pointer lent from it. The pointer is `Arc::into_raw`'s, as
    /// [`Lent::to_arc`] needs; no count changes.
    pub(super) fn lend(arc: A) -> (A, Self) {
        let raw = A::into_raw(arc);
        let lent = Self(
            NonNull::new(raw.cast_mut()).expect("an Arc's pointer is not null"),
            PhantomData,
        );
        // SAFETY: `raw` was just returned by `Arc::into_raw` for this `T`, and is turned back
        // into an `Arc` once: the reference `into_raw` gave up is taken back.
        let arc = unsafe { A::from_raw(raw) };
        (arc, lent)
    }

    /// A new reference to the value: one locked increment, as `Arc::clone`.
    ///
    /// # Safety
    ///
    /// The `Arc` this was lent from (or another reference to the same value) must be alive
    /// until this returns.
    #[inline]
    pub(super) unsafe fn to_arc(&self) -> A {
        let raw = self.0.as_ptr().cast_const();
        // `raw` is the pointer `Arc::into_raw` returned in `lend`; the new count is owned by the
        // `Arc` that `from_raw` makes of that same pointer.
        // SAFETY: by the caller's contract a strong reference keeps the value alive meanwhile.
        unsafe {
            A::increment_strong_count(raw);
            A::from_raw(raw)
        }
    }

    /// The pointer: `Arc::into_raw`'s.
    #[inline]
    pub(super) fn as_non_null(&self) -> NonNull<T> {
        self.0
    }

    /// Whether this points to `arc`'s value.
    pub(super) fn is(&self, arc: &A) -> bool {
        std::ptr::eq(self.0.as_ptr().cast_const(), A::as_ptr(arc))
    }
}

// SAFETY: a `Lent<T>` is only an address; what it gives its holder, under `to_arc`'s contract,
// is an `Arc<T>`, which is `Send` when `T: Send + Sync`.
unsafe impl<T: Send + Sync, A> Send for Lent<T, A> {}

// SAFETY: as for `Send`: sharing a `Lent<T>` shares the ability to make an `Arc<T>`, which is
// `Sync` when `T: Send + Sync`.
unsafe impl<T: Send + Sync, A> Sync for Lent<T, A> {}
