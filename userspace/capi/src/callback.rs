//! The slot of the caller's invalidation callback. Calls copy the callback out and run it
//! without the slot's lock (so a callback may call back into the library); replacing or
//! clearing it (`pd_regcache_set_invalidate_callback`, `pd_regcache_free`) then waits until
//! no call made before runs on another thread, so that the caller may free the callback's
//! context as soon as either returns. Calls on the replacing thread itself are not waited for
//! (it is inside one of them: waiting would never end).

use std::cell::RefCell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};

/// A callback of type `C`, and how many calls of it run.
pub(crate) struct CallbackSlot<C> {
    state: Mutex<State<C>>,
    /// Signalled when a call ends.
    ended: Condvar,
}

struct State<C> {
    current: Option<C>,
    /// Calls running now, on every thread.
    running: usize,
}

thread_local! {
    /// The slots (by address) whose callback this thread is running, once per call.
    static RUNNING_HERE: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

impl<C: Copy> CallbackSlot<C> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                current: None,
                running: 0,
            }),
            ended: Condvar::new(),
        }
    }

    /// Runs `call` with the callback, if there is one, counted as running until it returns.
    pub(crate) fn call(&self, call: impl FnOnce(C)) {
        let callback = {
            let mut state = self.lock();
            let Some(callback) = state.current else {
                return;
            };
            state.running += 1;
            callback
        };
        let _running = Running::enter(self);
        call(callback);
    }

    /// Replaces the callback (`None`: no callback), then returns once no call that started
    /// before runs on another thread.
    pub(crate) fn set(&self, callback: Option<C>) {
        let here = self.running_here();
        let mut state = self.lock();
        state.current = callback;
        while state.running > here {
            state = self
                .ended
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// How many calls of this slot run on this thread (nested ones count each).
    fn running_here(&self) -> usize {
        let me = self.address();
        RUNNING_HERE
            .try_with(|running| running.borrow().iter().filter(|&&s| s == me).count())
            .unwrap_or(0)
    }

    fn address(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    // Only counters are written under the lock: a poisoned lock still holds good values.
    fn lock(&self) -> MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One running call: recorded on its thread, and counted down when it ends, even by a panic.
struct Running<'a, C: Copy> {
    slot: &'a CallbackSlot<C>,
}

impl<'a, C: Copy> Running<'a, C> {
    fn enter(slot: &'a CallbackSlot<C>) -> Self {
        let me = slot.address();
        let _ = RUNNING_HERE.try_with(|running| running.borrow_mut().push(me));
        Self { slot }
    }
}

impl<C: Copy> Drop for Running<'_, C> {
    fn drop(&mut self) {
        let me = self.slot.address();
        let _ = RUNNING_HERE.try_with(|running| {
            let mut running = running.borrow_mut();
            if let Some(at) = running.iter().rposition(|&s| s == me) {
                running.swap_remove(at);
            }
        });
        let mut state = self.slot.lock();
        state.running -= 1;
        drop(state);
        self.slot.ended.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{mpsc, Arc, Barrier};
    use std::thread;
    use std::time::Duration;

    /// Clearing the slot returns only once a call running on another thread has returned:
    /// then the caller may free what the callback uses.
    #[test]
    fn clearing_waits_for_a_call_running_on_another_thread() {
        let slot = Arc::new(CallbackSlot::new());
        slot.set(Some(7u32));
        let (started, finished) = (Arc::new(Barrier::new(2)), Arc::new(AtomicBool::new(false)));
        let caller = {
            let (slot, started, finished) = (
                Arc::clone(&slot),
                Arc::clone(&started),
                Arc::clone(&finished),
            );
            thread::spawn(move || {
                slot.call(|value| {
                    assert_eq!(value, 7);
                    started.wait();
                    thread::sleep(Duration::from_millis(200));
                    finished.store(true, SeqCst);
                });
            })
        };
        started.wait();
        // On a thread of its own, bounded: a set that never returned fails the test.
        let (cleared, wait_cleared) = mpsc::channel();
        let (clearing, after) = (Arc::clone(&slot), Arc::clone(&finished));
        thread::spawn(move || {
            clearing.set(None);
            let _ = cleared.send(after.load(SeqCst));
        });
        let finished_first = wait_cleared
            .recv_timeout(Duration::from_secs(5))
            .expect("set(None) returned within 5 s");
        assert!(
            finished_first,
            "set(None) returned while the callback still ran"
        );
        caller.join().unwrap();
        // No callback any more: nothing is called.
        slot.call(|_| panic!("called after it was cleared"));
    }

    /// A callback that clears its own slot (on its own thread) does not wait for itself.
    #[test]
    fn a_callback_may_clear_its_own_slot() {
        let slot = Arc::new(CallbackSlot::new());
        slot.set(Some(1u8));
        let (done, finished) = mpsc::channel();
        let inner = Arc::clone(&slot);
        thread::spawn(move || {
            inner.call(|_| inner.set(None));
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(5))
            .expect("the callback's own set(None) returned");
        slot.call(|_| panic!("called after it was cleared"));
    }

    /// A panic in a call still counts it as ended.
    #[test]
    fn a_call_that_panics_is_counted_as_ended() {
        let slot = Arc::new(CallbackSlot::new());
        slot.set(Some(1u8));
        let inner = Arc::clone(&slot);
        let _ = thread::spawn(move || inner.call(|_| panic!("boom"))).join();
        let (done, finished) = mpsc::channel();
        let inner = Arc::clone(&slot);
        thread::spawn(move || {
            inner.set(None);
            let _ = done.send(());
        });
        finished
            .recv_timeout(Duration::from_secs(5))
            .expect("set(None) returned");
    }
}
