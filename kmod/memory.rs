// SPDX-License-Identifier: GPL-2.0

//! The allocation state of each HBM BAR, kept for the module's lifetime.
//!
//! An allocation lives as long as its dma-bufs, and importers that cannot be revoked (pinned
//! ones, such as EFA memory registrations) keep their mappings until they let go, even across
//! an unbind. So the heap of a BAR must outlive a binding of its device: when the device is
//! bound again, the new binding finds the same [`HbmMemory`] (keyed by the BAR's physical
//! address and size), whose heap still holds the ranges in use, and never hands them out again
//! until they are released. The registry only grows by distinct BARs and is emptied at module
//! unload, which cannot happen while any file or dma-buf is open.

use crate::heap::Heap;
use kernel::{
    new_mutex,
    prelude::*,
    rbtree::RBTree,
    sync::{atomic::Atomic, Arc, Mutex},
};

/// Allocation bookkeeping of one BAR, under [`HbmMemory::heap`].
pub(crate) struct HeapState {
    pub(crate) heap: Heap,
    /// Live allocations (including freed handles still held by dma-bufs), by offset:
    /// (handle, length, owner pid).
    pub(crate) live: RBTree<u64, (u32, u64, i32)>,
}

/// The memory of one HBM BAR.
#[pin_data]
pub(crate) struct HbmMemory {
    phys_addr: u64,
    bytes: u64,
    #[pin]
    pub(crate) heap: Mutex<HeapState>,
    /// Mappings of this BAR held by importers that cannot be revoked (pinned, e.g. EFA memory
    /// registrations); they outlive bindings, so they are counted here.
    pub(crate) pinned_mappings: Atomic<u64>,
}

crate::sys::global::global_mutex! {
    /// The memory of every BAR a device was bound with, kept across bindings.
    static MEMORIES: Mutex<KVec<Arc<HbmMemory>>> = KVec::new();
}

/// Empties the registry; from module exit, when no allocation can be left.
pub(crate) fn release_all() {
    let memories = core::mem::take(&mut *MEMORIES.lock());
    drop(memories);
}

/// The memory of the BAR at `phys_addr` of `bytes`: the one a previous binding left, or new.
pub(crate) fn of_bar(phys_addr: u64, bytes: u64) -> Result<Arc<HbmMemory>> {
    let mut memories = MEMORIES.lock();
    if let Some(memory) = memories
        .iter()
        .find(|m| m.phys_addr == phys_addr && m.bytes == bytes)
    {
        return Ok(memory.clone());
    }
    let heap = Heap::new(bytes)?;
    let memory = Arc::pin_init(
        try_pin_init!(HbmMemory {
            phys_addr,
            bytes,
            heap <- new_mutex!(HeapState {
                heap,
                live: RBTree::new(),
            }),
            pinned_mappings: Atomic::new(0),
        }),
        GFP_KERNEL,
    )?;
    memories.push(memory.clone(), GFP_KERNEL)?;
    Ok(memory)
}
