//! Block tables of sequences over the [`BlockPool`]: prefix-cache matching, growing a table for the
//! next chunk (all or nothing), copy-on-write of a shared partial block, registering full blocks in the
//! prefix cache, forking, releasing the blocks that slid out of a windowed model's reach, and release.
//! Pure bookkeeping over integer ids.
//!
//! With a [`SecondTier`], every cached block the pool evicts becomes a pending spill (its bytes must be
//! read before anything writes the block), and a prefix match continues past the hot pool into the
//! tier: a verified hit takes a fresh block, gives it the identity, and becomes a pending restore. The
//! engine carries both out ([`KvManager::take_tier_ops`]) before the step's copies and forward pass:
//! spills are read first, then restores written, so a block evicted and reused within one plan is
//! read before it is overwritten; a restore whose block is evicted again before that is dropped (the
//! tier still holds the record).

use std::sync::Arc;

use kvgate_backend::BlockCopy;

use crate::block_pool::{BlockId, BlockPool, BlockRef};
pub(crate) use crate::salts::Salts;
use crate::tier::{BlockMeta, ChainKey, SecondTier};

/// A sequence's block table and how much of it is registered in the prefix cache.
///
/// Logical block `i` covers tokens `i·block_size..(i+1)·block_size`. The first `released` logical blocks
/// are no longer held (every layer's attention window has slid past them, see
/// [`KvManager::release_slid`]); `live` holds the physical ids of the rest, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    /// Leading logical blocks given back.
    released: usize,
    /// Physical ids of logical blocks `released..`.
    live: Vec<BlockId>,
    /// Leading blocks already registered (or found) in the prefix cache.
    registered: usize,
    /// Identity of the last registered block (the parent of the next one).
    last_ref: Option<BlockRef>,
    /// Content key of the last registered block.
    last_chain: ChainKey,
}

impl SeqBlocks {
    #[cfg(test)]
    /// True when the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Logical length of the table (released blocks included).
    pub fn len(&self) -> usize {
        self.released + self.live.len()
    }

    /// The physical block of logical block `i`: `None` if released or beyond the table.
    pub fn get(&self, i: usize) -> Option<BlockId> {
        i.checked_sub(self.released).and_then(|j| self.live.get(j)).copied()
    }

    /// The blocks still held, in logical order.
    pub fn live(&self) -> &[BlockId] {
        &self.live
    }

    /// Leading logical blocks given back.
    #[cfg(test)]
    pub fn released(&self) -> usize {
        self.released
    }

    /// Leading blocks registered (or found) in the prefix cache.
    #[cfg(test)]
    pub fn registered(&self) -> usize {
        self.registered
    }

    /// The table as the model reads it: `None` for a released block (never read: outside every
    /// layer's window).
    pub fn table(&self) -> Vec<Option<BlockId>> {
        let mut t = vec![None; self.released];
        t.extend(self.live.iter().copied().map(Some));
        t
    }
}

/// Blocks a completion needs at most: the prompt's full blocks are shared by every choice, and each of
/// the `n` choices needs its own tail up to `total_len` tokens (prompt + output).
pub fn blocks_for_choices(block_size: usize, prompt_len: usize, n: usize, total_len: usize) -> usize {
    let shared = prompt_len / block_size;
    shared + n.max(1) * (total_len.div_ceil(block_size) - shared)
}

/// Blocks a forked decision needs at most: the shared prefix's full blocks once, then per read its own
/// blocks past them plus one for the copy-on-write of the shared partial block.
pub fn blocks_for_reads(block_size: usize, shared: usize, read_lens: impl IntoIterator<Item = usize>) -> usize {
    let full = shared / block_size;
    full + read_lens
        .into_iter()
        .map(|len| len.div_ceil(block_size) - full + 1)
        .sum::<usize>()
}

/// Prefix-cache counters, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found.
    pub hits: u64,
}

