//! A read-write lock for data read far more often than written, whose readers write only a
//! cache line of their own thread.
//!
//! A `std::sync::RwLock` read costs two locked read-modify-writes of the lock's word, which
//! every reader in every thread writes: the line moves between the CPUs of threads that only
//! read, and on one CPU the two instructions were a third of a cache hit. Here a reader with a
//! [slot](super::slot) marks its slot's line, checks that nobody holds the lock's word, reads,
//! and clears its mark: one locked instruction (the marking swap, a full barrier) on a line no
//! other thread writes, and a plain store; none at all while the lock is biased (below). A
//! writer takes the word (a futex: one compare-and-swap when nobody holds it), and waits until
//! no slot is marked; it lets go with one swap. Taking the word is also what tells readers
//! that a writer may be in: one locked instruction on each side of a write, where a mutex and
//! a separate flag took three, each about 20 ns of a miss on this project's hosts.
//!
//! # Why a reader and a writer never overlap
//!
//! The reader's mark (a SeqCst swap) and its check of the word (a SeqCst load), and the
//! writer's taking of the word (a SeqCst read-modify-write) and its reads of the marks (SeqCst
//! loads), are all in the single total order S of SeqCst operations, each pair in the order
//! its thread makes them. Take a reader's mark M and check C, and a writer's taking W and its
//! read R of the reader's mark:
//! - M before R in S: R reads the mark, or the reader's later clearing (a release store, so
//!   all the reader's reads happen before the writer goes on). A writer that reads the mark
//!   waits for the clearing.
//! - R before M: then W < R < M < C in S, so C reads W's value (held) or a later one: the
//!   reader backs off, or reads the word let go of by that writer (or a later holder), a
//!   release that its SeqCst load synchronizes with, after which all that writer's writes
//!   happen before the read. (C cannot read an older letting go: that one happens before W,
//!   which read from it.)
//!
//! A writer only reads the marks of slots that were handed out ([`super::slot::handed_out`]);
//! a thread that takes a new slot stores the count SeqCst before its first mark, so a writer
//! that read the old count precedes the mark in S, and the reader sees it (second case).
//! Threads without a slot (more threads than slots) mark one counter that they share, with a
//! SeqCst add instead of the swap; the writer reads it after the slots' marks, and the same
//! argument holds.
//!
//! # The bias
//!
//! Where the kernel has `membarrier` ([`super::barrier`]), readers save the `xchg` too while
//! the lock is *biased*: a reader marks with a plain store and a compiler fence, then checks
//! that nobody holds the word and that the bias still holds. A writer that finds the bias set
//! (it reads and clears it holding the word) runs the heavy barrier before it reads the
//! marks: every reader's CPU executes a full barrier meanwhile, so a reader's plain mark made
//! before is visible to the writer's reads, and a reader's checks made after see the word
//! held or the bias gone. Either way they do not overlap (the same two cases as above, with
//! the heavy barrier in place of the SeqCst order). A reader that sees the bias gone marks
//! again with the `xchg`. A writer that finds the bias clear runs no barrier: every plain mark
//! still set was made before the barrier of the writer that cleared the bias, and is visible.
//! The bias comes back when a thread has made [`UNBIASED_READS`] reads since it last tried,
//! and [`BIAS_BACKOFF`] times as long as the last heavy barrier took has passed since it:
//! that thread sets it holding the word, where no writer is, so the next writer sees it. A
//! workload of hits keeps the bias; in one of misses (a write after each read) writers spend
//! at most about 1% of their time in heavy barriers.
//!
//! A reader that finds the word held clears its mark and waits for the word, marks itself
//! while holding it (no writer is then in: a writer holds the word from before it reads the
//! marks until after its last write), and lets go at once; it reads under its mark. The
//! readers that wait for the word are those that found it held, by a writer or by another
//! such reader (or one restoring the bias): the word is let go of before a woken waiter takes
//! it, so readers that arrive meanwhile go in without waiting.
//!
//! Not reentrant: a thread holding a read guard must not take another guard of the same lock
//! (its second read would clear the first's mark; a write would wait for its own mark).
//!
//! The lock's `unsafe` code: the guards' access to the data, each block proved by the
//! arguments above.

