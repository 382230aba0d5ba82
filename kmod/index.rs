// SPDX-License-Identifier: GPL-2.0

//! Numbering of `/dev/peerdirectN`.
//!
//! A misc device's name must live as long as its registration, so names come from a static
//! table and an index is taken from a bitmap for as long as a device is bound.

use kernel::{
    prelude::*,
    sync::atomic::{Atomic, Full, Relaxed},
};

/// How many HBM devices one host can expose (a DL1 host has 8 Gaudis).
pub(crate) const MAX_DEVICES: usize = 16;

static NAMES: [&CStr; MAX_DEVICES] = [
    c"peerdirect0",
    c"peerdirect1",
    c"peerdirect2",
    c"peerdirect3",
    c"peerdirect4",
    c"peerdirect5",
    c"peerdirect6",
    c"peerdirect7",
    c"peerdirect8",
    c"peerdirect9",
    c"peerdirect10",
    c"peerdirect11",
    c"peerdirect12",
    c"peerdirect13",
    c"peerdirect14",
    c"peerdirect15",
];

/// A set of device indices, one bit each.
pub(crate) struct IndexSet(Atomic<u32>);

/// The indices of the devices bound now.
pub(crate) static DEVICES: IndexSet = IndexSet::new();

impl IndexSet {
    pub(crate) const fn new() -> Self {
        Self(Atomic::new(0))
    }

    /// Takes the lowest free index; `ENOSPC` when all [`MAX_DEVICES`] are taken.
    pub(crate) fn take(&'static self) -> Result<DeviceIndex> {
        let mut used = self.0.load(Relaxed);
        loop {
            let index = used.trailing_ones();
            if index as usize >= MAX_DEVICES {
                return Err(ENOSPC);
            }
            match self.0.cmpxchg(used, used | (1 << index), Full) {
                Ok(_) => return Ok(DeviceIndex { set: self, index }),
                Err(now) => used = now,
            }
        }
    }

    fn give_back(&self, index: u32) {
        let mut used = self.0.load(Relaxed);
        loop {
            match self.0.cmpxchg(used, used & !(1 << index), Full) {
                Ok(_) => return,
                Err(now) => used = now,
            }
        }
    }
}

/// An index taken from an [`IndexSet`]; given back on drop.
///
/// # Invariants
///
/// `index < MAX_DEVICES`, and its bit is set in `set` for as long as this value exists.
pub(crate) struct DeviceIndex {
    set: &'static IndexSet,
    index: u32,
}

impl DeviceIndex {
    pub(crate) fn get(&self) -> u32 {
        self.index
    }

    /// The misc device name, `peerdirectN`.
    pub(crate) fn name(&self) -> &'static CStr {
        NAMES[self.index as usize]
    }
}

impl Drop for DeviceIndex {
    fn drop(&mut self) {
        self.set.give_back(self.index);
    }
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_index)]
mod tests {
    use super::*;

    #[test]
    fn takes_lowest_free_and_reuses_given_back() {
        static SET: IndexSet = IndexSet::new();
        let a = SET.take().unwrap();
        let b = SET.take().unwrap();
        assert_eq!((a.get(), b.get()), (0, 1));
        assert_eq!(b.name(), c"peerdirect1");
        drop(a);
        let c = SET.take().unwrap();
        assert_eq!(c.get(), 0);
    }

    #[test]
    fn refuses_past_max_devices() {
        static SET: IndexSet = IndexSet::new();
        let mut held = KVec::new();
        for i in 0..MAX_DEVICES {
            let index = SET.take().unwrap();
            assert_eq!(index.get() as usize, i);
            held.push(index, GFP_KERNEL).unwrap();
        }
        assert!(matches!(SET.take(), Err(e) if e == ENOSPC));
        held.truncate(MAX_DEVICES - 1);
        assert_eq!(SET.take().unwrap().get() as usize, MAX_DEVICES - 1);
    }
}
