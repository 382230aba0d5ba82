//! A small table read on every lookup by address and changed rarely, for a runtime that
//! finds the registration covering a buffer by the buffer's address (HCL registers its whole
//! HBM pool once, then sends from buffers inside it): the C ABI's `pd_register_addr` finds
//! the dma-buf registered at the caller's addresses here before it asks the cache.
//!
//! A lookup takes no lock and writes nothing, so that threads looking up at once never write
//! a line another reads (a reader-writer lock's read, or a reference count, writes a shared
//! word on every lookup). [`SLOTS`] entries, each a [`Cell`] (crossbeam's `AtomicCell`: a
//! value larger than an atomic is a seqlock, whose load reads a stamp, the value and the stamp
//! again), and a bitmap of the slots in use. One thread at a time changes the table (a lock
//! of its own, which lookups never take; the caller also holds one around the set the table
//! mirrors, so that the table follows its changes in order). A lookup that races a change finds an entry as
//! it was before or after it, never torn, and an entry that the change keeps is found
//! throughout (kept entries stay in their slots). More entries than slots: the caller finds
//! the others on a slower path of its own.
//!
//! Model-checked with loom (`cache/models.rs`, the table's cells then loom's mutexes).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use std::sync::PoisonError;

use super::sync::{AtomicU32, Cell, Mutex};

/// How many entries a table holds.
#[cfg(not(loom))]
pub const SLOTS: usize = 32;

/// In the models (`cache/models.rs`), three: two entries and a slot that a change frees and
/// fills again.
#[cfg(loom)]
pub const SLOTS: usize = 3;

const _: () = assert!(SLOTS <= u32::BITS as usize);

/// The table, of entries `T` (small and `Copy`: each is copied out whole by a lookup).
pub struct AddressTable<T> {
    /// Bit `i`: slot `i` holds an entry.
    used: AtomicU32,
    slots: [Cell<Option<T>>; SLOTS],
    /// Held by [`AddressTable::set`]: two changes at once would each write its own view of
    /// `used`, and a bit lost or kept wrongly would leave a slot unusable for good.
    changing: Mutex<()>,
}

impl<T: Copy> Default for AddressTable<T> {
    fn default() -> Self {
        Self {
            used: AtomicU32::new(0),
            slots: std::array::from_fn(|_| Cell::new(None)),
            changing: Mutex::new(()),
        }
    }
}

impl<T: Copy + PartialEq> AddressTable<T> {
    /// How many entries a table holds.
    pub const SLOTS: usize = SLOTS;

    /// An entry for which `wanted` is true, if the table holds one.
    #[inline]
    pub fn find(&self, mut wanted: impl FnMut(&T) -> bool) -> Option<T> {
        // Acquire: a slot whose bit is seen set was stored before the bit was.
        let mut used = self.used.load(Acquire);
        while used != 0 {
            let slot = used.trailing_zeros() as usize;
            used &= used - 1;
            // Emptied or reused since `used` was read: what it holds now, which is as true.
            if let Some(Some(entry)) = self.slots.get(slot).map(Cell::load) {
                if wanted(&entry) {
                    return Some(entry);
                }
            }
        }
        None
    }

