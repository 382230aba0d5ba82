// SPDX-License-Identifier: GPL-2.0

//! An allocation of HBM: a range of the BAR, owned by the open file that made it and by every
//! dma-buf exported from it. The range goes back to the heap when the last owner lets go.

use crate::{hbm::Hbm, heap::Range};
use kernel::{prelude::*, rbtree::RBTreeNodeReservation, sync::Arc};

pub(crate) struct Allocation {
    hbm: Arc<Hbm>,
    handle: u32,
    /// Taken back in `drop`.
    range: Option<Range>,
    /// A range of a companion device's BAR (offset, length): its owner's memory, not the
    /// heap's, so nothing is given back.
    borrowed: Option<(u64, u64)>,
}

impl Allocation {
    /// Allocates `len` bytes aligned to `align` (both validated by the caller) for the current
    /// process, under `handle` (from [`Hbm::handles`]).
    pub(crate) fn new(hbm: &Arc<Hbm>, handle: u32, len: u64, align: u64) -> Result<Arc<Self>> {
        let record = RBTreeNodeReservation::new(GFP_KERNEL)?;
        let pid = crate::sys::task::current_tgid();
        let range = {
            let mut state = hbm.memory.heap.lock();
            let range = state.heap.alloc(len, align)?;
            state
                .live
                .insert(record.into_node(range.offset(), (handle, len, pid)));
            range
        };
        // If this fails, dropping the value gives the range back.
        Ok(Arc::new(
            Self {
                hbm: hbm.clone(),
                handle,
                range: Some(range),
                borrowed: None,
            },
            GFP_KERNEL,
        )?)
    }

    /// `len` bytes at `offset` of a companion device's BAR (validated by the caller), which
    /// its owner's runtime allocated: exported as they are, never given to the heap.
    pub(crate) fn borrowed(hbm: &Arc<Hbm>, offset: u64, len: u64) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                hbm: hbm.clone(),
                handle: 0,
                range: None,
                borrowed: Some((offset, len)),
            },
            GFP_KERNEL,
        )?)
    }

    pub(crate) fn hbm(&self) -> &Arc<Hbm> {
        &self.hbm
    }

    pub(crate) fn handle(&self) -> u32 {
        self.handle
    }

    /// Offset of the range in the BAR.
    pub(crate) fn offset(&self) -> u64 {
        match (&self.range, self.borrowed) {
            (Some(range), _) => range.offset(),
            (None, Some((offset, _))) => offset,
            (None, None) => 0,
        }
    }

    pub(crate) fn len(&self) -> u64 {
        match (&self.range, self.borrowed) {
            (Some(range), _) => range.len(),
            (None, Some((_, len))) => len,
            (None, None) => 0,
        }
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Some(range) = self.range.take() {
            let mut state = self.hbm.memory.heap.lock();
            state.live.remove(&range.offset());
            state.heap.free(range);
        }
    }
}
