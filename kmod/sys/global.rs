// SPDX-License-Identifier: GPL-2.0

//! Mutexes in statics, safe to use. The kernel crate's `global_lock!` makes a static lock
//! whose `init` must run exactly once, before any other use: each user vouches for that with
//! an `unsafe` block. [`global_mutex!`] makes a [`GlobalMutex`] instead, which runs `init` at
//! its first `lock()`, under a mutex that C initializes at build time
//! (`helpers/global.c`): no caller has anything to vouch for, and no order of module
//! initialization to keep.

use super::raw;
#[cfg(peerdirect_kunit)]
use kernel::prelude::kunit_tests;
use kernel::sync::{
    atomic::{Acquire, Atomic, Relaxed, Release},
    GlobalGuard, GlobalLock, GlobalLockBackend,
};

/// A mutex in a static, declared with [`global_mutex!`].
pub(crate) struct GlobalMutex<B: GlobalLockBackend + 'static> {
    lock: &'static GlobalLock<B>,
    /// Set, with `Release`, once `lock` is initialized; only ever set under the C mutex.
    ready: Atomic<bool>,
}

impl<B: GlobalLockBackend> GlobalMutex<B> {
    /// The mutex over `lock`. Only [`global_mutex!`] makes one.
    ///
    /// # Safety
    ///
    /// `lock` was made by `GlobalLock::new` and nothing but the returned `GlobalMutex` uses it
    /// (`global_mutex!` declares it in a block of its own, where nothing else can name it).
    #[doc(hidden)]
    pub(crate) const unsafe fn new(lock: &'static GlobalLock<B>) -> Self {
        Self {
            lock,
            ready: Atomic::new(false),
        }
    }

    /// Locks the mutex (initializing it first, the first time).
    #[inline]
    pub(crate) fn lock(&'static self) -> GlobalGuard<B> {
        if !self.ready.load(Acquire) {
            self.init();
        }
        self.lock.lock()
    }

    #[cold]
    fn init(&'static self) {
        let _serialized = InitLock::lock();
        // Under the C mutex, which every write of `ready` holds: no other thread is here.
        if !self.ready.load(Relaxed) {
            // Only this `GlobalMutex` uses `lock` (`new`'s contract), and `lock()` reaches it
            // only once `ready` is set, so nothing used it before.
            // SAFETY: runs once (`ready` is false; only this block, under the C mutex, sets it).
            unsafe { self.lock.init() };
            // `lock()`'s `Acquire` load pairs with it: who sees `true` sees the lock set up.
            self.ready.store(true, Release);
        }
    }
}

/// The C mutex that serializes the first `lock()`s, held while this lives.
struct InitLock;

impl InitLock {
    fn lock() -> Self {
        // SAFETY: the mutex is initialized at build time; `Drop` unlocks it, in this task.
        unsafe { raw::peerdirect_global_init_lock() };
        Self
    }
}

impl Drop for InitLock {
    fn drop(&mut self) {
        // SAFETY: `lock()` locked it in this task, and only this `InitLock` unlocks it.
        unsafe { raw::peerdirect_global_init_unlock() };
    }
}

/// Declares a [`GlobalMutex`] static:
///
/// ```ignore
/// sys::global_mutex! {
///     /// What it guards.
///     pub(crate) static NAME: Mutex<KVec<u32>> = KVec::new();
/// }
/// ```
///
/// (Like `global_lock!`, it declares a type of the same name for lockdep's class: a static
/// and a type do not clash.)
macro_rules! global_mutex {
    {
        $(#[$meta:meta])* $vis:vis static $name:ident: Mutex<$item:ty> = $value:expr;
    } => {
        #[doc(hidden)]
        #[allow(non_camel_case_types, unreachable_pub, clippy::upper_case_acronyms)]
        $vis enum $name {}

        impl ::kernel::sync::GlobalLockBackend for $name {
            const NAME: &'static ::kernel::str::CStr = ::kernel::c_str!(::core::stringify!($name));
            type Item = $item;
            type Backend = ::kernel::sync::lock::mutex::MutexBackend;

            fn get_lock_class() -> ::core::pin::Pin<&'static ::kernel::sync::LockClassKey> {
                ::kernel::static_lock_class!()
            }
        }

        $(#[$meta])*
        $vis static $name: $crate::sys::global::GlobalMutex<$name> = {
            static LOCK: ::kernel::sync::GlobalLock<$name> = {
                let value: $item = $value;
                // `LOCK` is named only here; `$name` is the backend of no other lock.
                // SAFETY: the one `GlobalMutex` below initializes it before any other use.
                unsafe { ::kernel::sync::GlobalLock::new(value) }
            };
            // SAFETY: `LOCK` was made by `GlobalLock::new` and nothing else can name it.
            unsafe { $crate::sys::global::GlobalMutex::new(&LOCK) }
        };
    };
}
pub(crate) use global_mutex;

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_global)]
mod tests {
    use super::GlobalMutex;
    use kernel::{
        prelude::*,
        sync::{
            atomic::{Acquire, Atomic, Full, Release},
            Arc, GlobalLockBackend,
        },
        workqueue,
    };

    /// Workers on the system workqueue besides this thread.
    const WORKERS: usize = 3;
    /// Increments each thread makes.
    const INCREMENTS: u64 = 2_000;

    /// Every thread takes `m` for the first time at once (they wait for one flag), then adds
    /// to its count under it, reading and writing back with a pause between: two threads in
    /// the lock at once (a second `init` resetting a held mutex) lose increments. Bounded: a
    /// fixed number of increments. Returns the count.
    fn race_first_lock<B: GlobalLockBackend<Item = u64>>(
        m: &'static GlobalMutex<B>,
    ) -> Result<u64> {
        let start = Arc::new(Atomic::new(0usize), GFP_KERNEL)?;
        let done = Arc::new(Atomic::new(0usize), GFP_KERNEL)?;
        let add = move || {
            for _ in 0..INCREMENTS {
                let mut count = m.lock();
                let seen = *count;
                for _ in 0..32 {
                    core::hint::spin_loop();
                }
                *count = seen + 1;
            }
        };
        for _ in 0..WORKERS {
            let (start, done) = (start.clone(), done.clone());
            workqueue::system_unbound().try_spawn(GFP_KERNEL, move || {
                start.fetch_add(1, Full);
                while start.load(Acquire) <= WORKERS {
                    core::hint::spin_loop();
                }
                add();
                done.fetch_add(1, Release);
            })?;
        }
        // Go once every worker is waiting.
        while start.load(Acquire) < WORKERS {
            core::hint::spin_loop();
        }
        start.fetch_add(1, Full);
        add();
        while done.load(Acquire) < WORKERS {
            core::hint::spin_loop();
        }
        let count = *m.lock();
        Ok(count)
    }

    /// Sixteen mutexes, each first taken by four threads at once: each is initialized once
    /// (no increment is lost).
    #[test]
    fn first_locks_racing_initialize_once() -> Result {
        macro_rules! race_each {
            ($($name:ident)*) => {$({
                crate::sys::global::global_mutex! {
                    static $name: Mutex<u64> = 0;
                }
                let count = race_first_lock(&$name)?;
                assert_eq!(count, (WORKERS as u64 + 1) * INCREMENTS);
            })*};
        }
        race_each!(M0 M1 M2 M3 M4 M5 M6 M7 M8 M9 M10 M11 M12 M13 M14 M15);
        Ok(())
    }
}
