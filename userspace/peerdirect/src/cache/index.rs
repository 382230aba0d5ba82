//! Finding a cached registration that contains a requested range, without scanning.
//!
//! Entries are grouped by export, then by (domain, access); a group orders its entries by start
//! offset. Within a group no entry contains another: the cache drops entries that a new one
//! covers before inserting it ([`Index::remove_covered`]), and never inserts one that an entry
//! of its group already contains (it would have been a hit). Ranges of which none contains
//! another are ordered the same way by start and by end, so among the entries starting at or
//! before a request, the last one reaches furthest: the request is inside some entry of the
//! group if and only if it is inside that one. A lookup is one binary search per group whose
//! access suffices, O(g log n) for g such groups of the export (one per domain and access
//! combination in use, typically 1 or 2) and n entries in a group; no false misses.
//!
//! A group is a vector sorted by start, not a tree: a hit reads one contiguous run of memory
//! and follows no pointers. Inserting or removing moves the entries after it, O(n) copies of
//! 24 bytes; n is what one export has cached in one domain (a handful to a few hundred), and
//! misses pay far more for the registration itself.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::key::{Access, DomainId, ExportId, RegKey};
use super::lru::Slot;

/// The entries of one export in one domain with one access.
#[derive(Debug)]
struct Group {
    domain: DomainId,
    access: Access,
    /// (start, end, slot), sorted by start. Starts are unique: two ranges with one start nest.
    by_start: Vec<(u64, u64, Slot)>,
}

impl Group {
    /// How many entries start at or before `offset`.
    fn starting_by(&self, offset: u64) -> usize {
        self.by_start
            .partition_point(|&(start, _, _)| start <= offset)
    }
}

#[derive(Debug, Default)]
pub(super) struct Index {
    exports: HashMap<ExportId, Vec<Group>, BuildHasherDefault<ExportHasher>>,
}

/// Hashes an [`ExportId`] with a multiply and a rotate per word (FxHash's mix) instead of
/// SipHash: a third of a hit's time otherwise. The ids are the kernel's inode numbers and
/// device indices, not something an attacker picks, so there is no hash flooding to resist.
#[derive(Debug, Default)]
struct ExportHasher(u64);

impl Hasher for ExportHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(byte.into());
        }
    }

    fn write_u32(&mut self, word: u32) {
        self.write_u64(word.into());
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl Index {
    /// An entry that serves `request` (same domain and export, at least its access, a range
    /// containing its range).
    pub(super) fn find(&self, request: &RegKey) -> Option<Slot> {
        let range = request.range;
        self.exports
            .get(&request.export)?
            .iter()
            .filter(|group| group.domain == request.domain && group.access.contains(request.access))
            .find_map(|group| {
                let last = group.starting_by(range.offset()).checked_sub(1)?;
                let (_, end, slot) = group.by_start[last];
                (end >= range.end()).then_some(slot)
            })
    }

    /// Adds the entry `key` in `slot`. The caller has checked that no entry of the same
    /// domain, export and access contains it, and removed those it contains.
    pub(super) fn insert(&mut self, key: &RegKey, slot: Slot) {
        let groups = self.exports.entry(key.export).or_default();
        let group = match groups
            .iter()
            .position(|group| group.domain == key.domain && group.access == key.access)
        {
            Some(position) => &mut groups[position],
            None => {
                groups.push(Group {
                    domain: key.domain,
                    access: key.access,
                    by_start: Vec::new(),
                });
                groups.last_mut().expect("just pushed")
            }
        };
        let at = group.starting_by(key.range.offset());
        debug_assert!(
            at == 0 || group.by_start[at - 1].0 != key.range.offset(),
            "{key} nests with a cached entry"
        );
        group
            .by_start
            .insert(at, (key.range.offset(), key.range.end(), slot));
    }

    /// Removes the entry `key`, which must be in the index.
    pub(super) fn remove(&mut self, key: &RegKey) {
        let Some(groups) = self.exports.get_mut(&key.export) else {
            debug_assert!(false, "{key} is not in the index");
            return;
        };
        if let Some(position) = groups
            .iter()
            .position(|group| group.domain == key.domain && group.access == key.access)
        {
            let group = &mut groups[position];
            match group
                .by_start
                .binary_search_by_key(&key.range.offset(), |&(start, _, _)| start)
            {
                Ok(at) => {
                    group.by_start.remove(at);
                }
                Err(_) => debug_assert!(false, "{key} is not in the index"),
            }
            if groups[position].by_start.is_empty() {
                groups.swap_remove(position);
            }
        }
        if groups.is_empty() {
            self.exports.remove(&key.export);
        }
    }

    /// Removes the entries that `key` makes redundant: same domain and export, no more access,
    /// a range inside `key`'s. Appends their slots to `removed`. O(g (log n + k)) for k
    /// removed entries.
    pub(super) fn remove_covered(&mut self, key: &RegKey, removed: &mut Vec<Slot>) {
        let Some(groups) = self.exports.get_mut(&key.export) else {
            return;
        };
        for group in groups
            .iter_mut()
            .filter(|group| group.domain == key.domain && key.access.contains(group.access))
        {
            // Ends grow with starts in a group: the covered entries are a run of those starting
            // at or after the key, ending at the first that reaches past the key's end.
            let first = group
                .by_start
                .partition_point(|&(start, _, _)| start < key.range.offset());
            let count = group.by_start[first..]
                .iter()
                .take_while(|&&(_, end, _)| end <= key.range.end())
                .count();
            removed.extend(
                group
                    .by_start
                    .drain(first..first + count)
                    .map(|(_, _, slot)| slot),
            );
        }
        groups.retain(|group| !group.by_start.is_empty());
        if groups.is_empty() {
            self.exports.remove(&key.export);
        }
    }

    /// Removes every entry of `export`, appending their slots to `removed`.
    pub(super) fn remove_export(&mut self, export: ExportId, removed: &mut Vec<Slot>) {
        if let Some(groups) = self.exports.remove(&export) {
            for group in groups {
                removed.extend(group.by_start.into_iter().map(|(_, _, slot)| slot));
            }
        }
    }

    /// Removes every entry whose export and domain `doomed` picks, appending their slots to
    /// `removed`. Visits every export in the index.
    pub(super) fn remove_where(
        &mut self,
        mut doomed: impl FnMut(ExportId, DomainId) -> bool,
        removed: &mut Vec<Slot>,
    ) {
        self.exports.retain(|&export, groups| {
            groups.retain_mut(|group| {
                if !doomed(export, group.domain) {
                    return true;
                }
                let by_start = std::mem::take(&mut group.by_start);
                removed.extend(by_start.into_iter().map(|(_, _, slot)| slot));
                false
            });
            !groups.is_empty()
        });
    }
}
