//! The cache's state lock: crossbeam's `ShardedLock`. A reader locks one of its eight shards,
//! picked by the reading thread, so that hits in different threads (up to eight) write no
//! common cache line; a writer locks every shard. Chosen by measurement over a hand-written
//! biased lock and the other crates (`benches/locks.rs`, Documentation/performance.md).
//!
//! A reader's unlock is a release that a later writer's lock acquires: what a hit did under
//! the read lock (filling a pin, [`super::pin`]) happens before the writer goes on.
//!
//! In tests, each thread counts the write guards it holds, so that the fake registrar can
//! check that no registrar is called under one.

use std::ops::{Deref, DerefMut};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

/// Shared access.
pub(super) type ReadGuard<'a, T> = ShardedLockReadGuard<'a, T>;

/// Guards a `T`: many readers, or one writer.
pub(super) struct Lock<T>(ShardedLock<T>);

/// The lock was poisoned: a writer panicked while it held it.
#[derive(Debug)]
pub(super) struct Poisoned;

impl<T> Lock<T> {
    pub(super) fn new(data: T) -> Self {
        Self(ShardedLock::new(data))
    }

    #[inline]
    pub(super) fn read(&self) -> Result<ReadGuard<'_, T>, Poisoned> {
        self.0.read().map_err(|_| Poisoned)
    }

    pub(super) fn write(&self) -> Result<WriteGuard<'_, T>, Poisoned> {
        let guard = self.0.write().map_err(|_| Poisoned)?;
        #[cfg(test)]
        WRITING_HERE.with(|n| n.set(n.get() + 1));
        Ok(WriteGuard { guard })
    }
}

/// Exclusive access; dropping it lets readers and writers in.
pub(super) struct WriteGuard<'a, T> {
    guard: ShardedLockWriteGuard<'a, T>,
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(test)]
impl<T> Drop for WriteGuard<'_, T> {
    fn drop(&mut self) {
        WRITING_HERE.with(|n| n.set(n.get() - 1));
    }
}

#[cfg(test)]
thread_local! {
    /// Write guards this thread holds (any cache's).
    static WRITING_HERE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether this thread holds a cache's write lock: registrars must never be called then.
#[cfg(test)]
pub(super) fn write_held_here() -> bool {
    WRITING_HERE.with(|n| n.get() > 0)
}
