//! Telling registration caches that memory is going away, before it does.
//!
//! A [`crate::Device`] remembers, per allocation handle, the exports (dma-buf identities,
//! [`ExportId`]) made from it through the crate, and keeps weak references to the
//! [`Invalidate`] hooks subscribed to it (a [`crate::RegCache`] subscribes with
//! [`crate::RegCache::attach`]). Then:
//!
//! - before `PEERDIRECT_IOC_FREE` of a handle (an [`crate::Allocation`] dropped or freed,
//!   [`crate::Device::free_raw`]), every hook is told the handle's exports
//!   ([`Invalidate::exports_freed`]), so that it drops what it caches of them: a cached
//!   registration keeps its dma-buf, and so its HBM, alive, and must not be handed out for
//!   memory the caller gave back;
//! - before the file is closed (the [`crate::Device`] dropped, which frees what is left), the
//!   same for every handle still recorded;
//! - when a command on the file fails with `ENODEV` (the device was unbound, removed or
//!   reset: the module revoked its dma-bufs), every hook is told the device is gone
//!   ([`Invalidate::device_gone`]).
//!
//! - when the module says the device is going (the device file polls `POLLPRI | POLLHUP` once
//!   revocation starts), a thread the first subscription starts tells every hook at once
//!   ([`Invalidate::device_gone`]), without waiting for a command: removal of the device waits
//!   for importers that cannot be revoked (EFA's pinned memory registrations), so a cache must
//!   let go of its registrations by itself for the removal to finish;
//! - when the module says the device was reset (the file polls `POLLPRI` alone until a `read`
//!   returns the status page's new count of resets), the same thread reads the status and
//!   tells every hook ([`Invalidate::device_reset`]): the exports made before the reset are
//!   revoked, and a pinned registration of one would let the NIC reach the device while it
//!   resets.
//!
//! Hooks are held weakly: a cache that is dropped unsubscribes by itself. They run on the
//! thread that frees (or the watching thread), outside this module's locks.
//!
//! What the device and the caches tell each other, the exports' identities ([`ExportId`]) and
//! the file's status page ([`DeviceStatus`]), is defined here, below both.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::thread::{self, JoinHandle};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use rustix::io::Errno;
use serde::Serialize;

use crate::sys::status::StatusPage;
use crate::{uapi, DmaBuf};

/// Which export a registration maps: the peerdirect device it came from and the dma-buf.
///
/// The dma-buf is named by its inode number, which the kernel takes from a 64-bit counter
/// (`dma_buf_getfile`): unique for the life of the system, so two dma-bufs never share one,
/// even when the later one exports the same HBM after the first was freed. A cached entry can
/// therefore only ever be found again through the very dma-buf it was registered from, and a
/// reused allocation handle or HBM range can never alias a stale registration. The device
/// index is there so that a device's entries can be dropped at once when it goes away
/// ([`crate::RegCache::invalidate_device`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ExportId {
    device: u32,
    dma_buf_inode: u64,
}

impl ExportId {
    /// The export of `/dev/peerdirect<device>` whose dma-buf has inode number `dma_buf_inode`.
    pub const fn new(device: u32, dma_buf_inode: u64) -> Self {
        Self {
            device,
            dma_buf_inode,
        }
    }

    /// The identity of `dma_buf`, exported from `/dev/peerdirect<device>`: its inode number
    /// from `fstat`, which does not fail on an open dma-buf.
    pub fn of_dma_buf(device: u32, dma_buf: &DmaBuf) -> Result<Self, Errno> {
        let stat = rustix::fs::fstat(dma_buf.as_fd())?;
        Ok(Self::new(device, stat.st_ino))
    }

    /// The identity of a dma-buf exported by something else than peerdirect (habanalabs'
    /// `HL_MEM_OP_EXPORT_DMABUF_FD`, a GPU driver, udmabuf, another process): its inode number,
    /// under the pseudo-device [`ExportId::FOREIGN`]. No peerdirect device knows when its
    /// memory goes, so the caller invalidates its entries
    /// ([`crate::RegCache::invalidate_export`]) before that.
    pub fn foreign(dma_buf: &DmaBuf) -> Result<Self, Errno> {
        Self::of_dma_buf(Self::FOREIGN, dma_buf)
    }