    /// Makes the table hold `entries` (the first [`AddressTable::SLOTS`] of them): entries it
    /// holds that are among them stay in their slots. Calls from several threads take turns
    /// (the last to run wins); lookups never wait for them.
    pub fn set(&self, entries: &[T]) {
        // Nothing is left half done by a panic here: a poisoned lock guards nothing.
        let _changing = self.changing.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = entries.get(..SLOTS).unwrap_or(entries);
        // Entries no longer wanted go first: their bit, then the slot.
        let mut used = self.used.load(Relaxed);
        for (slot, cell) in self.slots.iter().enumerate() {
            let bit = 1 << slot;
            if used & bit != 0 && cell.load().is_some_and(|held| !entries.contains(&held)) {
                used &= !bit;
                self.used.store(used, Release);
                cell.store(None);
            }
        }
        for entry in entries {
            let mut held = self.slots.iter().enumerate();
            if held.any(|(slot, cell)| used & (1 << slot) != 0 && cell.load() == Some(*entry)) {
                continue;
            }
            // There is a free slot: at most SLOTS are wanted, and those held are among them.
            let mut slots = self.slots.iter().enumerate();
            if let Some((slot, cell)) = slots.find(|(slot, _)| used & (1 << slot) == 0) {
                cell.store(Some(*entry));
                used |= 1 << slot;
                // Release: a lookup that sees the bit sees the slot's entry.
                self.used.store(used, Release);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

    use super::*;

    /// How long the race may take to run.
    const RACE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

    /// An entry: bytes `[base, base + 1 MiB)` and a tag that says whose they are.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct At {
        base: u64,
        tag: u64,
    }

    fn at(n: u64) -> At {
        At {
            base: n << 32,
            tag: n * 0x9e37_79b9,
        }
    }

    fn find(table: &AddressTable<At>, addr: u64) -> Option<At> {
        table.find(|a| a.base <= addr && addr < a.base + (1 << 20))
    }

    #[test]
    fn finds_what_it_holds_and_nothing_else() {
        let table = AddressTable::default();
        assert_eq!(find(&table, 1 << 32), None);
        table.set(&[at(1), at(2)]);
        assert_eq!(find(&table, (1 << 32) + 4096), Some(at(1)));
        assert_eq!(find(&table, (2 << 32) + (1 << 20) - 1), Some(at(2)));
        assert_eq!(find(&table, (2 << 32) + (1 << 20)), None);
        table.set(&[at(2), at(3)]);
        assert_eq!(find(&table, 1 << 32), None);
        assert_eq!(find(&table, 3 << 32), Some(at(3)));
        assert_eq!(find(&table, 2 << 32), Some(at(2)));
        table.set(&[]);
        assert_eq!(table.used.load(SeqCst), 0);
    }

    #[test]
    fn holds_the_first_slots_entries_of_more() {
        let table = AddressTable::default();
        let all: Vec<At> = (1..=SLOTS as u64 + 3).map(at).collect();
        table.set(&all);
        assert_eq!(table.used.load(SeqCst), u32::MAX);
        assert!(all[..SLOTS]
            .iter()
            .all(|a| find(&table, a.base) == Some(*a)));
        assert_eq!(find(&table, all[SLOTS].base), None);
        // One gone: a slot for the next.
        table.set(&all[1..]);
        assert_eq!(find(&table, all[0].base), None);
        assert_eq!(find(&table, all[SLOTS].base), Some(all[SLOTS]));
    }

    /// Two threads changing the table at once take turns: afterwards it holds what the last
    /// change asked for, and every slot can be used again.
    #[test]
    fn changes_from_two_threads_take_turns() {
        let table = AddressTable::default();
        std::thread::scope(|scope| {
            for first in [1, 100] {
                let table = &table;
                scope.spawn(move || {
                    for round in 0..2_000u64 {
                        let wanted: Vec<At> = (first..first + (round % SLOTS as u64) + 1)
                            .map(at)
                            .collect();
                        table.set(&wanted);
                    }
                });
            }
        });
        let all: Vec<At> = (1000..1000 + SLOTS as u64).map(at).collect();
        table.set(&all);
        assert!(all.iter().all(|a| find(&table, a.base) == Some(*a)));
        table.set(&all[..1]);
        assert_eq!(table.used.load(SeqCst).count_ones(), 1);
    }

    /// Lookups racing changes: an entry present all along is always found; one that comes
    /// and goes is found whole or not at all. The table changes until the readers have made
    /// enough lookups, however the threads are scheduled (at most [`RACE_LIMIT`]).
    #[test]
    fn lookups_racing_changes_see_whole_entries() {
        const LOOKUPS: u64 = 20_000;
        const CHURNED: u64 = 1_000;
        let table = AddressTable::default();
        let stop = AtomicBool::new(false);
        let (found, churned) = (AtomicU64::new(0), AtomicU64::new(0));
        table.set(&[at(1)]);
        let deadline = std::time::Instant::now() + RACE_LIMIT;
        let rounds = std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    while !stop.load(SeqCst) {
                        assert_eq!(find(&table, 1 << 32), Some(at(1)));
                        for n in 2..6 {
                            if let Some(a) = find(&table, n << 32) {
                                assert_eq!(a, at(n));
                                churned.fetch_add(1, SeqCst);
                            }
                        }
                        found.fetch_add(1, SeqCst);
                    }
                });
            }
            let mut round = 0u64;
            while (found.load(SeqCst) < LOOKUPS || churned.load(SeqCst) < CHURNED)
                && std::time::Instant::now() < deadline
            {
                let mut wanted = vec![at(1)];
                wanted.extend((2..6).filter(|n| (round >> n) & 1 == 1).map(at));
                table.set(&wanted);
                round += 1;
            }
            stop.store(true, SeqCst);
            round
        });
        let (found, churned) = (found.load(SeqCst), churned.load(SeqCst));
        assert!(
            found >= LOOKUPS && churned >= CHURNED,
            "in {RACE_LIMIT:?}, {rounds} changes and {found} lookups ({churned} of churned \
             entries): the race did not run"
        );
    }
}
