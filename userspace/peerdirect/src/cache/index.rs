//! Finding a cached registration that contains a requested range, without walking the cache.
//!
//! Entries are grouped by export, then by (domain, access); a group orders its entries by start
//! offset. Within a group no entry contains another: the cache drops entries that a new one
//! covers before inserting it ([`Index::remove_covered`]), and never inserts one that an entry
//! of its group already contains (it would have been a hit). Ranges of which none contains
//! another are ordered the same way by start and by end, so among the entries starting at or
//! before a request, the last one reaches furthest: the request is inside some entry of the
//! group if and only if it is inside that one. A lookup is one search per group whose access
//! suffices, O(g log n) for g such groups of the export (one per domain and access combination
//! in use, typically 1 or 2) and n entries in a group; no false misses. A group of up to
//! [`SCAN_UP_TO`] entries is counted through instead: its comparisons do not wait on each
//! other's loads as a binary search's do (a hit's latency went from 62 to 51 ns net of the
//! timer where that was measured, 16 entries per group).
//!
//! A group is a vector sorted by start, not a tree: a hit reads one contiguous run of memory
//! and follows no pointers. Inserting or removing moves the entries after it, O(n) copies of
//! 32 bytes; n is what one export has cached in one domain (a handful to a few hundred), and
//! misses pay far more for the registration itself.
//!
//! What a hit reads is kept to a short chain of dependent loads: the export's first group
//! lives in the hash table itself (an export is rarely registered in more than one domain
//! with more than one access), and each element holds its value (the cache's handle on the
//! entry) next to its range, so the hit goes from the table to the group's vector to the
//! entry. And a miss allocates nothing here in the steady state: the vectors of groups that
//! empty are kept (up to [`SPARE_VECTORS`] of up to [`SPARE_CAPACITY`] elements) for the next
//! export's first group.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::key::{Access, DomainId, RegKey};
use crate::invalidation::ExportId;

/// How many emptied group vectors an index keeps for reuse, and the largest capacity it keeps
/// (8 KiB of the cache's 32-byte elements): what a large group grew to is given back.
const SPARE_VECTORS: usize = 64;
const SPARE_CAPACITY: usize = 256;

/// Groups up to this long are counted through, longer ones searched.
const SCAN_UP_TO: usize = 16;

/// One entry of a group: (start, end, value), sorted by start.
type Element<V> = (u64, u64, V);

/// The entries of one export in one domain with one access.
#[derive(Debug)]
struct Group<V> {
    domain: DomainId,
    access: Access,
    /// Sorted by start. Starts are unique: two ranges with one start nest.
    by_start: Vec<Element<V>>,
}

impl<V> Group<V> {
    /// How many entries start at or before `offset`.
    fn starting_by(&self, offset: u64) -> usize {
        if self.by_start.len() <= SCAN_UP_TO {
            // Sorted by start: the count of those at or before `offset` is where they end. Each
            // comparison is independent of the others, where a binary search's loads wait on
            // each other.
            self.by_start
                .iter()
                .map(|&(start, _, _)| usize::from(start <= offset))
                .sum()
        } else {
            self.by_start
                .partition_point(|&(start, _, _)| start <= offset)
        }
    }

    /// The value of its entry that serves `request`, if it has one.
    #[inline]
    fn find(&self, request: &RegKey) -> Option<&V> {
        if self.domain != request.domain || !self.access.contains(request.access) {
            return None;
        }
        let range = request.range;
        let last = self.starting_by(range.offset()).checked_sub(1)?;
        let (_, end, value) = &self.by_start[last];
        (*end >= range.end()).then_some(value)
    }

    fn holds(&self, key: &RegKey) -> bool {
        self.domain == key.domain && self.access == key.access
    }
}

/// An export's groups: the first inline, none of them empty.
#[derive(Debug)]
struct Groups<V> {
    first: Group<V>,
    more: Vec<Group<V>>,
}

impl<V> Groups<V> {
    fn iter(&self) -> impl Iterator<Item = &Group<V>> {
        std::iter::once(&self.first).chain(&self.more)
    }

    fn position(&self, key: &RegKey) -> Option<usize> {
        self.iter().position(|group| group.holds(key))
    }

    fn get_mut(&mut self, position: usize) -> &mut Group<V> {
        match position {
            0 => &mut self.first,
            _ => &mut self.more[position - 1],
        }
    }

    /// Keeps the groups `keep` says to (called once for each), dropping their emptied
    /// vectors into `spare`. Returns whether any group is left.
    fn retain(
        &mut self,
        mut keep: impl FnMut(&mut Group<V>) -> bool,
        spare: &mut Spare<V>,
    ) -> bool {
        self.more.retain_mut(|group| {
            keep(group) || {
                spare.keep(std::mem::take(&mut group.by_start));
                false
            }
        });
        if !keep(&mut self.first) {
            spare.keep(std::mem::take(&mut self.first.by_start));
            match self.more.pop() {
                Some(group) => self.first = group,
                None => return false,
            }
        }
        true
    }
}

/// Emptied vectors, kept for the next new group.
#[derive(Debug)]
struct Spare<V>(Vec<Vec<Element<V>>>);

impl<V> Spare<V> {
    fn keep(&mut self, mut vector: Vec<Element<V>>) {
        vector.clear();
        if self.0.len() < SPARE_VECTORS && (1..=SPARE_CAPACITY).contains(&vector.capacity()) {
            self.0.push(vector);
        }
    }

