//! What the cache's hand-written concurrency ([`super::pin`], [`super::slot`], the hit
//! counter's stripes, [`super::lent`], [`super::addresses`]) is made of: std's atomics, mutex and `Arc`, or, built
//! with `--cfg loom`, loom's, whose models (`cache/models.rs`) run that same code through
//! every interleaving and every value a load may read under the memory model. Only the
//! models create loom's: in a normal build nothing here differs from std.

#![allow(unsafe_code)]

use std::ops::Deref;

#[cfg(loom)]
pub(super) use loom::sync::{
    atomic::{fence, AtomicU32, AtomicU64, AtomicUsize},
    Mutex,
};
#[cfg(not(loom))]
pub(super) use std::sync::{
    atomic::{fence, AtomicU32, AtomicU64, AtomicUsize},
    Mutex,
};

/// A value loaded and stored whole, never torn: crossbeam's `AtomicCell` (for a value larger
/// than an atomic, a seqlock whose load writes nothing unless a store runs meanwhile). In the
/// models, loom's mutex, which gives the same guarantee and lets loom order its accesses.
#[cfg(not(loom))]
pub(super) use crossbeam_utils::atomic::AtomicCell as Cell;

/// [`Cell`] in the models.
#[cfg(loom)]
pub(super) struct Cell<T>(Mutex<T>);

#[cfg(loom)]
impl<T: Copy> Cell<T> {
    pub(super) fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    pub(super) fn load(&self) -> T {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn store(&self, value: T) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

/// An `Arc` as [`super::lent`] and the pins count it, by its value's address: std's for the
/// cache; loom's in the models, where each count taken or let go of must be one loom sees.
/// The methods are `Arc`'s of the same names.
pub(super) trait Shared<T>: Deref<Target = T> + Clone {
    /// `Arc::into_raw`.
    fn into_raw(this: Self) -> *const T;

    /// `Arc::as_ptr`.
    fn as_ptr(this: &Self) -> *const T;

    /// `Arc::from_raw`.
    ///
    /// # Safety
    ///
    /// `ptr` is `into_raw`'s for this type, and the reference made of it is one that
    /// `into_raw` or `increment_strong_count` took for it, let go of once.
    unsafe fn from_raw(ptr: *const T) -> Self;

    /// `Arc::increment_strong_count`.
    ///
    /// # Safety
    ///
    /// `ptr` is `into_raw`'s for this type, and a reference keeps its value alive meanwhile.
    unsafe fn increment_strong_count(ptr: *const T);

    /// `Arc::decrement_strong_count`.
    ///
    /// # Safety
    ///
    /// `ptr` is `into_raw`'s for this type, and the caller owns the reference it lets go of.
    unsafe fn decrement_strong_count(ptr: *const T);
}

/// [`Shared`] for an `Arc` type with std's methods.
macro_rules! shared {
    ($arc:ty) => {
        impl<T> Shared<T> for $arc {
            #[inline]
            fn into_raw(this: Self) -> *const T {
                <$arc>::into_raw(this)
            }

            #[inline]
            fn as_ptr(this: &Self) -> *const T {
                <$arc>::as_ptr(this)
            }

            #[inline]
            unsafe fn from_raw(ptr: *const T) -> Self {
                // SAFETY: the caller's contract is `Arc::from_raw`'s.
                unsafe { <$arc>::from_raw(ptr) }
            }

            #[inline]
            unsafe fn increment_strong_count(ptr: *const T) {
                // SAFETY: the caller's contract is `Arc::increment_strong_count`'s.
                unsafe { <$arc>::increment_strong_count(ptr) }
            }

            #[inline]
            unsafe fn decrement_strong_count(ptr: *const T) {
                // SAFETY: the caller's contract is `Arc::decrement_strong_count`'s.
                unsafe { <$arc>::decrement_strong_count(ptr) }
            }
        }
    };
}

shared!(std::sync::Arc<T>);
#[cfg(loom)]
shared!(loom::sync::Arc<T>);
