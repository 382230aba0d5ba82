//! Finding a cached registration that contains a requested range, without scanning.
//!
//! Entries are grouped by export, then by (domain, access); a group orders its entries by start
//! offset. Within a group no entry contains another: the cache drops entries that a new one
//! covers before inserting it ([`Index::remove_covered`]), and never inserts one that an entry
//! of its group already contains (it would have been a hit). Ranges of which none contains
//! another are ordered the same way by start and by end, so among the entries starting at or
//! before a request, the last one reaches furthest: the request is inside some entry of the
//! group if and only if it is inside that one. A lookup is one B-tree predecessor search per
//! group whose access suffices, O(g log n) for g such groups of the export (one per domain and
//! access combination in use, typically 1 or 2) and n entries in a group; no false misses.

use std::collections::btree_map::BTreeMap;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::ops::Bound;

use super::key::{Access, DomainId, ExportId, RegKey};
use super::lru::Slot;

/// The entries of one export in one domain with one access.
#[derive(Debug)]
struct Group {
    domain: DomainId,
    access: Access,
    /// Start offset to (end, slot). Starts are unique: two ranges with one start nest.
    by_start: BTreeMap<u64, (u64, Slot)>,
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
                let (_, &(end, slot)) = group.by_start.range(..=range.offset()).next_back()?;
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
                    by_start: BTreeMap::new(),
                });
                groups.last_mut().expect("just pushed")
            }
        };
        let previous = group
            .by_start
            .insert(key.range.offset(), (key.range.end(), slot));
        debug_assert!(previous.is_none(), "{key} nests with a cached entry");
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
            let removed = groups[position].by_start.remove(&key.range.offset());
            debug_assert!(removed.is_some(), "{key} is not in the index");
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
            let covered: Vec<u64> = group
                .by_start
                .range((Bound::Included(key.range.offset()), Bound::Unbounded))
                .take_while(|(_, &(end, _))| end <= key.range.end())
                .map(|(&start, _)| start)
                .collect();
            for start in covered {
                let (_, slot) = group.by_start.remove(&start).expect("found above");
                removed.push(slot);
            }
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
                removed.extend(group.by_start.into_values().map(|(_, slot)| slot));
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
                removed.extend(by_start.into_values().map(|(_, slot)| slot));
                false
            });
            !groups.is_empty()
        });
    }
}
