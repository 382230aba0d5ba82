//! Loom models of the cache's hand-written concurrency: the pins ([`super::pin`]), the slots
//! ([`super::slot`]), the pointer lent from the recency list ([`super::lent`]), the hit
//! counter's stripes ([`super::stripes`]) and the address table ([`super::addresses`], its
//! cells loom's mutexes). Built with `--cfg loom` (tests/run's loom step),
//! that code runs on loom's atomics, mutex and `Arc` ([`super::sync`]); each model runs it in
//! every interleaving of its threads (up to `LOOM_MAX_PREEMPTIONS` preemptions, 2 unless set)
//! and with every value each load may read under the memory model.
//!
//! The cache's lock is crossbeam's `ShardedLock`, a reader-writer lock: loom's `RwLock` stands
//! in for it. The cache around one entry is [`Cached`], and what the cache does with it under
//! the lock is written out here as the cache does it: a hit (`State::hold`), taking the entry
//! off the cache with its pins converted (`State::take`), and eviction (`State::make_room`:
//! the pins scanned, then the count read).
//!
//! A value is freed exactly once (loom's `Arc` fails a run that leaks it or lets go of a
//! reference twice; [`Value`] counts its drops), and never while a handle can read it: a
//! handle checks the value was not dropped before reading it, and reads it through a loom
//! cell, which the drop writes, so that loom fails a run where the read does not happen
//! before the drop.

#![allow(unsafe_code)]

use std::sync::atomic::{
    AtomicUsize as Counter,
    Ordering::{Acquire, Relaxed, Release, SeqCst},
};

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicUsize};
use loom::sync::{Arc, RwLock};
use loom::thread;

use super::addresses::AddressTable;
use super::lent::Lent;
use super::pin::{Held, Pinned};
use super::slot::{self, SLOTS};
use super::stripes::Stripes;

/// What the cached value holds while it lives.
const DATA: u64 = 0x5eed;

/// A cached value, read through handles and written once: by its drop.
struct Value {
    data: UnsafeCell<u64>,
    /// Drops of any value of the run: counted outside loom (what ran, in the order it ran).
    drops: std::sync::Arc<Counter>,
}

// SAFETY: `data` is accessed only through loom's cell, which fails the run on any access not
// ordered with a write (the drop's, which has `&mut self`).
unsafe impl Sync for Value {}

impl Drop for Value {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: no other reference; loom checks that every read happened before.
        self.data.with_mut(|data| unsafe { *data = 0 });
        self.drops.fetch_add(1, SeqCst);
    }
}

type Handle = Held<Value, Arc<Value>>;

/// The handles alive: a handle counts from under the read lock of its hit until just before
/// it is dropped (the drop empties its pin or lets go of its count, with a release), so that a
/// writer that finds the value idle can check that no handle holds it. A loom atomic, relaxed:
/// loom explores the orders of its uses (it would not those of an atomic it does not see), and
/// it orders nothing itself. A handle's decrement is ordered before a writer that saw its pin
/// empty or its count gone (the release it acquired), so the writer reads it or a later one.
type Alive = Arc<AtomicUsize>;

/// The recency list's reference to a cached value and the index's pointer lent from it.
type Listed = (Arc<Value>, Lent<Value, Arc<Value>>);

/// The state of a cache that caches one value (`State`), or nothing once the value has left.
struct Cached {
    listed: Option<Listed>,
}

/// A run's cache, its value's drops and its handles alive.
struct Run {
    cache: Arc<RwLock<Cached>>,
    drops: std::sync::Arc<Counter>,
    alive: Alive,
}

impl Run {
    /// A cache holding one value, and the run's statics made ([`statics`]).
    fn new() -> Self {
        statics();
        let drops = std::sync::Arc::new(Counter::new(0));
        let value = Arc::new(Value {
            data: UnsafeCell::new(DATA),
            drops: std::sync::Arc::clone(&drops),
        });
        let (arc, lent) = Lent::lend(value);
        Self {
            cache: Arc::new(RwLock::new(Cached {
                listed: Some((arc, lent)),
            })),
            drops,
            alive: Alive::default(),
        }
    }

    /// Another reference to the run, for a thread.
    fn share(&self) -> Self {
        Self {
            cache: Arc::clone(&self.cache),
            drops: std::sync::Arc::clone(&self.drops),
            alive: Arc::clone(&self.alive),
        }
    }