    fn group(&mut self, key: &RegKey) -> Group<V> {
        Group {
            domain: key.domain,
            access: key.access,
            by_start: self.0.pop().unwrap_or_default(),
        }
    }
}

/// Finds cached entries (their values `V`) by the range they contain.
#[derive(Debug)]
pub(super) struct Index<V> {
    exports: HashMap<ExportId, Groups<V>, BuildHasherDefault<ExportHasher>>,
    spare: Spare<V>,
}

impl<V> Default for Index<V> {
    fn default() -> Self {
        Self {
            exports: HashMap::default(),
            spare: Spare(Vec::new()),
        }
    }
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

impl<V> Index<V> {
    /// The value of an entry that serves `request` (same domain and export, at least its
    /// access, a range containing its range).
    #[inline]
    pub(super) fn find(&self, request: &RegKey) -> Option<&V> {
        let groups = self.exports.get(&request.export)?;
        // The first group alone, then the others: an iterator chained over both would cost a
        // hit a tenth of its time.
        groups
            .first
            .find(request)
            .or_else(|| groups.more.iter().find_map(|group| group.find(request)))
    }

    /// Adds the entry `key` with `value`. The caller has checked that no entry of the same
    /// domain, export and access contains it, and removed those it contains.
    pub(super) fn insert(&mut self, key: &RegKey, value: V) {
        let spare = &mut self.spare;
        let groups = self.exports.entry(key.export).or_insert_with(|| Groups {
            first: spare.group(key),
            more: Vec::new(),
        });
        let group = match groups.position(key) {
            Some(position) => groups.get_mut(position),
            None => {
                groups.more.push(spare.group(key));
                groups.more.last_mut().expect("just pushed")
            }
        };
        let at = group.starting_by(key.range.offset());
        debug_assert!(
            at == 0 || group.by_start[at - 1].0 != key.range.offset(),
            "{key} nests with a cached entry"
        );
        group
            .by_start
            .insert(at, (key.range.offset(), key.range.end(), value));
    }

    /// Removes the entry `key`, which must be in the index, and returns its value.
    pub(super) fn remove(&mut self, key: &RegKey) -> Option<V> {
        let groups = self.exports.get_mut(&key.export)?;
        let position = groups.position(key)?;
        let group = groups.get_mut(position);
        let at = group
            .by_start
            .binary_search_by_key(&key.range.offset(), |&(start, _, _)| start)
            .ok()?;
        let (_, _, value) = group.by_start.remove(at);
        if group.by_start.is_empty()
            && !groups.retain(|group| !group.by_start.is_empty(), &mut self.spare)
        {
            self.exports.remove(&key.export);
        }
        Some(value)
    }

    /// Removes the entries that `key` makes redundant: same domain and export, no more access,
    /// a range inside `key`'s. Appends their values to `removed`. O(g (log n + k)) for k
    /// removed entries.
    pub(super) fn remove_covered(&mut self, key: &RegKey, removed: &mut Vec<V>) {
        let Some(groups) = self.exports.get_mut(&key.export) else {
            return;
        };
        let left = groups.retain(
            |group| {
                if group.domain == key.domain && key.access.contains(group.access) {
                    // Ends grow with starts in a group: the covered entries are a run of those
                    // starting at or after the key, ending at the first that reaches past the
                    // key's end.
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
                            .map(|(_, _, value)| value),
                    );
                }
                !group.by_start.is_empty()
            },
            &mut self.spare,
        );
        if !left {
            self.exports.remove(&key.export);
        }
    }

    /// Removes every entry of `export`, appending their values to `removed`.
    pub(super) fn remove_export(&mut self, export: ExportId, removed: &mut Vec<V>) {
        if let Some(groups) = self.exports.remove(&export) {
            for group in std::iter::once(groups.first).chain(groups.more) {
                let mut by_start = group.by_start;
                removed.extend(by_start.drain(..).map(|(_, _, value)| value));
                self.spare.keep(by_start);
            }
        }
    }

    /// Removes every entry whose export and domain `doomed` picks, appending their values to
    /// `removed`. Visits every export in the index.
    pub(super) fn remove_where(
        &mut self,
        mut doomed: impl FnMut(ExportId, DomainId) -> bool,
        removed: &mut Vec<V>,
    ) {
        let spare = &mut self.spare;
        self.exports.retain(|&export, groups| {
            groups.retain(
                |group| {
                    if doomed(export, group.domain) {
                        removed.extend(group.by_start.drain(..).map(|(_, _, value)| value));
                    }
                    !group.by_start.is_empty()
                },
                spare,
            )
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A group whose entries start at `starts` (sorted), one byte each.
    fn group(starts: &[u64]) -> Group<()> {
        Group {
            domain: DomainId(1),
            access: Access::all(),
            by_start: starts.iter().map(|&start| (start, start + 1, ())).collect(),
        }
    }

    #[test]
    fn counted_and_searched_groups_agree_with_a_scan_at_every_length() {
        for len in 0..=2 * SCAN_UP_TO + 3 {
            let starts: Vec<u64> = (0..len as u64).map(|i| 10 * i + 5).collect();
            let group = group(&starts);
            for offset in 0..10 * len as u64 + 20 {
                let expected = starts.iter().filter(|&&start| start <= offset).count();
                assert_eq!(
                    group.starting_by(offset),
                    expected,
                    "{len} entries, offset {offset}"
                );
            }
        }
    }
}