    /// The device index of [`ExportId::foreign`] identities: no `/dev/peerdirectN` has it.
    pub const FOREIGN: u32 = u32::MAX;

    /// The index of the peerdirect device the dma-buf was exported from
    /// ([`ExportId::FOREIGN`] for others).
    pub const fn device(self) -> u32 {
        self.device
    }

    /// The dma-buf's inode number.
    pub const fn dma_buf_inode(self) -> u64 {
        self.dma_buf_inode
    }
}

/// A device file's status page (`PEERDIRECT_STATUS_OFFSET`), mapped read-only: tells, without
/// a system call, that the device is going away. Cheap to clone; stays valid (and then says
/// revoked) after the device is gone.
///
/// The mapping holds the device file open: until the last clone is dropped, closing the
/// [`crate::Device`] does not release the file (nor free its allocations). Registration
/// caches therefore let go of theirs when the [`crate::Device`] is dropped
/// ([`crate::RegCache::attach`]).
#[derive(Debug, Clone)]
pub struct DeviceStatus(Arc<StatusPage>);

impl DeviceStatus {
    /// The status of the file whose page `page` is.
    pub(crate) fn new(page: StatusPage) -> Self {
        Self(Arc::new(page))
    }

    /// Whether the module has started revoking the device's exports (unbind, removal, unload):
    /// registrations of them must not be handed out any more.
    pub fn revoked(&self) -> bool {
        self.0.state() & uapi::PEERDIRECT_STATUS_REVOKED != 0
    }

    /// Resets of the device begun since it was bound (owned devices only): each revokes
    /// every export made before it, so a registration made while this read N is stale once it
    /// reads more. The device stays, and exports made after a reset work.
    pub fn resets(&self) -> u32 {
        self.0.resets()
    }

    /// Whether `self` and `other` are the same mapping (of the same file).
    pub(crate) fn is(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Something that holds on to exports and must let go before their memory goes away: a
/// registration cache. Implemented by [`crate::RegCache`].
pub trait Invalidate: Send + Sync {
    /// The allocation these exports were made from is about to be freed: drop everything
    /// held for them.
    fn exports_freed(&self, exports: &[ExportId]);

    /// `/dev/peerdirect<device>` is gone (revoked, unbound, reset): drop everything held for
    /// its exports.
    fn device_gone(&self, device: u32);

    /// `/dev/peerdirect<device>` was reset: its status page counts one more reset, and the
    /// exports made before it are revoked (those made after work). Drop what is held for
    /// them; by default nothing (a hook that checks the status page learns it there).
    fn device_reset(&self, _device: u32) {}

    /// The device file whose status page `status` is, is being closed: let go of the page
    /// (a mapping of the file keeps the file open).
    fn file_closing(&self, _status: &DeviceStatus) {}
}

/// A device file's exports per allocation handle and the hooks subscribed to it.
#[derive(Default)]
pub(crate) struct Hooks {
    state: Arc<State>,
    watcher: Mutex<Option<Watcher>>,
    /// The file's status page, which hooks may hold until the file is closed.
    status: Mutex<Option<DeviceStatus>>,
}

#[derive(Default)]
struct State {
    subscribers: Mutex<Vec<Weak<dyn Invalidate>>>,
    exports: Mutex<HashMap<u32, Vec<ExportId>>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("subscribers", &lock(&self.state.subscribers).len())
            .field("exports", &*lock(&self.state.exports))
            .field("watching", &lock(&self.watcher).is_some())
            .finish()
    }
}

impl Drop for Hooks {
    /// The device file is being closed (the `Device` is dropped): it frees what is left. The
    /// watching thread is stopped first, so it never outlives the file.
    fn drop(&mut self) {
        drop(lock(&self.watcher).take());
        self.before_close();
    }
}

/// These locks guard plain collections that no code panics while updating.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Hooks {
    /// Adds `hook`, unless it is subscribed already; forgets hooks that are gone.
    pub(crate) fn subscribe(&self, hook: Weak<dyn Invalidate>) {
        let mut subscribers = lock(&self.state.subscribers);
        subscribers.retain(|s| s.strong_count() > 0);
        if !subscribers.iter().any(|s| Weak::ptr_eq(s, &hook)) {
            subscribers.push(hook);
        }
    }

