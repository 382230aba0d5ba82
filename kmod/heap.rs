// SPDX-License-Identifier: GPL-2.0

//! The HBM range allocator: hands out aligned ranges of a BAR and coalesces them on free.
//!
//! Free ranges live in two trees: by offset (to find the neighbours a freed range merges with)
//! and by (length, offset) (best fit: the smallest free range that can hold the request). Both
//! operations are O(log n) in the number of free ranges, plus, for alignments larger than the
//! free ranges' own, a walk over the candidates of sufficient length.
//!
//! Tree nodes are reserved before the trees change, so an operation either fails with ENOMEM
//! and leaves the heap as it was, or succeeds. A [`Range`] carries the nodes its own free will
//! need, so freeing never allocates and cannot fail.

use kernel::{
    page::PAGE_SIZE,
    prelude::*,
    rbtree::{RBTree, RBTreeNodeReservation},
};

type ByOffset = RBTree<u64, u64>;
type BySize = RBTree<(u64, u64), ()>;

/// An allocated range of the heap. Give it back with [`Heap::free`].
pub(crate) struct Range {
    offset: u64,
    len: u64,
    /// The nodes [`Heap::free`] inserts the freed (and merged) range with.
    free_nodes: (
        RBTreeNodeReservation<u64, u64>,
        RBTreeNodeReservation<(u64, u64), ()>,
    ),
}

impl Range {
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }
}

/// Free space of one BAR.
pub(crate) struct Heap {
    size: u64,
    free_bytes: u64,
    by_offset: ByOffset,
    by_size: BySize,
}

fn align_up(value: u64, align: u64) -> Option<u64> {
    Some(value.checked_add(align - 1)? & !(align - 1))
}

impl Heap {
    /// A heap over `0..size`, all free.
    pub(crate) fn new(size: u64) -> Result<Self> {
        let mut heap = Self {
            size,
            free_bytes: 0,
            by_offset: RBTree::new(),
            by_size: RBTree::new(),
        };
        if size > 0 {
            heap.by_offset.try_create_and_insert(0, size, GFP_KERNEL)?;
            heap.by_size
                .try_create_and_insert((size, 0), (), GFP_KERNEL)?;
            heap.free_bytes = size;
        }
        Ok(heap)
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Allocates `len` bytes at an offset that is a multiple of `align`.
    ///
    /// `len` must be a non-zero multiple of the page size and `align` a power of two of at
    /// least a page (callers validate user input first): `EINVAL` otherwise. `ENOMEM` when no
    /// free range can hold it.
    pub(crate) fn alloc(&mut self, len: u64, align: u64) -> Result<Range> {
        let page = PAGE_SIZE as u64;
        if len == 0 || len % page != 0 || !align.is_power_of_two() || align < page {
            return Err(EINVAL);
        }
        // Everything that can fail happens before the trees change.
        let free_nodes = (
            RBTreeNodeReservation::new(GFP_KERNEL)?,
            RBTreeNodeReservation::new(GFP_KERNEL)?,
        );
        let head = (
            RBTreeNodeReservation::new(GFP_KERNEL)?,
            RBTreeNodeReservation::new(GFP_KERNEL)?,
        );

        let (free_off, free_len, start) = self.best_fit(len, align).ok_or(ENOMEM)?;

        // Take the free range out; the nodes it had serve the tail, fresh ones the head.
        let tail_offset = self
            .by_offset
            .remove_node(&free_off)
            .map(|n| n.into_reservation());
        let tail_size = self
            .by_size
            .remove_node(&(free_len, free_off))
            .map(|n| n.into_reservation());
        let end = start + len;
        let free_end = free_off + free_len;
        if start > free_off {
            self.insert_free(free_off, start - free_off, head.0, head.1);
        }
        if end < free_end {
            if let (Some(by_offset), Some(by_size)) = (tail_offset, tail_size) {
                self.insert_free(end, free_end - end, by_offset, by_size);
            }
        }
        self.free_bytes -= len;
        Ok(Range {
            offset: start,
            len,
            free_nodes,
        })
    }

    /// The smallest free range that can hold `len` bytes aligned to `align`:
    /// (its offset, its length, the aligned start inside it).
    fn best_fit(&mut self, len: u64, align: u64) -> Option<(u64, u64, u64)> {
        let mut cursor = self.by_size.cursor_lower_bound_mut(&(len, 0))?;
        loop {
            let (&(free_len, free_off), ()) = cursor.current();
            if let Some(start) = align_up(free_off, align) {
                if start.checked_add(len)? <= free_off + free_len {
                    return Some((free_off, free_len, start));
                }
            }
            cursor = cursor.move_next()?;
        }
    }

    fn insert_free(
        &mut self,
        offset: u64,
        len: u64,
        by_offset: RBTreeNodeReservation<u64, u64>,
        by_size: RBTreeNodeReservation<(u64, u64), ()>,
    ) {
        self.by_offset.insert(by_offset.into_node(offset, len));
        self.by_size.insert(by_size.into_node((len, offset), ()));
    }

    /// Gives `range` back, merged with the free ranges on either side.
    pub(crate) fn free(&mut self, range: Range) {
        let Range {
            mut offset,
            len,
            free_nodes,
        } = range;
        let mut end = offset + len;

        let (prev, next) = match self.by_offset.cursor_lower_bound(&offset) {
            Some(cursor) => (
                cursor.peek_prev().map(|(&o, &l)| (o, l)),
                Some(cursor.current()).map(|(&o, &l)| (o, l)),
            ),
            // Nothing free at or after `offset`: the last free range, if any, is before it.
            None => (
                self.by_offset.cursor_back().map(|c| {
                    let (&o, &l) = c.current();
                    (o, l)
                }),
                None,
            ),
        };
        if let Some((prev_off, prev_len)) = prev {
            if prev_off + prev_len == offset {
                self.by_offset.remove(&prev_off);
                self.by_size.remove(&(prev_len, prev_off));
                offset = prev_off;
            }
        }
        if let Some((next_off, next_len)) = next {
            if next_off == end {
                self.by_offset.remove(&next_off);
                self.by_size.remove(&(next_len, next_off));
                end = next_off + next_len;
            }
        }
        self.insert_free(offset, end - offset, free_nodes.0, free_nodes.1);
        self.free_bytes += len;
    }
}

#[cfg(peerdirect_kunit)]
#[kunit_tests(peerdirect_heap)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const PAGE: u64 = PAGE_SIZE as u64;