    /// A hit (`State::hold`): under the read lock, a handle pinned in `slot` (else counted).
    fn hit(&self, slot: Option<usize>) -> Option<Handle> {
        let state = self.cache.read().unwrap();
        let (_, lent) = state.listed.as_ref()?;
        // SAFETY: under the read lock the list holds the value's reference; `take` converts
        // its pins before letting go of it, and `evict` takes it only if the scan saw no pin.
        let held = unsafe { Held::pin(lent, slot) };
        self.alive.fetch_add(1, Relaxed);
        Some(held)
    }

    /// What a handle reads of the value: it must be alive, and the read ordered with its drop.
    fn read(&self, held: &Handle) -> u64 {
        assert_eq!(self.drops.load(SeqCst), 0, "a handle reads a dropped value");
        // SAFETY: the value is alive (just checked; loom runs one thread at a time, and this
        // thread runs no loom operation in between); loom checks the read against the drop.
        held.data.with(|data| unsafe { *data })
    }

    /// Another handle, a clone of `held`.
    fn clone(&self, held: &Handle) -> Handle {
        let clone = held.clone();
        self.alive.fetch_add(1, Relaxed);
        clone
    }

    /// Drops a handle.
    fn release(&self, held: Handle) {
        self.alive.fetch_sub(1, Relaxed);
        drop(held);
    }

    /// Whether eviction may take `arc` (`State::make_room`), under the write lock: `pinned`
    /// saw no pin of it and, read after the scan, its count says no counted handle holds it.
    /// Then no handle holds it.
    fn idle(&self, arc: &Arc<Value>, pinned: &mut Pinned) -> bool {
        if pinned.holds(arc) || Arc::strong_count(arc) != 1 {
            return false;
        }
        assert_eq!(
            self.alive.load(Relaxed),
            0,
            "found idle while a handle holds it"
        );
        true
    }

    /// The value leaves the cache otherwise than by eviction (superseded, invalidated, the
    /// cache dropped: `State::take`, `State::drop`): under the write lock, off the list and
    /// its pins converted. Returns the list's reference, for the caller to drop once it has
    /// let go of the lock.
    fn take(&self) -> Option<Arc<Value>> {
        let mut state = self.cache.write().unwrap();
        let (arc, _) = state.listed.take()?;
        Pinned::default().convert(&arc);
        Some(arc)
    }

    /// Eviction (`State::make_room`): under the write lock, the value goes if it is idle.
    /// Returns the list's reference, for the caller to drop once it has let go of the lock.
    fn evict(&self) -> Option<Arc<Value>> {
        let mut state = self.cache.write().unwrap();
        let mut pinned = Pinned::default();
        pinned.reset();
        let (arc, _) = state.listed.as_ref()?;
        if !self.idle(arc, &mut pinned) {
            return None;
        }
        state.listed.take().map(|(arc, _)| arc)
    }

    /// After the threads: the cache goes (`State::drop`), and the value was dropped once.
    fn end(self) {
        drop(self.take());
        drop(self.cache);
        assert_eq!(self.alive.load(Relaxed), 0);
        assert_eq!(self.drops.load(SeqCst), 1, "the value was dropped once");
        slots_given_back();
    }
}

/// Makes the run's statics (the pins, the slots given back and the count handed out) on the
/// main thread before it starts the others: loom makes one at its first use, and every later
/// use would be ordered after what the first user did before it, more than the code orders.
/// The main thread takes no slot (loom drops its thread-locals after the run, without the
/// statics), and only starts and joins the threads that race: loom reorders what it does
/// itself between them less than what they do.
fn statics() {
    assert_eq!(slot::handed_out(), 0);
    assert_eq!(slot::given_back(), 0);
    assert!(!Pinned::default().holds(&Arc::new(())));
}

/// Waits for every slot handed out to be given back, at the end of a run whose threads are
/// joined: loom's `join` returns before the joined thread's thread-locals (its slot) are
/// dropped, and the run's statics, which dropping a slot uses, go with the run.
fn slots_given_back() {
    while slot::given_back() < slot::handed_out() {
        thread::yield_now();
    }
}

/// Runs `model` in every interleaving loom explores: up to `LOOM_MAX_PREEMPTIONS` preemptions
/// of a thread, 2 unless set.
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound.get_or_insert(2);
    builder.check(model);
}

/// A hit (pinned when `pinned`, else counted: `Lent::to_arc`), its read and its handle's drop,
/// against the value taken off the cache (its pins converted) and the list's reference dropped.
fn hit_against_take(pinned: bool) {
    check(move || {
        let run = Run::new();
        let hitter = {
            let run = run.share();
            thread::spawn(move || {
                let slot = if pinned { slot::current() } else { None };
                if let Some(held) = run.hit(slot) {
                    assert_eq!(held.is_pinned(), pinned);
                    assert_eq!(run.read(&held), DATA);
                    run.release(held);
                }
            })
        };
        let writer = {
            let run = run.share();
            thread::spawn(move || drop(run.take()))
        };
        hitter.join().unwrap();
        writer.join().unwrap();
        run.end();
    });
}