/// A block whose tier record must be written into it before the next forward pass.
#[derive(Debug)]
pub(crate) struct Restore {
    /// The hot block.
    pub block: BlockId,
    /// The record's bytes.
    pub bytes: Arc<[u8]>,
}

/// What the engine must do between planning a step and running it.
#[derive(Debug, Default)]
pub(crate) struct TierOps {
    /// Evicted cached blocks to read (before anything writes them) and keep in the tier.
    pub spills: Vec<(BlockId, BlockMeta)>,
    /// Tier records to write into hot blocks.
    pub restores: Vec<Restore>,
    /// Blocks the prefix cache registered, to read (before anything writes them) and write behind to
    /// the shared store.
    pub shares: Vec<(BlockId, BlockMeta)>,
}

impl TierOps {
    /// Nothing to do.
    pub fn is_empty(&self) -> bool {
        self.spills.is_empty() && self.restores.is_empty() && self.shares.is_empty()
    }
}

/// Tables over one pool.
#[derive(Debug)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    stats: PrefixStats,
    tier: Option<SecondTier>,
    ops: TierOps,
}

impl KvManager {
    /// A manager over `pool`.
    pub fn new(pool: BlockPool, block_size: usize, prefix_caching: bool) -> KvManager {
        KvManager {
            pool,
            block_size,
            prefix_caching,
            stats: PrefixStats::default(),
            tier: None,
            ops: TierOps::default(),
        }
    }

    /// Whether newly registered blocks are written behind to a shared store.
    fn shares(&self) -> bool {
        self.tier.as_ref().is_some_and(|t| t.shared().is_some())
    }

    /// Puts a second tier behind the pool (returning the one there was).
    pub fn set_tier(&mut self, mut tier: Option<SecondTier>) -> Option<SecondTier> {
        if let (Some(t), true) = (tier.as_mut(), self.pool.records_kv_events()) {
            t.record_events();
        }
        std::mem::replace(&mut self.tier, tier)
    }

    /// The second tier.
    pub fn tier(&self) -> Option<&SecondTier> {
        self.tier.as_ref()
    }

    /// The second tier, to store what spilled.
    pub fn tier_mut(&mut self) -> Option<&mut SecondTier> {
        self.tier.as_mut()
    }

    /// Takes the spills and restores planned so far (see the module doc).
    pub(crate) fn take_tier_ops(&mut self) -> TierOps {
        std::mem::take(&mut self.ops)
    }

    /// Takes a free block; a cached identity it evicts becomes a pending spill (unless the tier has it
    /// already), and a restore still pending into that block is dropped.
    fn allocate(&mut self) -> Option<BlockId> {
        let (b, evicted) = self.pool.allocate_evicting()?;
        if let Some(meta) = evicted {
            if let Some(i) = self.ops.restores.iter().position(|r| r.block == b) {
                self.ops.restores.swap_remove(i);
            } else if let Some(t) = &self.tier {
                if !t.holds(meta.key, meta.parent, &meta.tokens) {
                    self.ops.spills.push((b, meta));
                }
            }
        }
        Some(b)
    }

    /// Continues a match past the hot pool: while the tier holds the next block and a block is free,
    /// takes one, gives it the identity and plans its restore. `exact` says whether the walk may still
    /// take blocks under the exact-path key (see [`Salts`]).
    fn match_tier(&mut self, sb: &mut SeqBlocks, tokens: &[u32], max_blocks: usize, salts: Salts, mut exact: bool) {
        let bs = self.block_size;
        while sb.live.len() < max_blocks.min(tokens.len() / bs) && self.pool.num_free() > 0 {
            let i = sb.live.len();
            let toks = &tokens[i * bs..(i + 1) * bs];
            let Some(tier) = self.tier.as_mut() else { return };
            let mut found = None;
            for (extra, is_exact) in salts.candidates(exact) {
                let key = sb.last_chain.child(toks, extra);
                if let Some((bytes, _)) = tier.fetch(key, sb.last_chain, toks) {
                    found = Some((extra, key, bytes, is_exact));
                    break;
                }
            }
            let Some((extra, key, bytes, is_exact)) = found else {
                return;
            };
            exact = is_exact;
            let Some(b) = self.allocate() else { return };
            let holder = self.pool.register(b, sb.last_ref, sb.last_chain, toks, extra);
            debug_assert_eq!(holder, b, "the hot pool missed this block");
            self.ops.restores.push(Restore { block: b, bytes });
            sb.live.push(b);
            sb.last_ref = self.pool.block_ref(b);
            sb.last_chain = key;
            sb.registered += 1;
        }
    }