#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::hint::spin_loop;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{
    compiler_fence, AtomicBool, AtomicU32, AtomicU64,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};
use std::thread;

use rustix::thread::futex;

use super::barrier;
use super::slot::{self, SLOTS};

/// How often a writer spins on a reader's mark before it yields its CPU instead, and a thread
/// on a held word before it sleeps: a read holds the mark for tens of nanoseconds, and a
/// write the word for hundreds, unless its thread was preempted.
const SPINS: u32 = 100;

/// How many reads a thread makes through the unbiased path before it restores the bias (see
/// [`ReadMostly::read`]): a writer that ends a bias pays a heavy barrier (0.2 to 1.5 us), so
/// it does at most once per this many reads of a thread, for readers that save an `xchg`
/// (about 10 ns) each while the bias lasts.
const UNBIASED_READS: u32 = 1024;

/// After a writer ends the bias, it stays off for this many times as long as the writer's
/// heavy barrier took (as the BRAVO lock does, Dice and Kogan, 2019): with writers in several
/// threads a thread reaches [`UNBIASED_READS`] often, and a barrier then costs 1 to 30 us on
/// this project's 2-CPU hosts.
const BIAS_BACKOFF: u64 = 100;

/// The lock's word: nobody holds it.
const FREE: u32 = 0;
/// Held, and nobody sleeps waiting for it.
const HELD: u32 = 1;
/// Held, and a thread may sleep waiting for it: letting go wakes one.
const CONTENDED: u32 = 2;

/// When a lock biases its readers.
#[derive(Clone, Copy)]
struct Bias {
    /// How many reads without the bias a thread makes before it tries to restore it.
    after_reads: u32,
    /// How many times the last heavy barrier's duration must pass before it may.
    backoff: u64,
}

/// Nanoseconds on a clock of the process's own (monotonic, from its first call).
fn now_ns() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let elapsed = START.get_or_init(std::time::Instant::now).elapsed();
    u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
}

/// A slot's line, written only by the slot's owner.
#[repr(align(64))]
struct Mark {
    /// Set while the owner reads.
    marked: AtomicBool,
    /// Reads the owner made through the unbiased path since it last restored the bias.
    unbiased_reads: AtomicU32,
}

/// The readers without a slot: how many read now. On a line of its own.
#[repr(align(64))]
struct Shared(AtomicU32);

/// Guards a `T`: many readers, or one writer.
pub struct ReadMostly<T> {
    /// [`FREE`], [`HELD`] or [`CONTENDED`] (a futex). Held by a writer, and by a reader
    /// that found it held, while it marks itself.
    word: AtomicU32,
    /// While set, readers mark with a plain store (module comment, "The bias"). Changed only
    /// holding the word: set by a reader, cleared by a writer, which then runs the heavy
    /// barrier.
    biased: AtomicBool,
    /// When readers may restore the bias; `None`: never (the heavy barrier is not
    /// available).
    bias: Option<Bias>,
    /// Before this time ([`now_ns`]) no reader restores the bias: set by the writer that
    /// ended it. A heuristic: read and written with no ordering.
    bias_backoff_until: AtomicU64,
    /// Set by a write guard dropped in a panic: the data may be half updated.
    poisoned: AtomicBool,
    marks: [Mark; SLOTS],
    shared: Shared,
    data: UnsafeCell<T>,
}

// SAFETY: the lock hands out `&T` to readers in several threads at once (so `T: Sync`) and
// `&mut T` to one writer in any thread (so `T: Send`), never both at once (see the module's
// proof); the lock's own fields are atomics.
unsafe impl<T: Send + Sync> Sync for ReadMostly<T> {}

