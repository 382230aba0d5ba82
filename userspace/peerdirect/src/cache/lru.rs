//! A recency list: values in slots of a slab, linked from most to least recently used, so that
//! touching, inserting, removing and finding the oldest are all O(1).

/// Where a value lives in an [`Lru`] until it is removed; then the slot may be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Slot(usize);

const NIL: usize = usize::MAX;

#[derive(Debug)]
struct Node<T> {
    /// `None` while the slot is on the free list.
    value: Option<T>,
    /// Towards the most recently used.
    newer: usize,
    /// Towards the least recently used.
    older: usize,
}

/// Values ordered by last use.
#[derive(Debug)]
pub(super) struct Lru<T> {
    nodes: Vec<Node<T>>,
    free: Vec<usize>,
    newest: usize,
    oldest: usize,
    len: usize,
}

impl<T> Lru<T> {
    pub(super) fn new() -> Self {
        Self {
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            len: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Adds `value` as the most recently used.
    pub(super) fn insert(&mut self, value: T) -> Slot {
        let node = Node {
            value: Some(value),
            newer: NIL,
            older: NIL,
        };
        let index = match self.free.pop() {
            Some(index) => {
                self.nodes[index] = node;
                index
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        };
        self.link_newest(index);
        self.len += 1;
        Slot(index)
    }

    /// The value in `slot`.
    ///
    /// # Panics
    ///
    /// If `slot` was removed: the caller's index and this list disagree.
    pub(super) fn get(&self, slot: Slot) -> &T {
        self.nodes[slot.0]
            .value
            .as_ref()
            .expect("LRU slot used after removal")
    }

    /// Makes `slot` the most recently used.
    pub(super) fn touch(&mut self, slot: Slot) {
        if self.newest != slot.0 {
            self.unlink(slot.0);
            self.link_newest(slot.0);
        }
    }

    /// Takes the value out of `slot`.
    ///
    /// # Panics
    ///
    /// If `slot` was removed already.
    pub(super) fn remove(&mut self, slot: Slot) -> T {
        let value = self.nodes[slot.0]
            .value
            .take()
            .expect("LRU slot removed twice");
        self.unlink(slot.0);
        self.free.push(slot.0);
        self.len -= 1;
        value
    }

    /// The least recently used slot.
    pub(super) fn oldest(&self) -> Option<Slot> {
        (self.oldest != NIL).then_some(Slot(self.oldest))
    }

    /// The slot used next after `slot`, towards the most recently used.
    pub(super) fn newer(&self, slot: Slot) -> Option<Slot> {
        let newer = self.nodes[slot.0].newer;
        (newer != NIL).then_some(Slot(newer))
    }

    /// The values from the most to the least recently used.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        let mut index = self.newest;
        std::iter::from_fn(move || {
            let node = self.nodes.get(index)?;
            index = node.older;
            node.value.as_ref()
        })
    }

    fn link_newest(&mut self, index: usize) {
        self.nodes[index].newer = NIL;
        self.nodes[index].older = self.newest;
        match self.newest {
            NIL => self.oldest = index,
            newest => self.nodes[newest].newer = index,
        }
        self.newest = index;
    }

    fn unlink(&mut self, index: usize) {
        let Node { newer, older, .. } = self.nodes[index];
        match newer {
            NIL => self.newest = older,
            newer => self.nodes[newer].older = older,
        }
        match older {
            NIL => self.oldest = newer,
            older => self.nodes[older].newer = newer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(lru: &Lru<char>) -> String {
        lru.iter().collect()
    }

    #[test]
    fn newest_first_oldest_last() {
        let mut lru = Lru::new();
        let a = lru.insert('a');
        let b = lru.insert('b');
        let c = lru.insert('c');
        assert_eq!(order(&lru), "cba");
        assert_eq!(lru.oldest(), Some(a));
        lru.touch(a);
        assert_eq!(order(&lru), "acb");
        assert_eq!(lru.oldest(), Some(b));
        lru.touch(a);
        assert_eq!(order(&lru), "acb");
        assert_eq!(lru.remove(c), 'c');
        assert_eq!(order(&lru), "ab");
        assert_eq!(lru.remove(b), 'b');
        assert_eq!(lru.oldest(), Some(a));
        assert_eq!(lru.remove(a), 'a');
        assert_eq!((lru.len(), lru.oldest()), (0, None));
        assert_eq!(order(&lru), "");
    }

    #[test]
    fn removed_slots_are_reused() {
        let mut lru = Lru::new();
        let a = lru.insert('a');
        lru.insert('b');
        lru.remove(a);
        let c = lru.insert('c');
        assert_eq!(c, a);
        assert_eq!(*lru.get(c), 'c');
        assert_eq!(order(&lru), "cb");
        assert_eq!(lru.len(), 2);
    }

    #[test]
    #[should_panic(expected = "LRU slot removed twice")]
    fn removing_twice_is_a_bug() {
        let mut lru = Lru::new();
        let a = lru.insert('a');
        lru.remove(a);
        lru.remove(a);
    }
}