/// Model 1: a hit pins the value under the read lock while a writer takes it off the cache
/// and converts its pins, and the handle is read and dropped meanwhile.
#[test]
fn a_pinned_handle_converted_while_in_use_frees_its_value_once_after_its_last_read() {
    hit_against_take(true);
}

/// Model 1 for a hit without a slot: a counted handle, its reference made from the lent
/// pointer under the read lock.
#[test]
fn a_counted_hit_taken_off_while_in_use_frees_its_value_once_after_its_last_read() {
    hit_against_take(false);
}

/// Model 2: eviction scans the pins while a hit pins the value, reads it and drops its handle;
/// only a value the scan saw unpinned is evicted, and the handle's last read happens before
/// the value is freed.
#[test]
fn eviction_takes_only_a_value_it_saw_unpinned_after_its_handles_last_read() {
    check(|| {
        let run = Run::new();
        let hitter = {
            let run = run.share();
            thread::spawn(move || {
                if let Some(held) = run.hit(slot::current()) {
                    assert!(held.is_pinned());
                    assert_eq!(run.read(&held), DATA);
                    run.release(held);
                }
            })
        };
        let writer = {
            let run = run.share();
            thread::spawn(move || drop(run.evict()))
        };
        hitter.join().unwrap();
        writer.join().unwrap();
        run.end();
    });
}

/// A pinned hit cloned (the clone counted), the pinned handle dropped, the clone read and
/// dropped, against `writer`.
fn clone_against(writer: fn(&Run) -> Option<Arc<Value>>) {
    check(move || {
        let run = Run::new();
        let hitter = {
            let run = run.share();
            thread::spawn(move || {
                if let Some(held) = run.hit(slot::current()) {
                    assert!(held.is_pinned());
                    let clone = run.clone(&held);
                    assert!(!clone.is_pinned());
                    run.release(held);
                    assert_eq!(run.read(&clone), DATA);
                    run.release(clone);
                }
            })
        };
        let writer = {
            let run = run.share();
            thread::spawn(move || drop(writer(&run)))
        };
        hitter.join().unwrap();
        writer.join().unwrap();
        run.end();
    });
}

/// Model 3: a clone of a pinned handle, which counts, racing the conversion of its pin.
#[test]
fn a_clone_of_a_pinned_handle_racing_its_conversion_frees_the_value_once_after_its_last_read() {
    clone_against(Run::take);
}

/// Model 3 against eviction: the pinned handle dropped after its clone counted shows in the
/// count read after the scan, so a value held by the clone is not evicted.
#[test]
fn a_clone_of_a_pinned_handle_dropped_before_the_scan_keeps_its_value_from_eviction() {
    clone_against(Run::evict);
}

/// Model 4: threads claim slots and give them back as they end (two at once, each hitting
/// under the read lock, then a third, which gets the first one's slot if it was given back by
/// then, else none), while a writer scans the pins under the write lock: no two
/// threads own a slot at once (each writes a cell of its slot's, and loom checks that the
/// owners' accesses are ordered), and the scan of the slots handed out when the writer took
/// the lock sees the pin of every handle alive then.
#[test]
fn slots_are_owned_by_one_thread_at_a_time_and_the_scan_sees_every_pin_filled_before_the_lock() {
    check(|| {
        let run = Run::new();
        let owners: Arc<[UnsafeCell<usize>; SLOTS]> =
            Arc::new(std::array::from_fn(|_| UnsafeCell::new(0)));
        let user = |id: usize, hits: bool| {
            let run = run.share();
            let owners = Arc::clone(&owners);
            move || {
                let slot = slot::current();
                if let Some(slot) = slot {
                    // SAFETY: loom checks that this write is ordered with the slot's other
                    // owners' accesses.
                    owners[slot].with_mut(|owner| unsafe { *owner = id });
                }
                if let Some(held) = hits.then(|| run.hit(slot)).flatten() {
                    assert_eq!(held.is_pinned(), slot.is_some());
                    assert_eq!(run.read(&held), DATA);
                    run.release(held);
                }
                if let Some(slot) = slot {
                    // SAFETY: as above, for a read.
                    assert_eq!(owners[slot].with(|owner| unsafe { *owner }), id);
                }
            }
        };
        let first = thread::spawn(user(1, true));
        let second = thread::spawn(user(2, true));
        let writer = {
            let run = run.share();
            thread::spawn(move || {
                let state = run.cache.write().unwrap();
                let (arc, _) = state.listed.as_ref().expect("never taken");
                run.idle(arc, &mut Pinned::default());
            })
        };
        first.join().unwrap();
        let third = thread::spawn(user(3, false));
        second.join().unwrap();
        third.join().unwrap();
        writer.join().unwrap();
        run.end();
    });
}

