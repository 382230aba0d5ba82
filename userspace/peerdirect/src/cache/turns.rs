//! What a [`super::RegCache`]'s misses take turns at, so that threads missing the same export
//! at once register it once: the first registers, and the others wait for it and find its
//! entry.

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::{Condvar, Mutex, PoisonError};

use crate::invalidation::ExportId;

/// What misses take turns at, by export ([`super::RegCache`]'s misses): the exports whose
/// misses are registering, and a condition variable their ends are announced on. Exact, not
/// hashed: misses of different exports never wait for each other's registrations (with 16
/// hashed turns, 8 threads missing different exports on 2 CPUs met often enough that their
/// p99 rose from about 40 µs to 1.5 ms in `make bench`).
///
/// A thread that may be waited for never waits for a turn ([`Unwaiting`]): one that holds a
/// turn (its registration may request other exports, whose holders may request its own) and
/// a listener's thread (an invalidation made inside a registration waits for it). It takes
/// a free turn, and registers on its own where it would have waited, so no wait for a turn
/// closes a cycle.
#[derive(Default)]
pub(super) struct Turns {
    busy: Mutex<Busy>,
    ended: Condvar,
}

#[derive(Default)]
struct Busy {
    /// As many as misses registering at once: a few, searched faster than hashed.
    exports: Vec<ExportId>,
    /// Misses waiting for a turn: an end is announced only to them (a notification is a
    /// system call, which tripled a miss's overhead when every end made one).
    waiting: usize,
}

thread_local! {
    /// How many reasons this thread has not to wait for a turn: the turns it holds, of any
    /// cache, and being a listener's thread ([`Turns`]).
    static UNWAITING: Cell<u32> = const { Cell::new(0) };
}

/// [`UNWAITING`], counted up for as long as it lives.
struct Unwaiting(PhantomData<*const ()>);

impl Unwaiting {
    fn new() -> Self {
        UNWAITING.with(|unwaiting| unwaiting.set(unwaiting.get() + 1));
        Self(PhantomData)
    }

    fn here() -> bool {
        UNWAITING.with(Cell::get) > 0
    }
}

impl Drop for Unwaiting {
    fn drop(&mut self) {
        UNWAITING.with(|unwaiting| unwaiting.set(unwaiting.get() - 1));
    }
}

/// Marks the calling thread, a listener's, as one that never waits for a turn.
pub(super) fn listener_thread() {
    std::mem::forget(Unwaiting::new());
}

/// An export's turn, given back when dropped, on the thread that took it (`!Send`).
pub(super) struct Turn<'a> {
    turns: &'a Turns,
    export: ExportId,
    _unwaiting: Unwaiting,
}

impl Turns {
    /// Waits for `export`'s turn, unless this thread may be waited for ([`Turns`]): then
    /// `None` where it would have waited.
    pub(super) fn take(&self, export: ExportId) -> Option<Turn<'_>> {
        let unwaiting = Unwaiting::here();
        // Nothing panics under it.
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while busy.exports.contains(&export) {
            if unwaiting {
                return None;
            }
            busy.waiting += 1;
            busy = self
                .ended
                .wait(busy)
                .unwrap_or_else(PoisonError::into_inner);
            busy.waiting -= 1;
        }
        busy.exports.push(export);
        Some(Turn {
            turns: self,
            export,
            _unwaiting: Unwaiting::new(),
        })
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .turns
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = busy.exports.iter().position(|busy| *busy == self.export) {
            busy.exports.swap_remove(at);
        }
        let waiting = busy.waiting > 0;
        drop(busy);
        if waiting {
            self.turns.ended.notify_all();
        }
    }
}
