//! Which side of a `fork` this process is on: how many forks made it from the process in which
//! the library first asked, counted by a `pthread_atfork` child handler.

use core::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Once;

static FORKS: AtomicU64 = AtomicU64::new(0);

/// Runs in the child right after `fork`: only an atomic add, as a child of a process with
/// several threads may do (async-signal-safe).
extern "C" fn in_child() {
    FORKS.fetch_add(1, Relaxed);
}

extern "C" {
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

/// How many forks separate this process from the one in which this was first called.
#[inline]
pub(crate) fn generation() -> u64 {
    static REGISTERED: Once = Once::new();
    if !REGISTERED.is_completed() {
        register(&REGISTERED);
    }
    FORKS.load(Relaxed)
}

#[cold]
fn register(registered: &Once) {
    registered.call_once(|| {
        // On failure (ENOMEM) forks are not counted: handles then work in a child as in its
        // parent. glibc drops the handler if this library is unloaded (by its DSO handle).
        // SAFETY: registers a child handler that only adds to an atomic (async-signal-safe).
        let _ = unsafe { pthread_atfork(None, None, Some(in_child)) };
    });
}
