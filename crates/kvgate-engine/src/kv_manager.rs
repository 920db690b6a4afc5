//! Block tables of sequences over the [`BlockPool`]: prefix-cache matching, growing a table for the
//! next chunk (all or nothing), copy-on-write of a shared partial block, registering full blocks in the
//! prefix cache, forking, and release. Pure bookkeeping over integer ids.

use crate::block_pool::{BlockId, BlockPool, BlockRef};

/// A sequence's block table and how much of it is registered in the prefix cache.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    /// Logical → physical block ids.
    pub(crate) blocks: Vec<BlockId>,
    /// Leading blocks already registered (or found) in the prefix cache.
    registered: usize,
    /// Identity of the last registered block (the parent of the next one).
    last_ref: Option<BlockRef>,
}

impl SeqBlocks {
    #[cfg(test)]
    /// True when the table holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
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

/// A block copy the cache must perform before the step runs (copy-on-write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// Source block.
    pub src: BlockId,
    /// Destination block.
    pub dst: BlockId,
}

/// Prefix-cache counters, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Prompt tokens looked up.
    pub queries: u64,
    /// Prompt tokens found.
    pub hits: u64,
}

/// Tables over one pool.
#[derive(Debug, Clone)]
pub struct KvManager {
    pool: BlockPool,
    block_size: usize,
    prefix_caching: bool,
    stats: PrefixStats,
}

impl KvManager {
    /// A manager over `pool`.
    pub fn new(pool: BlockPool, block_size: usize, prefix_caching: bool) -> KvManager {
        KvManager {
            pool,
            block_size,
            prefix_caching,
            stats: PrefixStats::default(),
        }
    }

    /// The pool.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
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

    /// Finds the longest run of cached full blocks of `tokens` (at most `max_blocks`), takes a reference
    /// on each, and returns them as a new table. Counts `tokens.len()` queried tokens if `count`.
    pub fn match_prefix(&mut self, tokens: &[u32], max_blocks: usize, extra: &str, count: bool) -> SeqBlocks {
        let mut sb = SeqBlocks::default();
        if count {
            self.stats.queries += tokens.len() as u64;
        }
        if !self.prefix_caching {
            return sb;
        }
        let bs = self.block_size;
        for i in 0..max_blocks.min(tokens.len() / bs) {
            match self.pool.lookup(sb.last_ref, &tokens[i * bs..(i + 1) * bs], extra) {
                Some(b) => {
                    self.pool.incref(b);
                    sb.blocks.push(b);
                    sb.last_ref = self.pool.block_ref(b);
                    sb.registered += 1;
                }
                None => break,
            }
        }
        if count {
            self.stats.hits += (sb.blocks.len() * bs) as u64;
        }
        sb
    }

    /// New blocks needed so that `computed..upto` can be written (including one for copy-on-write).
    pub fn blocks_needed(&self, sb: &SeqBlocks, computed: usize, upto: usize) -> usize {
        let bs = self.block_size;
        let want = upto.div_ceil(bs);
        let grow = want.saturating_sub(sb.blocks.len());
        grow + usize::from(self.needs_cow(sb, computed, upto))
    }

    fn needs_cow(&self, sb: &SeqBlocks, computed: usize, upto: usize) -> bool {
        let bs = self.block_size;
        upto > computed
            && !computed.is_multiple_of(bs)
            && sb
                .blocks
                .get(computed / bs)
                .is_some_and(|&b| self.pool.ref_count(b) > 1)
    }

    /// Makes `computed..upto` writable: copies a shared partial block (recording the copy) and appends
    /// fresh blocks. All or nothing: returns false, changing nothing, if the pool has too few free blocks.
    pub fn reserve(&mut self, sb: &mut SeqBlocks, computed: usize, upto: usize, copies: &mut Vec<BlockCopy>) -> bool {
        if self.blocks_needed(sb, computed, upto) > self.pool.num_free() {
            return false;
        }
        let bs = self.block_size;
        if self.needs_cow(sb, computed, upto) {
            let i = computed / bs;
            let src = sb.blocks[i];
            let dst = self.pool.allocate().expect("checked free count");
            copies.push(BlockCopy { src, dst });
            self.pool.decref(src);
            sb.blocks[i] = dst;
        }
        while sb.blocks.len() < upto.div_ceil(bs) {
            let b = self.pool.allocate().expect("checked free count");
            sb.blocks.push(b);
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
        let full = (computed / bs).min(sb.blocks.len());
        while sb.registered < full {
            let i = sb.registered;
            let b = sb.blocks[i];
            let holder = self.pool.register(b, sb.last_ref, &tokens[i * bs..(i + 1) * bs], extra);
            if decision && holder == b {
                self.pool.mark_decision_warmed(b);
            }
            sb.last_ref = self.pool.block_ref(holder);
            sb.registered += 1;
        }
    }

    /// A second table sharing every block of `sb` (one more reference each).
    pub fn fork(&mut self, sb: &SeqBlocks) -> SeqBlocks {
        for &b in &sb.blocks {
            self.pool.incref(b);
        }
        sb.clone()
    }

    /// Returns every block of the table to the pool.
    pub fn release(&mut self, sb: &mut SeqBlocks) {
        // Release in reverse so that a prefix's tail blocks are evicted before its head.
        for &b in sb.blocks.iter().rev() {
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
mod tests {
    use super::*;

    #[test]
    fn prefix_hits_then_cow_on_fork() {
        let mut m = KvManager::new(BlockPool::new(8), 4, true);
        let toks: Vec<u32> = (0..10).collect();
        let mut a = m.match_prefix(&toks, 2, "", true);
        assert!(a.is_empty());
        let mut copies = vec![];
        assert!(m.reserve(&mut a, 0, 10, &mut copies));
        assert_eq!(a.blocks.len(), 3);
        m.commit(&mut a, &toks, 10, "", false);
        // a second sequence with the same 8-token prefix hits two blocks
        let mut b = m.match_prefix(&toks, 2, "", true);
        assert_eq!(b.blocks, a.blocks[..2].to_vec());
        assert_eq!(m.stats(), PrefixStats { queries: 20, hits: 8 });
        // fork a, then writing at position 10 (partial block 2) copies it
        let mut c = m.fork(&a);
        assert_eq!(m.blocks_needed(&c, 10, 11), 1);
        assert!(m.reserve(&mut c, 10, 11, &mut copies));
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].src, a.blocks[2]);
        assert_ne!(c.blocks[2], a.blocks[2]);
        // the original is now the only owner: no copy
        assert!(m.reserve(&mut a, 10, 11, &mut copies));
        assert_eq!(copies.len(), 1);
        for sb in [&mut a, &mut b, &mut c] {
            m.release(sb);
        }
        let counts = m.pool().counts();
        assert_eq!(counts.used, 0);
        assert_eq!(counts.cached_free, 2);
        m.pool().check_invariants();
    }

    #[test]
    fn reserve_is_all_or_nothing() {
        let mut m = KvManager::new(BlockPool::new(2), 4, true);
        let mut a = SeqBlocks::default();
        let mut copies = vec![];
        assert!(!m.reserve(&mut a, 0, 9, &mut copies));
        assert!(a.is_empty());
        assert_eq!(m.pool().num_free(), 2);
    }
}