/// Model 5, the sum: threads add to a counter in their own stripes (the third in the slot the
/// first gave back, if it was by then, else in the shared one) and in the shared one (as
/// threads without a slot do); the sum read after they are joined is exact.
#[test]
fn stripes_count_every_add_of_threads_owning_slots_taking_them_over_or_having_none() {
    check(|| {
        statics();
        let hits = Arc::new(Stripes::default());
        let adder = |own: usize, shared: usize| {
            let hits = Arc::clone(&hits);
            move || {
                for _ in 0..own {
                    hits.add(slot::current());
                }
                for _ in 0..shared {
                    hits.add(None);
                }
            }
        };
        let first = thread::spawn(adder(1, 0));
        let second = thread::spawn(adder(1, 1));
        let slotless = thread::spawn(adder(0, 1));
        first.join().unwrap();
        // The first one's slot, given back.
        let third = thread::spawn(adder(1, 0));
        second.join().unwrap();
        slotless.join().unwrap();
        third.join().unwrap();
        assert_eq!(hits.sum(), 5);
        slots_given_back();
    });
}

/// Model 5, the order `stats` relies on: a registration is counted before the entry it makes
/// exists, the entry's deregistration after, on another thread (the entry handed over through
/// a flag set with a release and read with an acquire); a reader summing deregistrations first
/// never sees more of them than registrations (an acquiring sum that sees an add sees what
/// happened before it).
#[test]
fn a_sum_that_sees_an_add_sees_what_happened_before_it() {
    check(|| {
        statics();
        let registrations = Arc::new(Stripes::default());
        let deregistrations = Arc::new(Stripes::default());
        let made = Arc::new(AtomicBool::new(false));
        let registering = {
            let (registrations, made) = (Arc::clone(&registrations), Arc::clone(&made));
            thread::spawn(move || {
                let slot = slot::current();
                registrations.add(slot);
                made.store(true, Release);
            })
        };
        let deregistering = {
            let (deregistrations, made) = (Arc::clone(&deregistrations), Arc::clone(&made));
            thread::spawn(move || {
                let slot = slot::current();
                while !made.load(Acquire) {
                    thread::yield_now();
                }
                deregistrations.add(slot);
            })
        };
        let reader = {
            let (registrations, deregistrations) =
                (Arc::clone(&registrations), Arc::clone(&deregistrations));
            thread::spawn(move || {
                let deregistered = deregistrations.sum();
                let registered = registrations.sum();
                assert!(
                    deregistered <= registered,
                    "{deregistered} deregistrations seen, {registered} registrations"
                );
            })
        };
        registering.join().unwrap();
        deregistering.join().unwrap();
        reader.join().unwrap();
        assert_eq!(registrations.sum(), 1);
        slots_given_back();
    });
}

/// The address table: a lookup racing a change of the table finds an entry the change keeps
/// (it stays in its slot throughout), and one the change drops, or adds in the slot it frees,
/// as it was or not at all; after the change, the table holds exactly what it was given.
#[test]
fn an_address_lookup_racing_a_change_finds_kept_entries_and_others_whole_or_not_at_all() {
    check(|| {
        let table = Arc::new(AddressTable::<(u64, u64)>::default());
        table.set(&[(1, 10), (2, 20)]);
        let reader = {
            let table = Arc::clone(&table);
            thread::spawn(move || {
                let find = |key: u64| table.find(|entry| entry.0 == key);
                assert_eq!(
                    find(1),
                    Some((1, 10)),
                    "an entry the change keeps was not found"
                );
                for (key, value) in [(2, 20), (3, 30)] {
                    if let Some(found) = find(key) {
                        assert_eq!(found, (key, value));
                    }
                }
                assert_eq!(find(4), None);
            })
        };
        table.set(&[(3, 30), (1, 10)]);
        reader.join().unwrap();
        for (key, held) in [(1, Some((1, 10))), (2, None), (3, Some((3, 30)))] {
            assert_eq!(table.find(|entry| entry.0 == key), held);
        }
    });
}
