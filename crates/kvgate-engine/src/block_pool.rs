//! The block pool: reference counts over integer block ids, an O(1) LRU list of free blocks, and the
//! prefix cache's index of full blocks. Pure bookkeeping, no tensors.
//!
//! A block is always in exactly one of three states:
//! - **used**: `ref_count ≥ 1` (held by sequences, or pinned);
//! - **free and cached**: `ref_count = 0`, has an identity in the prefix-cache index, sits in the free list
//!   (evictable, most recently freed at the tail);
//! - **free**: `ref_count = 0`, no identity, sits in the free list (at the head: reused first).
//!
//! Prefix-cache identity of a full block = (its parent block's identity, its token ids, the extra key
//! such as `cache_salt`). The parent is named by `(block id, generation)`; a block's generation changes
//! whenever it loses its identity (eviction), so a cached child of an evicted parent can never be matched
//! through the block id's next life. A 64-bit hash only indexes the candidates: a hit is taken only when
//! parent, tokens and extra key all compare equal, so hash collisions cost a comparison, never a wrong
//! hit.
//!
//! Every identity also carries its content [`ChainKey`] (and its parent's), which outlives the block id:
//! an evicted identity is handed back as a [`BlockMeta`], so a second tier can keep the block by content.
//! When KV events are recorded (`crate::kv_events`), every identity gained or lost is noted too, under
//! its token chain alone (twins across path keys counted as one; tenant-salted ones never).

use std::collections::HashMap;

use crate::kv_events::{block_hash, KvEvent};
use crate::salts::tenant_of;
use crate::tier::{BlockMeta, ChainKey};

/// A physical block id. Only the pool makes them, so every id in circulation names a block of its
/// pool (pools never shrink); `u32::from` gives the plain integer that batches and kernels take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    /// The block's index in the cache.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of block `i` (tests of bookkeeping that holds ids without a pool).
    #[cfg(test)]
    pub(crate) fn from_index(i: usize) -> BlockId {
        BlockId(i as u32)
    }
}

impl From<BlockId> for u32 {
    fn from(b: BlockId) -> u32 {
        b.0
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identity of a cached block as a parent: `(block id, generation)`.
pub type BlockRef = (BlockId, u32);

const NIL: u32 = u32::MAX;

/// The 64-bit index hash of a block identity (replaceable in tests to force collisions).
pub type KeyHasher = fn(parent: Option<BlockRef>, tokens: &[u32], extra: &str) -> u64;

/// FNV-1a over the parent, the tokens and the extra key.
pub fn default_hasher(parent: Option<BlockRef>, tokens: &[u32], extra: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    match parent {
        Some((b, g)) => eat(((b.0 as u64) << 32) | g as u64),
        None => eat(u64::MAX),
    }
    for &t in tokens {
        eat(t as u64);
    }
    for b in extra.bytes() {
        eat(b as u64 | 0x100);
    }
    h
}

#[derive(Debug, Clone)]
struct Identity {
    hash: u64,
    parent: Option<BlockRef>,
    tokens: Vec<u32>,
    extra: String,
    chain: ChainKey,
    parent_chain: ChainKey,
    /// The key KV events name it by: its token chain alone (no path key), so an exact block and its
    /// fast-path twin are one published block; `None` under a tenant's salt (never published) or
    /// when events are not recorded.
    public: Option<ChainKey>,
    /// Its parent's published key (`None`: a first block, or not published).
    parent_public: Option<ChainKey>,
}

/// Counts for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolCounts {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks with `ref_count ≥ 1`.
    pub used: usize,
    /// Free blocks that keep a prefix-cache identity (evictable).
    pub cached_free: usize,
    /// Free blocks without identity.
    pub plain_free: usize,
}

/// The pool.
#[derive(Debug, Clone)]
pub struct BlockPool {
    ref_count: Vec<u32>,
    generation: Vec<u32>,
    prev: Vec<u32>,
    next: Vec<u32>,
    in_free: Vec<bool>,
    head: u32,
    tail: u32,
    num_free: usize,
    identity: Vec<Option<Identity>>,
    warmed_by_decision: Vec<bool>,
    index: HashMap<u64, Vec<BlockId>>,
    hasher: KeyHasher,
    evictions: u64,
    /// KV events since the last take (`None`: not recorded).
    events: Option<Vec<KvEvent>>,
    /// Blocks cached under each published hash: a hash is stored when its first block gets it and
    /// removed when its last one loses it (an orphaned child and its recomputed twin share a key).
    published: HashMap<u64, u32>,
}

impl BlockPool {
    /// A pool of `n` free blocks.
    pub fn new(n: usize) -> BlockPool {
        Self::with_hasher(n, default_hasher)
    }