    /// The longest run of leading full blocks of `tokens` (at most `max`) the hot pool holds under
    /// `salts`, and whether the walk ended still on exact-path blocks: the greedy walk that takes
    /// exact-path blocks while it can and then the sequence's own, or the walk over its own key alone,
    /// whichever is longer (the first among equals).
    fn hot_walk(&self, tokens: &[u32], max: usize, salts: Salts) -> (Vec<BlockId>, bool) {
        let bs = self.block_size;
        // returns the blocks, whether the walk ended on exact blocks, and whether it started on them
        let walk = |mut exact: bool| {
            let (mut found, mut parent, mut started) = (vec![], None, false);
            while found.len() < max.min(tokens.len() / bs) {
                let toks = &tokens[found.len() * bs..(found.len() + 1) * bs];
                let hit = salts
                    .candidates(exact)
                    .find_map(|(extra, is_exact)| Some((self.pool.lookup(parent, toks, extra)?, is_exact)));
                let Some((b, is_exact)) = hit else { break };
                exact = is_exact;
                started |= found.is_empty() && is_exact;
                parent = self.pool.block_ref(b);
                found.push(b);
            }
            (found, exact, started)
        };
        let (found, exact, started) = walk(salts.exact.is_some());
        // the own-key walk can only differ when the first one started on exact blocks
        if !started {
            return (found, exact);
        }
        let (own, own_exact, _) = walk(false);
        if own.len() > found.len() {
            (own, own_exact)
        } else {
            (found, exact)
        }
    }

    /// The pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The pool, for its KV-event record.
    pub(crate) fn pool_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    /// Prefix-cache counters.
    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Adds to the prefix-cache counters (tokens queried, tokens found).
    pub fn record(&mut self, queries: u64, hits: u64) {
        self.stats.queries += queries;
        self.stats.hits += hits;
    }

    /// Finds the longest run of cached full blocks of `tokens` (at most `max_blocks`) under `salts`,
    /// takes a reference on each, and returns them as a new table. Counts `tokens.len()` queried tokens
    /// if `count`.
    pub fn match_prefix(&mut self, tokens: &[u32], max_blocks: usize, salts: Salts, count: bool) -> SeqBlocks {
        let mut sb = SeqBlocks::default();
        if count {
            self.stats.queries += tokens.len() as u64;
        }
        if !self.prefix_caching {
            return sb;
        }
        let (found, exact) = self.hot_walk(tokens, max_blocks, salts);
        for b in found {
            self.pool.incref(b);
            sb.live.push(b);
            sb.last_ref = self.pool.block_ref(b);
            sb.last_chain = self.pool.chain_of(b).unwrap_or_default();
            sb.registered += 1;
        }
        if self.tier.is_some() {
            self.match_tier(&mut sb, tokens, max_blocks, salts, exact);
        }
        if count {
            self.stats.hits += (sb.live.len() * self.block_size) as u64;
        }
        sb
    }

    /// The leading full blocks of `tokens` (at most `max_blocks`) the prefix cache holds under `salts`,
    /// without taking them: what admission ranks waiting requests by. The second number counts the
    /// blocks past them that the second tier holds (restorable instead of recomputed).
    pub fn probe_prefix(&self, tokens: &[u32], max_blocks: usize, salts: Salts) -> (Vec<BlockId>, usize) {
        if !self.prefix_caching {
            return (vec![], 0);
        }
        let (found, in_tier, _) = self.warm_walk(tokens, max_blocks.min(tokens.len() / self.block_size), salts);
        (found, in_tier)
    }