    /// How many live hooks are subscribed.
    #[cfg(test)]
    pub(crate) fn subscribers(&self) -> usize {
        lock(&self.state.subscribers)
            .iter()
            .filter(|s| s.strong_count() > 0)
            .count()
    }

    /// Records that `export` was made from allocation `handle`.
    pub(crate) fn exported(&self, handle: u32, export: ExportId) {
        lock(&self.state.exports)
            .entry(handle)
            .or_default()
            .push(export);
    }

    /// Allocation `handle` is about to be freed: tells every hook its exports (they stay
    /// recorded until [`Hooks::freed`]). Returns how many exports that was.
    pub(crate) fn before_free(&self, handle: u32) -> usize {
        let exports = lock(&self.state.exports)
            .get(&handle)
            .cloned()
            .unwrap_or_default();
        self.notify_freed(&exports);
        exports.len()
    }

    /// The allocation `handle` was freed (the module said so): forgets its exports. Until
    /// then they stay recorded, so that a free that failed (the allocation, and what the
    /// caches may register of it again, still there) is told to the hooks again when retried.
    pub(crate) fn freed(&self, handle: u32) {
        lock(&self.state.exports).remove(&handle);
    }

    /// The file is about to be closed, freeing every allocation left: like
    /// [`Hooks::before_free`] for each.
    pub(crate) fn before_close(&self) -> usize {
        let exports: Vec<ExportId> = lock(&self.state.exports)
            .drain()
            .flat_map(|(_, e)| e)
            .collect();
        self.notify_freed(&exports);
        if let Some(status) = lock(&self.status).take() {
            for hook in self.live() {
                hook.file_closing(&status);
            }
        }
        exports.len()
    }

    /// Remembers the file's status page, to tell hooks when the file is closed.
    pub(crate) fn set_status(&self, status: DeviceStatus) {
        *lock(&self.status) = Some(status);
    }

    /// Device `device` is gone: tells every hook, and forgets every export.
    pub(crate) fn device_gone(&self, device: u32) {
        self.state.device_gone(device);
    }

    /// Starts the thread that tells the hooks as soon as the device file `fd` (device
    /// `device`) says the device is going, unless it runs already.
    pub(crate) fn watch(&self, fd: BorrowedFd<'_>, device: u32) -> io::Result<()> {
        let mut watcher = lock(&self.watcher);
        if watcher.is_none() {
            *watcher = Some(Watcher::start(fd, device, self.state.clone())?);
        }
        Ok(())
    }

    fn notify_freed(&self, exports: &[ExportId]) {
        if exports.is_empty() {
            return;
        }
        for hook in self.live() {
            hook.exports_freed(exports);
        }
    }

    fn live(&self) -> Vec<Arc<dyn Invalidate>> {
        self.state.live()
    }
}

impl State {
    fn device_gone(&self, device: u32) {
        lock(&self.exports).clear();
        for hook in self.live() {
            hook.device_gone(device);
        }
    }

    fn device_reset(&self, device: u32) {
        for hook in self.live() {
            hook.device_reset(device);
        }
    }

    /// The hooks still alive, so that they run without this module's locks held.
    fn live(&self) -> Vec<Arc<dyn Invalidate>> {
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|s| s.strong_count() > 0);
        subscribers.iter().filter_map(Weak::upgrade).collect()
    }
}