    /// A pool with a custom index hash (tests force collisions with a constant one).
    pub fn with_hasher(n: usize, hasher: KeyHasher) -> BlockPool {
        assert!(n < NIL as usize, "pool too large");
        let mut p = BlockPool {
            ref_count: vec![0; n],
            generation: vec![0; n],
            prev: vec![NIL; n],
            next: vec![NIL; n],
            in_free: vec![false; n],
            head: NIL,
            tail: NIL,
            num_free: 0,
            identity: vec![None; n],
            warmed_by_decision: vec![false; n],
            index: HashMap::new(),
            hasher,
            evictions: 0,
            events: None,
            published: HashMap::new(),
        };
        for b in 0..n as u32 {
            p.push_tail(BlockId(b));
        }
        p
    }

    /// Blocks in the pool.
    pub fn total(&self) -> usize {
        self.ref_count.len()
    }

    /// Free blocks (cached or not): what an allocation can get.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Reference count of a block.
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_count[b.index()]
    }

    /// Reference count of the block at index `i` (invariant checks).
    #[cfg(test)]
    pub(crate) fn ref_count_at(&self, i: usize) -> u32 {
        self.ref_count[i]
    }

    /// Identity of a block as a parent, if it is cached.
    pub fn block_ref(&self, b: BlockId) -> Option<BlockRef> {
        self.identity[b.index()]
            .as_ref()
            .map(|_| (b, self.generation[b.index()]))
    }