    /// The hot pool's leading blocks of `tokens` (at most `max`) under `salts`, how many blocks past
    /// them the local tier holds, and the chain key where that walk ended.
    fn warm_walk(&self, tokens: &[u32], max: usize, salts: Salts) -> (Vec<BlockId>, usize, ChainKey) {
        let bs = self.block_size;
        let (found, mut exact) = self.hot_walk(tokens, max, salts);
        let mut chain = found
            .last()
            .and_then(|&b| self.pool.chain_of(b))
            .unwrap_or(ChainKey::ROOT);
        let mut in_tier = 0;
        if let Some(t) = &self.tier {
            while found.len() + in_tier < max {
                let i = found.len() + in_tier;
                let toks = &tokens[i * bs..(i + 1) * bs];
                let hit = salts.candidates(exact).find_map(|(extra, is_exact)| {
                    let key = chain.child(toks, extra);
                    t.holds(key, chain, toks).then_some((key, is_exact))
                });
                let Some((key, is_exact)) = hit else { break };
                (chain, exact) = (key, is_exact);
                in_tier += 1;
            }
        }
        (found, in_tier, chain)
    }

    /// The leading full blocks of `tokens` (at most `max`) past what the hot pool and the local tier
    /// hold under `salts`, as the shared store would key them (the sequence's own key from there on):
    /// what a fetch asks for before the sequence is admitted.
    pub(crate) fn misses(&self, tokens: &[u32], max: usize, salts: Salts) -> Vec<BlockMeta> {
        if !self.prefix_caching {
            return vec![];
        }
        let bs = self.block_size;
        let max = max.min(tokens.len() / bs);
        let (found, in_tier, mut chain) = self.warm_walk(tokens, max, salts);
        let i = found.len() + in_tier;
        let mut out = Vec::with_capacity(max - i);
        for j in i..max {
            let toks = &tokens[j * bs..(j + 1) * bs];
            let key = chain.child(toks, salts.own);
            out.push(BlockMeta {
                key,
                parent: chain,
                tokens: toks.into(),
                published: None,
            });
            chain = key;
        }
        out
    }

    /// New blocks needed so that `computed..upto` can be written (including one for copy-on-write).
    pub fn blocks_needed(&self, sb: &SeqBlocks, computed: usize, upto: usize) -> usize {
        let bs = self.block_size;
        let want = upto.div_ceil(bs);
        let grow = want.saturating_sub(sb.len());
        grow + usize::from(self.needs_cow(sb, computed, upto))
    }

    fn needs_cow(&self, sb: &SeqBlocks, computed: usize, upto: usize) -> bool {
        let bs = self.block_size;
        upto > computed
            && !computed.is_multiple_of(bs)
            && sb.get(computed / bs).is_some_and(|b| self.pool.ref_count(b) > 1)
    }

    /// Makes `computed..upto` writable: copies a shared partial block (recording the copy) and appends
    /// fresh blocks. All or nothing: returns false, changing nothing, if the pool has too few free blocks.
    pub fn reserve(&mut self, sb: &mut SeqBlocks, computed: usize, upto: usize, copies: &mut Vec<BlockCopy>) -> bool {
        if self.blocks_needed(sb, computed, upto) > self.pool.num_free() {
            return false;
        }
        let bs = self.block_size;
        if self.needs_cow(sb, computed, upto) {
            // needs_cow found the block live, so it is past `released`
            let i = computed / bs - sb.released;
            let src = sb.live[i];
            let dst = self.allocate().expect("checked free count");
            copies.push(BlockCopy {
                src: src.into(),
                dst: dst.into(),
            });
            self.pool.decref(src);
            sb.live[i] = dst;
        }
        while sb.len() < upto.div_ceil(bs) {
            let b = self.allocate().expect("checked free count");
            sb.live.push(b);
        }
        true
    }