/// A thread that waits for the device file to poll `POLLPRI`: with `POLLHUP`, the module
/// started revoking the device (the thread tells the hooks and ends); alone, the device was
/// reset (the thread reads the status, which ends the event, tells the hooks and goes on). A
/// module without `poll` never answers so (the file then polls only `POLLIN | POLLOUT`, which
/// the thread does not ask for), and the thread just waits to be stopped: the status page and
/// `ENODEV` remain the ways to learn.
struct Watcher {
    /// Written to stop the thread.
    stop: OwnedFd,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    fn start(fd: BorrowedFd<'_>, device: u32, state: Arc<State>) -> io::Result<Self> {
        // The thread's own reference to the file; `Hooks::drop` stops the thread before the
        // `Device` closes its own.
        let fd = fd.try_clone_to_owned()?;
        let stop = eventfd(0, EventfdFlags::CLOEXEC)?;
        let stopped = stop.try_clone()?;
        let thread = thread::Builder::new()
            .name(format!("peerdirect{device}-watch"))
            .spawn(move || loop {
                match next_event(&fd, &stopped) {
                    Event::Gone => return state.device_gone(device),
                    Event::Reset => state.device_reset(device),
                    Event::Stopped => return,
                }
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

/// What a device file's watcher learned.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    /// The device is going: its file polls `POLLHUP` (or `POLLERR`).
    Gone,
    /// The device was reset, and the status read: `POLLPRI` alone.
    Reset,
    /// `stop` was written, or the file cannot be polled or read.
    Stopped,
}

/// Waits until `fd` says the device is going or was reset (then reads its status, which ends
/// the reset's event), or `stop` is written.
fn next_event(fd: &OwnedFd, stop: &OwnedFd) -> Event {
    loop {
        let mut fds = [
            PollFd::new(fd, PollFlags::PRI),
            PollFd::new(stop, PollFlags::IN),
        ];
        match poll(&mut fds, None) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(_) => return Event::Stopped,
        }
        if !fds[1].revents().is_empty() {
            return Event::Stopped;
        }
        let events = fds[0].revents();
        if events.intersects(PollFlags::HUP | PollFlags::ERR) {
            return Event::Gone;
        }
        if events.contains(PollFlags::PRI) {
            let mut status = [0u8; size_of::<uapi::peerdirect_status>()];
            // A file that polls `POLLPRI` but cannot say why would wake the thread forever.
            return match rustix::io::read(fd, &mut status) {
                Ok(_) => Event::Reset,
                Err(_) => Event::Stopped,
            };
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // An eventfd write of 1 cannot block or fail short of a broken fd, and then the
        // thread's poll fails and it ends anyway.
        let _ = rustix::io::write(&self.stop, &1u64.to_ne_bytes());
        if let Some(thread) = self.thread.take() {
            // Dropped by a hook the thread itself runs (a callback that closes the device):
            // it cannot wait for itself; it ends once that hook returns (it was told to stop).
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        freed: Mutex<Vec<ExportId>>,
        gone: Mutex<Vec<u32>>,
    }

    impl Invalidate for Recorder {
        fn exports_freed(&self, exports: &[ExportId]) {
            self.freed.lock().unwrap().extend_from_slice(exports);
        }
        fn device_gone(&self, device: u32) {
            self.gone.lock().unwrap().push(device);
        }
    }

    fn weak(recorder: &Arc<Recorder>) -> Weak<dyn Invalidate> {
        let weak: Weak<Recorder> = Arc::downgrade(recorder);
        weak
    }

    #[test]
    fn free_tells_every_hook_the_handles_exports_until_it_succeeds() {
        let hooks = Hooks::default();
        let (a, b) = (Arc::new(Recorder::default()), Arc::new(Recorder::default()));
        hooks.subscribe(weak(&a));
        hooks.subscribe(weak(&a)); // once only
        hooks.subscribe(weak(&b));
        assert_eq!(hooks.subscribers(), 2);
        hooks.exported(1, ExportId::new(0, 10));
        hooks.exported(1, ExportId::new(0, 11));
        hooks.exported(2, ExportId::new(0, 20));
        assert_eq!(hooks.before_free(1), 2);
        for r in [&a, &b] {
            assert_eq!(
                *r.freed.lock().unwrap(),
                [ExportId::new(0, 10), ExportId::new(0, 11)]
            );
        }
        // Still recorded until the free succeeded: a retried free tells them again.
        assert_eq!(hooks.before_free(1), 2);
        assert_eq!(a.freed.lock().unwrap().len(), 4);
        a.freed.lock().unwrap().truncate(2);
        // Freed: a second free (ENOENT in the kernel) tells nobody anything.
        hooks.freed(1);
        assert_eq!(hooks.before_free(1), 0);
        assert_eq!(a.freed.lock().unwrap().len(), 2);
        assert_eq!(hooks.before_close(), 1);
        assert_eq!(a.freed.lock().unwrap()[2], ExportId::new(0, 20));
        assert_eq!(hooks.before_close(), 0);
    }

    #[test]
    fn dropped_hooks_unsubscribe_themselves() {
        let hooks = Hooks::default();
        let a = Arc::new(Recorder::default());
        hooks.subscribe(weak(&a));
        drop(a);
        assert_eq!(hooks.subscribers(), 0);
        hooks.exported(3, ExportId::new(1, 30));
        assert_eq!(hooks.before_free(3), 1); // nobody to tell; no panic
        let b = Arc::new(Recorder::default());
        hooks.subscribe(weak(&b));
        hooks.device_gone(1);
        assert_eq!(*b.gone.lock().unwrap(), [1]);
    }

    /// Waits up to 5 s for `done`.
    fn eventually(done: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        true
    }

    #[test]
    fn the_watcher_tells_hooks_once_the_file_says_so() {
        use std::os::fd::AsFd;
        let hooks = Hooks::default();
        let a = Arc::new(Recorder::default());
        hooks.subscribe(weak(&a));
        // A pipe whose writer goes away polls POLLHUP, as a device file does once revoked.
        let (reader, writer) = std::io::pipe().unwrap();
        hooks.watch(reader.as_fd(), 7).unwrap();
        hooks.watch(reader.as_fd(), 7).unwrap(); // one thread only
        hooks.exported(1, ExportId::new(7, 10));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(a.gone.lock().unwrap().is_empty());
        drop(writer);
        assert!(eventually(|| *a.gone.lock().unwrap() == [7]));
        // Told once, and the exports are forgotten: closing tells nobody of them again.
        assert_eq!(hooks.before_close(), 0);
    }

    /// A hook run by the watcher thread may drop the `Hooks` that own the thread (a C callback
    /// closing the device): the thread does not try to join itself.
    #[test]
    fn a_hook_on_the_watcher_thread_may_drop_the_hooks() {
        use std::os::fd::AsFd;
        struct Closer {
            hooks: Mutex<Option<Hooks>>,
            dropped: std::sync::atomic::AtomicBool,
        }
        impl Invalidate for Closer {
            fn exports_freed(&self, _: &[ExportId]) {}
            fn device_gone(&self, _: u32) {
                drop(self.hooks.lock().unwrap().take());
                self.dropped
                    .store(true, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let closer = Arc::new(Closer {
            hooks: Mutex::new(Some(Hooks::default())),
            dropped: std::sync::atomic::AtomicBool::new(false),
        });
        let (reader, writer) = std::io::pipe().unwrap();
        {
            let hooks = closer.hooks.lock().unwrap();
            let hooks = hooks.as_ref().unwrap();
            let weak: Weak<Closer> = Arc::downgrade(&closer);
            hooks.subscribe(weak);
            hooks.watch(reader.as_fd(), 5).unwrap();
        }
        drop(writer); // POLLHUP: the device is going
        assert!(eventually(|| closer
            .dropped
            .load(std::sync::atomic::Ordering::SeqCst)));
    }

    #[test]
    fn dropping_the_hooks_stops_the_watcher() {
        use std::os::fd::AsFd;
        let hooks = Hooks::default();
        let a = Arc::new(Recorder::default());
        hooks.subscribe(weak(&a));
        let (reader, writer) = std::io::pipe().unwrap();
        hooks.watch(reader.as_fd(), 3).unwrap();
        let start = std::time::Instant::now();
        drop(hooks);
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
        drop(writer);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(a.gone.lock().unwrap().is_empty());
    }
}
