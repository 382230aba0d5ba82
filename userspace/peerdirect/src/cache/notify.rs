//! Where the listener is told: on a thread of the cache's own, never on a thread that calls
//! into the cache, so never with a lock the caller holds around a request.
//!
//! An invalidation a request discovers (a revoked or reset device, seen by `get` or by a
//! command failing with `ENODEV`, or reported by the device's watcher) is queued and the
//! request goes on. An explicit one (`invalidate_*`, a free through the crate) waits until the
//! listener has been told and the registrations no handle holds are deregistered, as its
//! callers rely on (a domain is closed right after). From the listener itself, calls into the
//! cache work: what they invalidate is told there and then, nested, since the thread cannot
//! wait for itself.
//!
//! The thread starts with the first invalidation that finds a listener, and ends when the
//! cache is dropped, after telling what was queued. A listener that panics is reported on
//! standard error (queued) or to the waiting caller (explicit), and the thread goes on; so
//! is a registrar that panics deregistering what was told of, as a panic of its own
//! ([`DEREGISTERING`]), after the listener has been told.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{self, JoinHandle, ThreadId};

/// Whether the invalidating call waits for the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Delivery {
    /// Explicit: return once told and deregistered.
    Wait,
    /// Discovered by a request, a failed command or the watcher: queued.
    Queue,
}

type Panic = Box<dyn Any + Send>;

/// Telling: given the listener now set (if any), tells it and lets go of what it told of.
type Tell<L> = Box<dyn FnOnce(Option<&L>) + Send>;

/// What the thread is given (no telling: a barrier), and where to say it is done (with the
/// listener's panic, if it panicked).
struct Job<L> {
    tell: Option<Tell<L>>,
    done: Option<SyncSender<Option<Panic>>>,
}

struct Running<L> {
    jobs: Sender<Job<L>>,
    thread: JoinHandle<()>,
}

/// Runs the tellings of a listener of type `L` on a thread of its own.
pub(super) struct Notifier<L> {
    listener: Arc<Mutex<Option<L>>>,
    running: Mutex<Option<Running<L>>>,
    /// The thread's id, set by the thread before it tells anything (it never changes after).
    thread: Arc<OnceLock<ThreadId>>,
}

impl<L> Default for Notifier<L> {
    fn default() -> Self {
        Self {
            listener: Arc::default(),
            running: Mutex::default(),
            thread: Arc::default(),
        }
    }
}

impl<L: Clone + Send + 'static> Notifier<L> {
    /// Replaces the listener; returns once no call of the one it replaces runs or is queued
    /// (unless called from the listener: it cannot wait for itself).
    pub(super) fn set(&self, listener: Option<L>) {
        *lock(&self.listener) = listener;
        self.wait_told();
    }

    /// Returns once every invalidation queued before has been told (and its idle
    /// registrations deregistered).
    pub(super) fn wait_told(&self) {
        // Not started: nothing was ever queued (and no thread is started for nothing).
        if self.on_thread() || lock(&self.running).is_none() {
            return;
        }
        let (done, wait) = mpsc::sync_channel(1);
        let job = Job {
            tell: None,
            done: Some(done),
        };
        if self.send(job).is_ok() {
            // A barrier calls nothing of the caller's: it cannot panic.
            let _ = wait.recv();
        }
    }

    /// Runs `tell` with the listener: at once without a listener (it tells nobody), from the
    /// listener's own calls nested, else on the thread, waiting for it as `delivery` says.
    pub(super) fn tell(&self, tell: impl FnOnce(Option<&L>) + Send + 'static, delivery: Delivery) {
        if lock(&self.listener).is_none() {
            tell(None);
            return;
        }
        if self.on_thread() {
            if let Some(panic) = run(&self.listener, Box::new(tell)) {
                panic::resume_unwind(panic);
            }
            return;
        }
        let (done, wait) = match delivery {
            Delivery::Wait => {
                let (done, wait) = mpsc::sync_channel(1);
                (Some(done), Some(wait))
            }
            Delivery::Queue => (None, None),
        };
        let job = Job {
            tell: Some(Box::new(tell)),
            done,
        };
        match self.send(job) {
            Err(job) => {
                // No thread could be started: told here, as the only way left.
                if let Some(panic) = job.tell.and_then(|tell| run(&self.listener, tell)) {
                    panic::resume_unwind(panic);
                }
            }
            Ok(()) => {
                if let Some(Ok(Some(panic))) = wait.map(|wait| wait.recv()) {
                    panic::resume_unwind(panic);
                }
            }
        }
    }

    fn on_thread(&self) -> bool {
        self.thread.get() == Some(&thread::current().id())
    }

    /// Queues `job`, starting the thread if it is not running; gives the job back if it
    /// cannot be started.
    fn send(&self, job: Job<L>) -> Result<(), Job<L>> {
        let mut running = lock(&self.running);
        if running.is_none() {
            let (jobs, queue) = mpsc::channel();
            let (listener, id) = (Arc::clone(&self.listener), Arc::clone(&self.thread));
            let thread = thread::Builder::new()
                .name("peerdirect-tell".into())
                .spawn(move || {
                    // Before any listener call, so that the listener's own calls into the
                    // cache know they run here.
                    let _ = id.set(thread::current().id());
                    // An invalidation made inside a registration waits for this thread: it
                    // must not wait for that registration's turn.
                    super::turns::listener_thread();
                    serve(&listener, &queue);
                });
            let Ok(thread) = thread else {
                return Err(job);
            };
            *running = Some(Running { jobs, thread });
        }
        let Some(run) = running.as_ref() else {
            return Err(job);
        };
        run.jobs.send(job).map_err(|mpsc::SendError(job)| job)
    }
}