    /// Registers every full block among the first `computed` tokens in the prefix cache (marking them as
    /// warmed by a decision when `decision`).
    pub fn commit(&mut self, sb: &mut SeqBlocks, tokens: &[u32], computed: usize, extra: &str, decision: bool) {
        if !self.prefix_caching {
            return;
        }
        let bs = self.block_size;
        let full = (computed / bs).min(sb.len());
        while sb.registered < full {
            let i = sb.registered;
            // release_slid never gives back an unregistered block while prefix caching is on
            let Some(b) = sb.get(i) else {
                return;
            };
            let toks = &tokens[i * bs..(i + 1) * bs];
            let holder = self.pool.register(b, sb.last_ref, sb.last_chain, toks, extra);
            if decision && holder == b {
                self.pool.mark_decision_warmed(b);
            }
            if holder == b && self.shares() {
                if let Some(key) = self.pool.chain_of(b) {
                    let meta = BlockMeta {
                        key,
                        parent: sb.last_chain,
                        tokens: toks.into(),
                        published: None,
                    };
                    self.ops.shares.push((b, meta));
                }
            }
            sb.last_ref = self.pool.block_ref(holder);
            sb.last_chain = self.pool.chain_of(holder).unwrap_or_default();
            sb.registered += 1;
        }
    }

    /// Gives back the leading blocks no future query of the sequence can read: with every layer
    /// attending at most `window` tokens back and `computed` tokens in the cache, the next query (at
    /// position `computed` or later) reads positions `≥ computed + 1 − window`, so every block that ends
    /// before that is done. Registered blocks stay in the prefix cache as evictable (free and cached), so
    /// a later request with the same prefix can still find them; with prefix caching on, a block not yet
    /// registered is kept until it is. Returns how many blocks were given back.
    pub fn release_slid(&mut self, sb: &mut SeqBlocks, computed: usize, window: usize) -> usize {
        let first_read = (computed + 1).saturating_sub(window);
        let mut upto = (first_read / self.block_size).min(sb.len());
        if self.prefix_caching {
            upto = upto.min(sb.registered);
        }
        let n = upto.saturating_sub(sb.released).min(sb.live.len());
        // Freed while the sequence's later blocks are still held, so under memory pressure a windowed
        // prefix is evicted head first and a later match stops there (it stays correct, it only finds
        // less). Matching on the last window alone, as vLLM's sliding-window manager does, is not done.
        for b in sb.live.drain(..n) {
            self.pool.decref(b);
        }
        sb.released += n;
        n
    }

    /// Gives back the table's blocks past its first `keep` (speculation's rejected slots): only blocks
    /// never registered in the prefix cache, last first.
    pub fn truncate(&mut self, sb: &mut SeqBlocks, keep: usize) {
        while sb.len() > keep.max(sb.registered).max(sb.released) {
            let Some(b) = sb.live.pop() else { break };
            self.pool.decref(b);
        }
    }

    /// A second table sharing every block of `sb` (one more reference each).
    pub fn fork(&mut self, sb: &SeqBlocks) -> SeqBlocks {
        for &b in &sb.live {
            self.pool.incref(b);
        }
        sb.clone()
    }

    /// Returns every block of the table to the pool.
    pub fn release(&mut self, sb: &mut SeqBlocks) {
        // Release in reverse so that a prefix's tail blocks are evicted before its head.
        for &b in sb.live.iter().rev() {
            self.pool.decref(b);
        }
        *sb = SeqBlocks::default();
    }

    /// Takes an extra reference on blocks (pinning them) / drops it.
    pub fn pin(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.pool.incref(b);
        }
    }

    /// Drops references taken by [`KvManager::pin`].
    pub fn unpin(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.pool.decref(b);
        }
    }
}

#[cfg(test)]
#[path = "kv_manager_tests.rs"]
mod tests;