/// The lock was poisoned: a writer panicked while it held it.
#[derive(Debug)]
pub struct Poisoned;

/// How a read guard holds the lock.
enum Held {
    /// The slot's mark is set.
    Marked(usize),
    /// The thread has no slot: it counts in [`ReadMostly::shared`].
    Shared,
}

/// Shared access; dropping it ends the read. Not `Send`: a mark belongs to its thread's slot.
pub struct ReadGuard<'a, T> {
    lock: &'a ReadMostly<T>,
    held: Held,
    _not_send: PhantomData<*const ()>,
}

/// Exclusive access; dropping it lets readers and writers in.
pub struct WriteGuard<'a, T> {
    lock: &'a ReadMostly<T>,
}

impl<T> ReadMostly<T> {
    /// Guards `data`, biased when the heavy barrier is available.
    pub fn new(data: T) -> Self {
        Self::with_bias(
            data,
            Some(Bias {
                after_reads: UNBIASED_READS,
                backoff: BIAS_BACKOFF,
            }),
        )
    }

    /// A lock that biases its readers as `bias` says, or never (`None`, or no heavy barrier).
    /// Tests restore the bias after every unbiased read, with no backoff, so that nearly
    /// every write ends a bias.
    fn with_bias(data: T, bias: Option<Bias>) -> Self {
        let bias = bias.filter(|_| barrier::available()).map(|bias| Bias {
            after_reads: bias.after_reads.max(1),
            ..bias
        });
        Self {
            word: AtomicU32::new(FREE),
            biased: AtomicBool::new(bias.is_some()),
            bias,
            bias_backoff_until: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            marks: std::array::from_fn(|_| Mark {
                marked: AtomicBool::new(false),
                unbiased_reads: AtomicU32::new(0),
            }),
            shared: Shared(AtomicU32::new(0)),
            data: UnsafeCell::new(data),
        }
    }

