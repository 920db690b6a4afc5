//! The second tier's host-memory part: records (a block's [`BlockMeta`] and its bytes, shared, never
//! copied again) under a byte budget, least recently used first out. Pure bookkeeping over keys.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::key::{BlockMeta, ChainKey};

#[derive(Debug)]
struct Entry {
    meta: BlockMeta,
    bytes: Arc<[u8]>,
    tick: u64,
}

/// Records in memory, bounded by bytes.
#[derive(Debug, Default)]
pub(crate) struct MemoryTier {
    budget: u64,
    used: u64,
    entries: HashMap<ChainKey, Entry>,
    lru: BTreeMap<u64, ChainKey>,
    tick: u64,
}

impl MemoryTier {
    /// An empty tier of `budget` bytes.
    pub(crate) fn new(budget: u64) -> MemoryTier {
        MemoryTier {
            budget,
            ..Default::default()
        }
    }

    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Whether a record of `bytes` bytes can ever fit.
    pub(crate) fn fits(&self, bytes: usize) -> bool {
        bytes as u64 <= self.budget
    }

    /// Whether the record `key` with this parent and tokens is here.
    pub(crate) fn holds(&self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> bool {
        self.entries.get(&key).is_some_and(|e| e.meta.is(key, parent, tokens))
    }

    fn touch(&mut self, key: ChainKey) {
        self.tick += 1;
        if let Some(e) = self.entries.get_mut(&key) {
            self.lru.remove(&e.tick);
            e.tick = self.tick;
            self.lru.insert(self.tick, key);
        }
    }

    /// The bytes of record `key` when its parent and tokens match (it becomes the most recently used).
    pub(crate) fn get(&mut self, key: ChainKey, parent: ChainKey, tokens: &[u32]) -> Option<Arc<[u8]>> {
        if !self.holds(key, parent, tokens) {
            return None;
        }
        self.touch(key);
        self.entries.get(&key).map(|e| e.bytes.clone())
    }

    /// Adds a record (replacing one under the same key) and returns the records pushed out to stay
    /// within the budget, least recently used first. A record larger than the budget is returned as is.
    pub(crate) fn put(&mut self, meta: BlockMeta, bytes: Arc<[u8]>) -> Vec<(BlockMeta, Arc<[u8]>)> {
        if !self.fits(bytes.len()) {
            return vec![(meta, bytes)];
        }
        self.remove(meta.key);
        self.tick += 1;
        self.used += bytes.len() as u64;
        self.lru.insert(self.tick, meta.key);
        self.entries.insert(
            meta.key,
            Entry {
                meta,
                bytes,
                tick: self.tick,
            },
        );
        let mut out = vec![];
        while self.used > self.budget {
            let Some((_, key)) = self.lru.pop_first() else { break };
            if let Some(e) = self.entries.remove(&key) {
                self.used -= e.bytes.len() as u64;
                out.push((e.meta, e.bytes));
            }
        }
        out
    }

    /// Takes every record out, least recently used first.
    pub(crate) fn drain(&mut self) -> Vec<(BlockMeta, Arc<[u8]>)> {
        let lru = std::mem::take(&mut self.lru);
        self.used = 0;
        lru.into_values()
            .filter_map(|k| self.entries.remove(&k).map(|e| (e.meta, e.bytes)))
            .collect()
    }

    /// Drops record `key`, if held.
    pub(crate) fn remove(&mut self, key: ChainKey) {
        if let Some(e) = self.entries.remove(&key) {
            self.lru.remove(&e.tick);
            self.used -= e.bytes.len() as u64;
        }
    }

    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        assert_eq!(self.entries.len(), self.lru.len());
        assert!(self.used <= self.budget);
        let sum: u64 = self.entries.values().map(|e| e.bytes.len() as u64).sum();
        assert_eq!(sum, self.used);
        for (t, k) in &self.lru {
            assert_eq!(self.entries[k].tick, *t);
        }
    }
}