impl<L> Drop for Notifier<L> {
    fn drop(&mut self) {
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(Running { jobs, thread }) = running {
            // The thread tells what is queued, then ends. Dropped from the listener (its
            // closure held the last reference to the cache): the thread ends by itself.
            drop(jobs);
            if self.thread.get() != Some(&thread::current().id()) {
                let _ = thread.join();
            }
        }
    }
}

/// The thread: runs each job, in order, until the cache is dropped.
fn serve<L: Clone>(listener: &Mutex<Option<L>>, queue: &Receiver<Job<L>>) {
    for job in queue {
        let panic = job.tell.and_then(|tell| run(listener, tell));
        match job.done {
            Some(done) => {
                let _ = done.send(panic);
            }
            None => {
                if let Some(panic) = panic {
                    eprintln!("peerdirect: {}", describe(&*panic));
                }
            }
        }
    }
}

/// How the message of a panic raised while the registrations an invalidation took were
/// deregistered (the registrar's `deregister`: a bug of the registrar, not of the listener)
/// starts: the panic goes on as this and the registrar's message, a `String`.
const DEREGISTERING: &str =
    "deregistering an invalidated registration panicked (a bug in the registrar): ";

/// Runs `f`; its panic, if it panicked.
pub(super) fn caught(f: impl FnOnce()) -> Option<Panic> {
    panic::catch_unwind(AssertUnwindSafe(f)).err()
}

/// Goes on with the panic of a telling, if any: the listener's (`told`), else that of the
/// deregistration after it, its message prefixed with [`DEREGISTERING`]. With both, the
/// deregistration's is said on standard error and the listener's goes on.
pub(super) fn resume(told: Option<Panic>, deregistered: Option<Panic>) {
    let deregistered = deregistered.map(|panic| format!("{DEREGISTERING}{}", message(&*panic)));
    match (told, deregistered) {
        (Some(told), Some(also)) => {
            eprintln!("peerdirect: {also}");
            panic::resume_unwind(told)
        }
        (Some(panic), None) => panic::resume_unwind(panic),
        (None, Some(deregistering)) => panic::resume_unwind(Box::new(deregistering)),
        (None, None) => {}
    }
}

/// What panicked while telling, and its message: the listener, or a deregistration.
fn describe(panic: &(dyn Any + Send)) -> String {
    let message = message(panic);
    if message.starts_with(DEREGISTERING) {
        message.to_owned()
    } else {
        format!("the registration cache's invalidation listener panicked: {message}")
    }
}

/// Runs `tell` with the listener set now; its panic, if it panicked.
fn run<L: Clone>(listener: &Mutex<Option<L>>, tell: Tell<L>) -> Option<Panic> {
    let listener = lock(listener).clone();
    panic::catch_unwind(AssertUnwindSafe(move || tell(listener.as_ref()))).err()
}

fn message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(not a string)")
}

// Only a listener or a handle is stored under these: a poisoned lock holds good values.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