    /// Shared access, waiting for a writer that holds the lock. Always inlined: as a call (which
    /// the compiler chose in the cache's benchmark) a hit took 6 to 15 ns longer.
    #[inline(always)]
    pub fn read(&self) -> Result<ReadGuard<'_, T>, Poisoned> {
        let held = match slot::current() {
            Some(slot) => {
                let mark = &self.marks[slot];
                debug_assert!(
                    !mark.marked.load(Relaxed),
                    "a thread read-locked a lock it reads"
                );
                if !self.biased.load(Relaxed) || !self.mark_biased(&mark.marked) {
                    self.mark_unbiased(mark);
                }
                Held::Marked(slot)
            }
            None => {
                self.mark_shared();
                Held::Shared
            }
        };
        let guard = ReadGuard {
            lock: self,
            held,
            _not_send: PhantomData,
        };
        // Relaxed: a panicking writer sets it before it lets go of the word, and this read
        // is ordered after that.
        if self.poisoned.load(Relaxed) {
            return Err(Poisoned);
        }
        Ok(guard)
    }

    /// Marks `marked` with a plain store while the bias holds: whether nobody held the word
    /// and the bias still held after the mark (else the mark is cleared again).
    #[inline(always)]
    fn mark_biased(&self, marked: &AtomicBool) -> bool {
        marked.store(true, Relaxed);
        // The light side of the barrier: a writer's heavy barrier orders this store before
        // the loads below, as a full fence would (module comment, "The bias").
        compiler_fence(SeqCst);
        // Acquire: the writes of the writer that let go of the word happen before this read.
        if self.word.load(Acquire) == FREE && self.biased.load(Relaxed) {
            return true;
        }
        marked.store(false, Release);
        false
    }

    /// Marks `mark` with a full barrier (the `xchg` of a SeqCst swap), waiting for a writer
    /// that is in, and every `bias.after_reads` such reads restores the bias if the backoff
    /// has passed.
    #[inline(always)]
    fn mark_unbiased(&self, mark: &Mark) {
        if let Some(bias) = self.bias {
            // At most `after_reads`: no overflow.
            let reads = mark.unbiased_reads.load(Relaxed) + 1;
            if reads >= bias.after_reads {
                mark.unbiased_reads.store(0, Relaxed);
                if now_ns() >= self.bias_backoff_until.load(Relaxed) {
                    self.restore_bias();
                }
            } else {
                mark.unbiased_reads.store(reads, Relaxed);
            }
        }
        mark.marked.swap(true, SeqCst);
        if self.word.load(SeqCst) != FREE {
            self.mark_holding_word(
                || mark.marked.store(false, Release),
                || {
                    // Relaxed: a writer that takes the word after this thread lets go of it
                    // reads the mark after its taking synchronizes with the letting go.
                    mark.marked.store(true, Relaxed);
                },
            );
        }
    }

    /// Counts a reader without a slot in the shared counter, like [`Self::mark_unbiased`]
    /// (never biased: the counter is written by every such thread).
    #[cold]
    #[inline(never)]
    fn mark_shared(&self) {
        let count = &self.shared.0;
        count.fetch_add(1, SeqCst);
        if self.word.load(SeqCst) != FREE {
            self.mark_holding_word(
                || {
                    count.fetch_sub(1, Release);
                },
                || {
                    count.fetch_add(1, Relaxed);
                },
            );
        }
    }

    /// Sets the bias, holding the word: no writer is in, and the next one sees it set and ends
    /// it with the heavy barrier. Called with the caller's mark clear (a writer holding the
    /// word may be waiting for marks).
    #[cold]
    #[inline(never)]
    fn restore_bias(&self) {
        self.take_word();
        self.biased.store(true, Relaxed);
        self.let_go_of_word();
    }

    /// The slow path of a read that found the word held: `unmark`s, waits for the word, and
    /// `mark`s while holding it.
    #[cold]
    #[inline(never)]
    fn mark_holding_word(&self, unmark: impl FnOnce(), mark: impl FnOnce()) {
        unmark();
        self.take_word();
        mark();
        self.let_go_of_word();
    }

    /// Exclusive access, waiting for the writer or the readers that hold the lock.
    #[inline(always)]
    pub fn write(&self) -> Result<WriteGuard<'_, T>, Poisoned> {
        debug_assert!(
            slot::current().is_none_or(|slot| !self.marks[slot].marked.load(Relaxed)),
            "a thread write-locked a lock it reads"
        );
        // When the bias looks set, the clock before the word and after the marks times the
        // heavy barrier (with the waits around it: a longer backoff), read outside the window
        // between the barrier and the loads of the marks.
        let start = self.biased.load(Relaxed).then(now_ns);
        self.take_word();
        // Holding the word, so no reader sets it meanwhile.
        let ended_bias = self.biased.load(Relaxed);
        if ended_bias {
            self.biased.store(false, Relaxed);
            // Readers that marked with a plain store before this have their marks visible
            // to the loads below; those that load after it see the word held or the bias
            // gone, and mark again with a full barrier.
            barrier::heavy();
        }
        for mark in &self.marks[..slot::handed_out()] {
            Self::wait_until(|| !mark.marked.load(SeqCst));
        }
        Self::wait_until(|| self.shared.0.load(SeqCst) == 0);
        if ended_bias {
            let end = now_ns();
            let took = start.map_or(0, |start| end.saturating_sub(start));
            let backoff = self.bias.map_or(0, |bias| bias.backoff);
            self.bias_backoff_until
                .store(end.saturating_add(took.saturating_mul(backoff)), Relaxed);
        }
        let guard = WriteGuard { lock: self };
        #[cfg(test)]
        WRITING_HERE.with(|n| n.set(n.get() + 1));
        if self.poisoned.load(Relaxed) {
            return Err(Poisoned);
        }
        Ok(guard)
    }

    /// Spins, then yields, until `done`: readers hold their marks briefly unless preempted.
    #[inline(always)]
    fn wait_until(done: impl Fn() -> bool) {
        let mut spins = 0;
        while !done() {
            if spins < SPINS {
                spins += 1;
                spin_loop();
            } else {
                thread::yield_now();
            }
        }
    }

    /// Takes the word (the module comment's W when a writer takes it): a SeqCst
    /// read-modify-write that finds it [`FREE`].
    #[inline(always)]
    fn take_word(&self) {
        if self
            .word
            .compare_exchange(FREE, HELD, SeqCst, Relaxed)
            .is_err()
        {
            self.take_contended_word();
        }
    }

    /// Waits for the word: spins while its holder has nobody waiting (it is likely running
    /// and near the end), then says that it waits ([`CONTENDED`]) and sleeps until woken.
    #[cold]
    #[inline(never)]
    fn take_contended_word(&self) {
        for _ in 0..SPINS {
            match self.word.load(Relaxed) {
                FREE => {
                    if self
                        .word
                        .compare_exchange(FREE, HELD, SeqCst, Relaxed)
                        .is_ok()
                    {
                        return;
                    }
                }
                HELD => {}
                _ => break,
            }
            spin_loop();
        }
        // Taken with `CONTENDED` from here on, though nobody may be waiting any more: one
        // wake too many, never one too few.
        while self.word.swap(CONTENDED, SeqCst) != FREE {
            // Returns at once if the word is no longer `CONTENDED` (EAGAIN) or on a signal
            // (EINTR): either way, try again.
            let _ = futex::wait(&self.word, futex::Flags::PRIVATE, CONTENDED, None);
        }
    }

    /// Lets go of the word (a release, which readers' and the next holder's loads
    /// synchronize with), waking one thread that may sleep waiting for it.
    #[inline(always)]
    fn let_go_of_word(&self) {
        if self.word.swap(FREE, Release) == CONTENDED {
            self.wake_one();
        }
    }

    #[cold]
    #[inline(never)]
    fn wake_one(&self) {
        // Fails only for an invalid address or operation, neither of which this is.
        let _ = futex::wake(&self.word, futex::Flags::PRIVATE, 1);
    }
}