    #[test]
    fn allocates_aligned_and_refuses_what_does_not_fit() {
        let mut heap = Heap::new(64 * MIB).unwrap();
        let a = heap.alloc(PAGE, PAGE).unwrap();
        assert_eq!(a.offset(), 0);
        let b = heap.alloc(2 * MIB, 2 * MIB).unwrap();
        assert_eq!(b.offset(), 2 * MIB);
        assert_eq!(heap.free_bytes(), 64 * MIB - 2 * MIB - PAGE);
        assert!(matches!(heap.alloc(64 * MIB, PAGE), Err(e) if e == ENOMEM));
        assert!(matches!(heap.alloc(0, PAGE), Err(e) if e == EINVAL));
        assert!(matches!(heap.alloc(PAGE, 3 * PAGE), Err(e) if e == EINVAL));
        assert!(matches!(heap.alloc(PAGE + 1, PAGE), Err(e) if e == EINVAL));
        heap.free(a);
        heap.free(b);
        assert_eq!(heap.free_bytes(), 64 * MIB);
    }

    #[test]
    fn coalesces_so_the_whole_heap_fits_again() {
        let mut heap = Heap::new(16 * MIB).unwrap();
        let mut ranges = KVec::new();
        while let Ok(r) = heap.alloc(64 * 1024, PAGE) {
            ranges.push(r, GFP_KERNEL).unwrap();
        }
        assert_eq!(ranges.len(), 256);
        assert_eq!(heap.free_bytes(), 0);
        // Free every other range, then the rest: every merge case (left, right, both) occurs.
        let mut odd = KVec::new();
        let mut i = 0;
        while let Some(r) = ranges.pop() {
            if i % 2 == 0 {
                heap.free(r);
            } else {
                odd.push(r, GFP_KERNEL).unwrap();
            }
            i += 1;
        }
        assert!(matches!(heap.alloc(128 * 1024, PAGE), Err(e) if e == ENOMEM));
        while let Some(r) = odd.pop() {
            heap.free(r);
        }
        let all = heap.alloc(16 * MIB, 16 * MIB).unwrap();
        assert_eq!((all.offset(), all.len()), (0, 16 * MIB));
        heap.free(all);
    }

    #[test]
    fn best_fit_keeps_large_ranges_whole() {
        let mut heap = Heap::new(8 * MIB).unwrap();
        let a = heap.alloc(PAGE, PAGE).unwrap();
        let b = heap.alloc(PAGE, PAGE).unwrap();
        let c = heap.alloc(PAGE, PAGE).unwrap();
        heap.free(b); // a one-page hole between a and c
        let d = heap.alloc(PAGE, PAGE).unwrap();
        assert_eq!(d.offset(), PAGE);
        // An aligned request skips ranges whose aligned start does not fit.
        let e = heap.alloc(2 * MIB, 2 * MIB).unwrap();
        assert_eq!(e.offset(), 2 * MIB);
        for r in [a, c, d, e] {
            heap.free(r);
        }
        assert_eq!(heap.free_bytes(), 8 * MIB);
    }
}
