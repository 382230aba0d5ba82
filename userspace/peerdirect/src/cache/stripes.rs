//! Counters in stripes, each on a cache line of its own: one for each [`slot`], and the last
//! shared by the threads that have none. A thread that owns a slot counts in its own stripe
//! without a locked instruction, and threads counting never write a line another one writes.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use super::slot;
use super::sync::AtomicU64;

const STRIPES: usize = slot::SLOTS + 1;
const SHARED_STRIPE: usize = slot::SLOTS;

#[derive(Default)]
#[repr(align(64))]
struct Stripe(AtomicU64);

/// A counter, summed over its stripes.
pub(super) struct Stripes([Stripe; STRIPES]);

impl Default for Stripes {
    fn default() -> Self {
        Self(std::array::from_fn(|_| Stripe::default()))
    }
}

impl Stripes {
    /// Adds one in the stripe of `slot`, the calling thread's ([`slot::current`]). Release,
    /// so that a `sum` that sees it sees what happened before it (see
    /// [`super::RegCache::stats`]).
    #[inline]
    pub(super) fn add(&self, slot: Option<usize>) {
        match slot {
            Some(index) => {
                // Only the slot's owner writes its stripe, and the next owner takes the slot
                // after this one let go of it: not a lost update.
                let count = &self.0[index].0;
                count.store(count.load(Relaxed) + 1, Release);
            }
            None => {
                self.0[SHARED_STRIPE].0.fetch_add(1, Release);
            }
        }
    }

    /// The count: exact once every `add` happened before it; else at least what each stripe
    /// had when it was read.
    pub(super) fn sum(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Acquire)).sum()
    }
}