    /// Cached blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    fn unlink(&mut self, b: BlockId) {
        let (p, n) = (self.prev[b.index()], self.next[b.index()]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b.index()] = NIL;
        self.next[b.index()] = NIL;
        self.in_free[b.index()] = false;
        self.num_free -= 1;
    }

    fn push_tail(&mut self, b: BlockId) {
        self.prev[b.index()] = self.tail;
        self.next[b.index()] = NIL;
        if self.tail == NIL {
            self.head = b.0;
        } else {
            self.next[self.tail as usize] = b.0;
        }
        self.tail = b.0;
        self.in_free[b.index()] = true;
        self.num_free += 1;
    }

    fn push_head(&mut self, b: BlockId) {
        self.next[b.index()] = self.head;
        self.prev[b.index()] = NIL;
        if self.head == NIL {
            self.tail = b.0;
        } else {
            self.prev[self.head as usize] = b.0;
        }
        self.head = b.0;
        self.in_free[b.index()] = true;
        self.num_free += 1;
    }

    fn drop_identity(&mut self, b: BlockId) -> Option<Identity> {
        self.warmed_by_decision[b.index()] = false;
        let id = self.identity[b.index()].take()?;
        if let Some(list) = self.index.get_mut(&id.hash) {
            list.retain(|&x| x != b);
            if list.is_empty() {
                self.index.remove(&id.hash);
            }
        }
        self.generation[b.index()] = self.generation[b.index()].wrapping_add(1);
        if let (Some(events), Some(public)) = (self.events.as_mut(), id.public) {
            let hash = block_hash(public);
            if let Some(n) = self.published.get_mut(&hash) {
                *n -= 1;
                if *n == 0 {
                    self.published.remove(&hash);
                    events.push(KvEvent::Removed { hash });
                }
            }
        }
        Some(id)
    }

    /// Takes the least recently freed block (evicting its cached identity, if any). `None` when no block
    /// is free.
    #[cfg(test)]
    pub fn allocate(&mut self) -> Option<BlockId> {
        self.allocate_evicting().map(|(b, _)| b)
    }

    /// Takes the least recently freed block; when that evicts a cached identity, the block's content
    /// key, parent key and tokens come back with it (its bytes are still in the cache until written).
    pub fn allocate_evicting(&mut self) -> Option<(BlockId, Option<BlockMeta>)> {
        if self.head == NIL {
            return None;
        }
        let b = BlockId(self.head);
        self.unlink(b);
        let evicted = self.drop_identity(b).map(|id| {
            self.evictions += 1;
            BlockMeta {
                key: id.chain,
                parent: id.parent_chain,
                tokens: id.tokens.into(),
                // a tier that keeps it says so under the same hashes
                published: id.public.map(|k| crate::tier::Published {
                    hash: block_hash(k),
                    parent: id.parent_public.map(block_hash),
                }),
            }
        });
        self.ref_count[b.index()] = 1;
        Some((b, evicted))
    }

    /// Every cached block with its content identity: free ones least recently freed first, then the
    /// ones in use.
    pub fn cached_blocks(&self) -> Vec<(BlockId, BlockMeta)> {
        let meta = |b: u32| {
            self.identity[b as usize].as_ref().map(|id| {
                (
                    BlockId(b),
                    BlockMeta {
                        key: id.chain,
                        parent: id.parent_chain,
                        tokens: id.tokens.clone().into(),
                        published: None,
                    },
                )
            })
        };
        let mut out = vec![];
        let mut b = self.head;
        while b != NIL {
            out.extend(meta(b));
            b = self.next[b as usize];
        }
        for b in 0..self.total() as u32 {
            if self.ref_count[b as usize] > 0 {
                out.extend(meta(b));
            }
        }
        out
    }

    /// The content key of a cached block.
    pub fn chain_of(&self, b: BlockId) -> Option<ChainKey> {
        self.identity[b.index()].as_ref().map(|id| id.chain)
    }

    /// Adds a reference (a prefix-cache hit on a free block takes it out of the free list).
    pub fn incref(&mut self, b: BlockId) {
        if self.ref_count[b.index()] == 0 {
            debug_assert!(self.in_free[b.index()]);
            self.unlink(b);
        }
        self.ref_count[b.index()] += 1;
    }

    /// Drops a reference; at zero the block becomes free (cached ones at the LRU tail, others at the
    /// head so they are reused before any cached block is evicted).
    pub fn decref(&mut self, b: BlockId) {
        let rc = &mut self.ref_count[b.index()];
        assert!(*rc > 0, "decref of free block {b}");
        *rc -= 1;
        if *rc == 0 {
            if self.identity[b.index()].is_some() {
                self.push_tail(b);
            } else {
                self.push_head(b);
            }
        }
    }

    /// Looks up the cached block with this identity.
    pub fn lookup(&self, parent: Option<BlockRef>, tokens: &[u32], extra: &str) -> Option<BlockId> {
        let h = (self.hasher)(parent, tokens, extra);
        self.index.get(&h)?.iter().copied().find(|&b| {
            self.identity[b.index()]
                .as_ref()
                .is_some_and(|id| id.parent == parent && id.tokens == tokens && id.extra == extra)
        })
    }

    /// Gives a used, full block its prefix-cache identity (its content key is `parent_chain`'s child).
    /// If an equal block is already cached, nothing changes and that block is returned instead (the
    /// caller keeps using its own copy).
    pub fn register(
        &mut self,
        b: BlockId,
        parent: Option<BlockRef>,
        parent_chain: ChainKey,
        tokens: &[u32],
        extra: &str,
    ) -> BlockId {
        debug_assert!(self.ref_count[b.index()] > 0);
        if self.identity[b.index()].is_some() {
            return b;
        }
        if let Some(existing) = self.lookup(parent, tokens, extra) {
            return existing;
        }
        let hash = (self.hasher)(parent, tokens, extra);
        let chain = parent_chain.child(tokens, extra);
        // the token-chain key is only kept while events are recorded (it costs a hash per block)
        let parent_public = match parent {
            _ if self.events.is_none() => None,
            None => Some(ChainKey::ROOT),
            Some((pb, g)) => self.identity[pb.index()]
                .as_ref()
                .filter(|_| self.generation[pb.index()] == g)
                .and_then(|id| id.public),
        };
        let public = parent_public
            .filter(|_| tenant_of(extra).is_empty())
            .map(|k| k.child(tokens, ""));
        if let (Some(events), Some(key)) = (self.events.as_mut(), public) {
            let n = self.published.entry(block_hash(key)).or_insert(0);
            *n += 1;
            if *n == 1 {
                events.push(KvEvent::Stored {
                    hash: block_hash(key),
                    parent: parent.and(parent_public).map(block_hash),
                    tokens: tokens.into(),
                });
            }
        }
        self.identity[b.index()] = Some(Identity {
            hash,
            parent,
            tokens: tokens.to_vec(),
            extra: extra.to_string(),
            chain,
            parent_chain,
            public,
            parent_public: parent.and(parent_public),
        });
        self.index.entry(hash).or_default().push(b);
        b
    }

    /// Starts recording KV events (an `AllCleared` first: whatever a consumer knew of this pool is gone).
    /// Called on a fresh pool (blocks cached before it are never published).
    pub fn record_kv_events(&mut self) {
        self.events = Some(vec![KvEvent::AllCleared]);
        self.published.clear();
    }

    /// The hashes a consumer of the events should hold now: every unsalted cached block's.
    #[cfg(test)]
    pub fn published_hashes(&self) -> std::collections::HashSet<u64> {
        self.identity
            .iter()
            .flatten()
            .filter_map(|id| id.public)
            .map(block_hash)
            .collect()
    }

    /// Whether KV events are recorded.
    pub fn records_kv_events(&self) -> bool {
        self.events.is_some()
    }

    /// The events recorded since the last call (empty when not recording).
    pub fn take_kv_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Marks a cached block as computed by a decision (for `decision_prefix_reuse_tokens_total`); the
    /// mark goes with the block's identity.
    pub fn mark_decision_warmed(&mut self, b: BlockId) {
        if self.identity[b.index()].is_some() {
            self.warmed_by_decision[b.index()] = true;
        }
    }

    /// Whether a cached block was computed by a decision.
    pub fn is_decision_warmed(&self, b: BlockId) -> bool {
        self.warmed_by_decision[b.index()]
    }

    /// Counts of each state.
    pub fn counts(&self) -> PoolCounts {
        let mut c = PoolCounts {
            total: self.total(),
            ..Default::default()
        };
        for b in 0..self.total() {
            if self.ref_count[b] > 0 {
                c.used += 1;
            } else if self.identity[b].is_some() {
                c.cached_free += 1;
            } else {
                c.plain_free += 1;
            }
        }
        c
    }

    #[cfg(test)]
    /// Checks every internal invariant (tests call it after each operation): the free list holds
    /// exactly the blocks with `ref_count = 0`, once each, and the index holds exactly the blocks with
    /// identities.
    pub fn check_invariants(&self) {
        let mut seen = vec![false; self.total()];
        let mut n = 0;
        let mut b = self.head;
        let mut prev = NIL;
        while b != NIL {
            assert!(!seen[b as usize], "block {b} twice in the free list");
            seen[b as usize] = true;
            assert_eq!(self.prev[b as usize], prev);
            assert_eq!(self.ref_count[b as usize], 0, "block {b} in the free list with refs");
            assert!(self.in_free[b as usize]);
            n += 1;
            prev = b;
            b = self.next[b as usize];
        }
        assert_eq!(prev, self.tail);
        assert_eq!(n, self.num_free);
        for (i, (&s, &rc)) in seen.iter().zip(&self.ref_count).enumerate() {
            assert_eq!(s, rc == 0, "block {i}: free-list membership vs ref count");
        }
        let indexed: usize = self.index.values().map(Vec::len).sum();
        let with_id = self.identity.iter().filter(|x| x.is_some()).count();
        assert_eq!(indexed, with_id);
        for (h, list) in &self.index {
            for &b in list {
                assert_eq!(self.identity[b.index()].as_ref().map(|i| i.hash), Some(*h));
            }
        }
    }
}

#[cfg(test)]
#[path = "block_pool_tests.rs"]
mod tests;