impl<T> ReadGuard<'_, T> {
    /// The calling thread's slot, if it reads through one ([`slot::current`], looked up once).
    #[inline]
    pub(super) fn slot(&self) -> Option<usize> {
        match self.held {
            Held::Marked(slot) => Some(slot),
            Held::Shared => None,
        }
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;

    #[inline]
    fn deref(&self) -> &T {
        // While this guard lives its mark (its slot's, or its count in the shared counter) is
        // set, and it was set while no writer was in.
        // SAFETY: so no writer has access (module proof), and readers only share.
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> Drop for ReadGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        // Release: this read happens before the write of a writer that sees the mark clear.
        match self.held {
            Held::Marked(slot) => self.lock.marks[slot].marked.store(false, Release),
            Held::Shared => {
                self.lock.shared.0.fetch_sub(1, Release);
            }
        }
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: this guard holds the word, taken before it saw every mark clear: no other
        // guard has access until it is dropped (module proof).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` makes this the only reference through the guard.
        unsafe { &mut *self.lock.data.get() }
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

impl<T> Drop for WriteGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(test)]
        WRITING_HERE.with(|n| n.set(n.get() - 1));
        if thread::panicking() {
            self.lock.poisoned.store(true, Relaxed);
        }
        // Release: the writes happen before a read that sees the word let go of.
        self.lock.let_go_of_word();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    /// A writer makes the two halves equal only when it lets go: a reader that overlapped a
    /// writer sees them differ. Readers and writers race for a bounded time; each reader also
    /// checks that what it read does not change under it.
    fn race(
        bias: Option<Bias>,
        readers: usize,
        writers: usize,
        for_how_long: Duration,
    ) -> (u64, u64) {
        let lock = ReadMostly::with_bias((0u64, 0u64), bias);
        let (reads, writes) = (AtomicU64::new(0), AtomicU64::new(0));
        let start = Barrier::new(readers + writers);
        let deadline = Instant::now() + for_how_long;
        thread::scope(|s| {
            for _ in 0..readers {
                s.spawn(|| {
                    start.wait();
                    // At least once, however slowly the threads started (valgrind).
                    loop {
                        for _ in 0..64 {
                            let guard = lock.read().unwrap();
                            let (a, b) = *guard;
                            assert_eq!(a, b, "a reader saw a write in progress");
                            std::hint::black_box(&*guard);
                            assert_eq!(*guard, (a, b), "the data changed under a reader");
                            reads.fetch_add(1, Relaxed);
                        }
                        if Instant::now() >= deadline {
                            break;
                        }
                        thread::yield_now();
                    }
                });
            }
            for _ in 0..writers {
                s.spawn(|| {
                    start.wait();
                    loop {
                        let mut guard = lock.write().unwrap();
                        guard.0 += 1;
                        for _ in 0..16 {
                            spin_loop();
                        }
                        std::hint::black_box(&mut *guard);
                        guard.1 += 1;
                        drop(guard);
                        writes.fetch_add(1, Relaxed);
                        if Instant::now() >= deadline {
                            break;
                        }
                        thread::yield_now();
                    }
                });
            }
        });
        let (a, b) = *lock.read().unwrap();
        assert_eq!(
            (a, b),
            (writes.load(Relaxed), writes.load(Relaxed)),
            "a write was lost"
        );
        (reads.into_inner(), writes.into_inner())
    }

    #[test]
    fn readers_never_overlap_a_writer() {
        for bias in [None, Some(DEFAULT), Some(EVERY_READ)] {
            let (reads, writes) = race(bias, 6, 2, Duration::from_millis(300));
            assert!(reads > 0 && writes > 0, "{reads} reads, {writes} writes");
        }
    }

    /// Runs `f` while other threads hold every slot, so that the threads `f` starts have none
    /// (as a new thread found just before).
    ///
    /// Other tests' threads may hold slots meanwhile and give them back at any time, so
    /// holders are added until a holder and then a new thread both find no slot left, rather
    /// than counted.
    fn with_every_slot_held(f: impl FnOnce()) {
        let done = AtomicBool::new(false);
        thread::scope(|s| {
            let mut holders = 0;
            loop {
                let (sender, receiver) = std::sync::mpsc::channel();
                let done = &done;
                s.spawn(move || {
                    let _ = sender.send(slot::current());
                    while !done.load(Acquire) {
                        thread::park_timeout(Duration::from_millis(1));
                    }
                });
                holders += 1;
                if receiver.recv().unwrap().is_none()
                    && thread::spawn(slot::current).join().unwrap().is_none()
                {
                    break;
                }
                assert!(
                    holders <= 4 * SLOTS,
                    "{holders} holders, yet a new thread found a slot"
                );
            }
            // Caught, so that the holders go before the panic goes on.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            done.store(true, Release);
            if let Err(panic) = ran {
                std::panic::resume_unwind(panic);
            }
        });
    }

    /// More threads than slots: readers without one count in the shared counter, and never
    /// overlap a writer, in the race and in lockstep.
    #[test]
    fn threads_without_a_slot_read_too() {
        with_every_slot_held(|| {
            let (reads, writes) = race(Some(EVERY_READ), 6, 2, Duration::from_millis(300));
            assert!(reads > 0 && writes > 0, "{reads} reads, {writes} writes");
            lockstep(None);
        });
    }

    /// Reads keep the bias, a write ends it, and a thread's [`UNBIASED_READS`] reads bring it
    /// back once the backoff has passed; without the heavy barrier there is none. (A backoff
    /// of one barrier's time: under valgrind a barrier takes milliseconds.)
    #[test]
    fn the_bias_goes_with_a_write_and_comes_back_with_reads() {
        let lock = ReadMostly::with_bias(
            0,
            Some(Bias {
                backoff: 1,
                ..DEFAULT
            }),
        );
        let biased = || lock.biased.load(Relaxed);
        assert_eq!(biased(), barrier::available());
        for _ in 0..10 {
            drop(lock.read().unwrap());
        }
        assert_eq!(biased(), barrier::available(), "reads ended the bias");
        *lock.write().unwrap() += 1;
        assert!(!biased(), "a write kept the bias");
        // Past the backoff, the count alone decides.
        while now_ns() < lock.bias_backoff_until.load(Relaxed) {
            thread::sleep(Duration::from_micros(100));
        }
        for _ in 0..UNBIASED_READS - 1 {
            drop(lock.read().unwrap());
        }
        assert!(!biased(), "the bias came back too early");
        drop(lock.read().unwrap());
        assert_eq!(biased(), barrier::available(), "the bias did not come back");
        let never = ReadMostly::with_bias(0, None);
        for _ in 0..2 * UNBIASED_READS {
            drop(never.read().unwrap());
        }
        assert!(!never.biased.load(Relaxed));
    }

    /// A read that would restore the bias does not within the backoff after a heavy barrier.
    /// (A backoff of twice the barrier's time, which the read follows at once: under valgrind
    /// a barrier takes milliseconds.)
    #[test]
    fn the_bias_stays_off_for_the_backoff() {
        let lock = ReadMostly::with_bias(
            0,
            Some(Bias {
                after_reads: 1,
                backoff: 2,
            }),
        );
        if !barrier::available() {
            assert!(!lock.biased.load(Relaxed));
            return;
        }
        for _ in 0..10 {
            *lock.write().unwrap() += 1;
            let until = lock.bias_backoff_until.load(Relaxed);
            assert!(until > 0, "no backoff after a heavy barrier");
            drop(lock.read().unwrap());
            // A restore made at or after `until` leaves the clock past it.
            assert!(
                !lock.biased.load(Relaxed) || now_ns() >= until,
                "a read restored the bias within the backoff"
            );
            while now_ns() < until {
                thread::sleep(Duration::from_micros(50));
            }
            drop(lock.read().unwrap());
            assert!(
                lock.biased.load(Relaxed),
                "the bias did not come back after the backoff"
            );
        }
    }

    /// The store-buffer race at the heart of the proof: a reader marking itself and a writer
    /// taking the lock at the same instant. Each round the two leave a spinning barrier
    /// together and enter; inside, each says so and looks for the other (SeqCst, so that two
    /// threads inside at once cannot both miss each other). Bounded by rounds and by time.
    fn lockstep(bias: Option<Bias>) {
        const ROUNDS: u64 = 1_000_000;
        let lock = ReadMostly::with_bias((), bias);
        let arrived = AtomicU64::new(0);
        let inside = [AtomicBool::new(false), AtomicBool::new(false)];
        let (overlaps, rounds) = (AtomicU64::new(0), AtomicU64::new(0));
        let deadline = Instant::now() + Duration::from_secs(3);
        let enter = |me: usize, round: u64| {
            arrived.fetch_add(1, SeqCst);
            while arrived.load(Relaxed) < 2 * round {
                // The first round runs however late (valgrind).
                if round > 1 && Instant::now() > deadline {
                    return false;
                }
                spin_loop();
            }
            let check = || {
                inside[me].store(true, SeqCst);
                for _ in 0..32 {
                    if inside[1 - me].load(SeqCst) {
                        overlaps.fetch_add(1, Relaxed);
                        break;
                    }
                    spin_loop();
                }
                inside[me].store(false, SeqCst);
            };
            if me == 0 {
                let _guard = lock.read().unwrap();
                check();
            } else {
                let _guard = lock.write().unwrap();
                check();
            }
            true
        };
        thread::scope(|s| {
            s.spawn(|| (1..=ROUNDS).take_while(|&round| enter(0, round)).count());
            s.spawn(|| {
                let done = (1..=ROUNDS).take_while(|&round| enter(1, round)).count();
                rounds.store(done as u64, Relaxed);
            });
        });
        let rounds = rounds.into_inner();
        assert!(rounds > 0, "no round ran");
        assert_eq!(
            overlaps.into_inner(),
            0,
            "a reader and a writer were inside at once, in {rounds} rounds"
        );
    }

    /// Without the bias: the reader marks with the `xchg`.
    #[test]
    fn a_reader_and_a_writer_entering_together_exclude_each_other() {
        lockstep(None);
    }

    /// With the bias restored by every unbiased read: each round a reader that marks with a
    /// plain store meets a writer that ends the bias (with the heavy barrier).
    #[test]
    fn a_biased_reader_and_a_writer_entering_together_exclude_each_other() {
        lockstep(Some(EVERY_READ));
    }

    /// The bias of [`ReadMostly::new`].
    const DEFAULT: Bias = Bias {
        after_reads: UNBIASED_READS,
        backoff: BIAS_BACKOFF,
    };

    /// A bias that every unbiased read restores.
    const EVERY_READ: Bias = Bias {
        after_reads: 1,
        backoff: 0,
    };

    /// Whether a thread that panics while it holds what `take` gives it did panic.
    fn panics_holding<G>(take: impl FnOnce() -> G + Send) -> bool {
        thread::scope(|s| {
            s.spawn(move || {
                let _guard = take();
                panic!("on purpose");
            })
            .join()
        })
        .is_err()
    }

    #[test]
    fn a_writer_that_panics_poisons_the_lock() {
        let lock = ReadMostly::new(0);
        assert!(panics_holding(|| lock.write().unwrap()));
        assert!(lock.read().is_err());
        assert!(lock.write().is_err());
        // A reader that panics poisons nothing.
        let lock = ReadMostly::new(0);
        assert!(panics_holding(|| lock.read().unwrap()));
        assert!(lock.write().is_ok());
    }

    /// Writers that find the word held say so and sleep on it, and each letting go wakes the
    /// next: none is left asleep. Bounded: a lost wake fails the test instead of hanging it.
    #[test]
    fn writers_that_sleep_on_the_word_are_woken() {
        const WRITERS: u64 = 3;
        let lock = std::sync::Arc::new(ReadMostly::new(0u64));
        let guard = lock.write().unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        for _ in 0..WRITERS {
            let (lock, done) = (std::sync::Arc::clone(&lock), done.clone());
            thread::spawn(move || {
                *lock.write().unwrap() += 1;
                done.send(()).unwrap();
            });
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock.word.load(Relaxed) != CONTENDED {
            assert!(Instant::now() < deadline, "no writer said that it waits");
            thread::sleep(Duration::from_millis(1));
        }
        // Long enough for every writer to be asleep in the kernel.
        thread::sleep(Duration::from_millis(50));
        drop(guard);
        for _ in 0..WRITERS {
            finished
                .recv_timeout(Duration::from_secs(10))
                .expect("a writer waiting for the word was never woken");
        }
        assert_eq!(*lock.read().unwrap(), WRITERS);
        assert_eq!(lock.word.load(Relaxed), FREE);
    }

    /// A writer waits for a reader that holds its guard, and readers queue behind a writer.
    #[test]
    fn a_writer_waits_for_the_reader_it_found() {
        let lock = ReadMostly::new(0);
        let reading = Barrier::new(2);
        let order = std::sync::Mutex::new(Vec::new());
        thread::scope(|s| {
            s.spawn(|| {
                let guard = lock.read().unwrap();
                reading.wait();
                thread::sleep(Duration::from_millis(50));
                order.lock().unwrap().push("read done");
                drop(guard);
            });
            s.spawn(|| {
                reading.wait();
                let mut guard = lock.write().unwrap();
                order.lock().unwrap().push("write");
                *guard += 1;
            });
        });
        assert_eq!(*order.lock().unwrap(), ["read done", "write"]);
        assert_eq!(*lock.read().unwrap(), 1);
    }
}
