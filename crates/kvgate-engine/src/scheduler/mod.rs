//! The continuous-batching scheduler: which sequences run in the next step and how many tokens each
//! gets. Pure bookkeeping over typed ids (no tensors), so it is unit-tested and fuzzed on its own.
//!
//! Per step, within the token budget (`max_num_batched_tokens`) and `max_num_seqs`:
//! 1. decode tokens of running sequences (oldest group first);
//! 2. prefill chunks of running sequences (chunked prefill; decision questions' suffixes);
//! 3. new groups from the FIFO waiting queue, after a prefix-cache lookup, as long as their first chunk's
//!    blocks are available (admission never overcommits the pool).
//!
//! When a running sequence cannot grow, the newest running group is preempted by recompute (its blocks
//! released, its sequences put back to waiting with their tokens so far) and the step is retried; a group
//! that cannot fit even alone is reported as failed instead of looping.
//!
//! The [`Plan`] of a step carries everything the step needs (each chunk's tokens, positions, cache
//! slots and block table), so nothing outside reaches into a sequence. Sequences and groups live in the
//! [`Registry`]; decision layouts and keep-alive pins in [`crate::layout`].

mod admission;
mod config;
mod forks;
mod plan;
mod shared;
mod speculate;
mod step;
mod update;

#[cfg(test)]
use std::collections::HashSet;
use std::collections::VecDeque;

pub use admission::Admission;
pub use config::{Caps, SchedulerConfig, SpecPlan};
pub(crate) use plan::Plan;
pub use plan::{Chunk, GroupUsage, Logits};
pub(crate) use speculate::DraftAsk;
pub(crate) use update::StepUpdate;

use crate::block_pool::{BlockId, BlockPool};
use crate::kv_manager::{KvManager, PrefixStats, TierOps};
use crate::layout::{PinKind, Pins};
#[cfg(test)]
use crate::registry::Seq;
use crate::registry::{GroupId, GroupKind, Registry, SchedError, SeqId};
use crate::tier::SecondTier;

type Result<T> = std::result::Result<T, SchedError>;

/// The scheduler and everything it owns: the sequences, the block tables, the pool, the queues, the pins.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    reg: Registry,
    waiting: VecDeque<GroupId>,
    running: Vec<GroupId>,
    pins: Pins,
    /// Most blocks `keep_alive` pins may hold (the config's cap, or half the pool).
    max_pinned: usize,
    /// Most blocks session retention may hold (the config's cap, or three quarters of the pool).
    max_retained: usize,
    pins_released_early: u64,
    pins_consumed: u64,
    preemptions: u64,
    /// Steps run (a retained state is idle once steps have run without its session coming back).
    steps: u64,
    /// The caller's clock (milliseconds), as of the last [`Scheduler::expire_pins`].
    now: u64,
    /// Proposals verified so far.
    spec_stats: crate::speculation::SpecStats,
    /// Slot copies kept token-tree paths wait for ([`Scheduler::take_slot_moves`]).
    slot_moves: Vec<kvgate_backend::SlotCopy>,
    /// Waiting groups held out of admission while their blocks are fetched from the shared store.
    held: std::collections::HashSet<GroupId>,
}

impl Scheduler {
    /// A scheduler over a pool of `num_blocks` blocks.
    pub fn new(cfg: SchedulerConfig, num_blocks: usize) -> Scheduler {
        Self::with_pool(cfg, BlockPool::new(num_blocks))
    }

    /// A scheduler over a given pool (tests use pools with colliding hashes).
    pub fn with_pool(cfg: SchedulerConfig, pool: BlockPool) -> Scheduler {
        let total = pool.total();
        let mut kv = KvManager::new(pool, cfg.block_size, cfg.prefix_caching);
        if cfg.kv_events {
            kv.pool_mut().record_kv_events();
        }
        Scheduler {
            max_pinned: cfg.caps.max_pinned_blocks.unwrap_or(total / 2),
            max_retained: cfg.caps.max_retained_blocks.unwrap_or(total * 3 / 4),
            pins_released_early: 0,
            pins_consumed: 0,
            now: 0,
            spec_stats: Default::default(),
            slot_moves: Vec::new(),
            held: Default::default(),
            cfg,
            kv,
            reg: Registry::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pins: Pins::default(),
            preemptions: 0,
            steps: 0,
        }
    }

    /// What it was built from.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The pool.
    pub fn pool(&self) -> &BlockPool {
        self.kv.pool()
    }

    /// The numbers the metrics recorder reads after a step.
    pub(crate) fn stats(&self) -> crate::metrics::SchedulerStats {
        let c = self.pool().counts();
        let p = self.prefix_stats();
        crate::metrics::SchedulerStats {
            running: self.num_running_groups(),
            waiting: self.num_waiting(),
            used_blocks: c.used,
            total_blocks: c.total,
            cached_free: c.cached_free,
            prefix_queries: p.queries,
            prefix_hits: p.hits,
            preemptions: self.preemptions(),
            retained_blocks: self.retained_blocks(),
            pins_consumed: self.pins_consumed(),
            pins_released_early: self.pins_released_early(),
            evictions: self.pool().evictions(),
            tier: self.tier().map(|t| t.stats()).unwrap_or_default(),
            spec: self.spec_stats,
        }
    }

    /// The pool's KV events since the last call, then the tiers' (a block evicted and kept by a tier
    /// is removed from the cache before it is stored in the tier).
    pub fn take_kv_events(&mut self) -> Vec<crate::KvEvent> {
        let mut ev = self.kv.pool_mut().take_kv_events();
        if let Some(t) = self.kv.tier_mut() {
            ev.extend(t.take_events());
        }
        ev
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.kv.stats()
    }

    /// Puts a second tier behind the pool (returning the one there was).
    pub fn set_tier(&mut self, tier: Option<SecondTier>) -> Option<SecondTier> {
        self.kv.set_tier(tier)
    }

    /// The second tier.
    pub fn tier(&self) -> Option<&SecondTier> {
        self.kv.tier()
    }

    /// The second tier, to store what spilled.
    pub fn tier_mut(&mut self) -> Option<&mut SecondTier> {
        self.kv.tier_mut()
    }

    /// The spills and restores the plans so far need before their forward pass.
    pub(crate) fn take_tier_ops(&mut self) -> TierOps {
        self.kv.take_tier_ops()
    }

    /// Preemptions so far.
    pub fn preemptions(&self) -> u64 {
        self.preemptions
    }

    /// A sequence (tests).
    #[cfg(test)]
    pub(crate) fn seq(&self, id: SeqId) -> Result<&Seq> {
        self.reg.seq(id)
    }

    /// Whether a sequence still exists (running, waiting or preempted).
    pub(crate) fn has_seq(&self, id: SeqId) -> bool {
        self.reg.seq(id).is_ok()
    }

    /// Live sequences of a group (empty for an unknown group).
    pub fn group_seqs(&self, g: GroupId) -> &[SeqId] {
        self.reg.group(g).map(|g| g.seqs.as_slice()).unwrap_or(&[])
    }

    #[cfg(test)]
    /// Whether a group exists.
    pub fn has_group(&self, g: GroupId) -> bool {
        self.reg.has_group(g)
    }

    /// Usage of a group.
    pub fn usage(&self, g: GroupId) -> GroupUsage {
        self.reg
            .group(g)
            .map(|g| GroupUsage {
                cached_tokens: g.cached_tokens,
                computed_tokens: g.computed_tokens,
                decision_warmed_tokens: g.decision_warmed_tokens,
            })
            .unwrap_or_default()
    }

    /// Groups waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Groups running.
    pub fn num_running_groups(&self) -> usize {
        self.running.len()
    }

    /// Sequences running.
    pub fn num_running_seqs(&self) -> usize {
        self.running.iter().map(|&g| self.group_seqs(g).len()).sum()
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Whether a group is admitted (running).
    pub fn is_running(&self, g: GroupId) -> bool {
        self.reg.group(g).is_ok_and(|g| g.running)
    }

    /// Queues a completion: one sequence over `prompt` (forked later with [`Scheduler::fork`]).
    pub fn add_generate(&mut self, prompt: Vec<u32>, salt: &str, all_logits: bool) -> (GroupId, SeqId) {
        let g = self.reg.add_group(GroupKind::Generate, salt.to_string(), self.now);
        let s = self.reg.add_seq(g, prompt, all_logits, true);
        if let Ok(grp) = self.reg.group_mut(g) {
            grp.seqs.push(s);
        }
        self.waiting.push_back(g);
        (g, s)
    }

    /// Lets a queued completion computed on the backend's fast path also read the blocks the exact path
    /// computed under `salt` (see [`crate::kv_manager::Salts`]).
    pub fn read_exact_blocks(&mut self, g: GroupId, salt: &str) -> Result<()> {
        self.reg.group_mut(g)?.exact_salt = Some(salt.to_string());
        Ok(())
    }

    /// Forks `n` new sequences off `seq`, sharing its blocks (copy-on-write on their first write).
    pub fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>> {
        let s = self.reg.seq(seq)?;
        let (g, tokens, computed, blocks, all_logits) =
            (s.group, s.tokens.clone(), s.computed, s.blocks.clone(), s.all_logits);
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.reg.add_seq(g, tokens.clone(), all_logits, true);
            let sb = self.kv.fork(&blocks);
            let s = self.reg.seq_mut(id)?;
            s.blocks = sb;
            s.computed = computed;
            s.matched = true;
            self.reg.group_mut(g)?.seqs.push(id);
            out.push(id);
        }
        Ok(out)
    }

    /// Appends a sampled token to a sequence.
    pub fn append_token(&mut self, seq: SeqId, tok: u32) -> Result<()> {
        self.reg.seq_mut(seq)?.tokens.push(tok);
        Ok(())
    }

    /// Records that a chunk ran: its tokens are now in the cache; full blocks join the prefix cache.
    pub fn advance(&mut self, c: &Chunk) -> Result<()> {
        let s = self.reg.seq_mut(c.seq)?;
        debug_assert_eq!(s.computed, c.start);
        // proposed tokens are not the sequence's until its request kind keeps them (`accept_draft`)
        s.computed = c.start + c.len - c.draft;
        let g = s.group;
        let grp = self.reg.group_mut(g)?;
        grp.computed_tokens += c.len;
        let salt = grp.salt.clone();
        let decision = matches!(grp.kind, GroupKind::Decide(_));
        let s = self.reg.seq_mut(c.seq)?;
        self.kv
            .commit(&mut s.blocks, &s.tokens, s.computed.min(s.plain_upto), &salt, decision);
        if let Some(w) = self.cfg.release_window {
            self.kv.release_slid(&mut s.blocks, s.computed, w);
        }
        Ok(())
    }

    /// Ends one sequence, releasing its blocks. The group ends with its last sequence.
    pub fn finish_seq(&mut self, seq: SeqId) -> Result<()> {
        let mut s = self.reg.remove_seq(seq)?;
        self.kv.release(&mut s.blocks);
        let grp = self.reg.group_mut(s.group)?;
        grp.seqs.retain(|&x| x != seq);
        if grp.seqs.is_empty() {
            self.remove_group(s.group);
        }
        Ok(())
    }

    /// Ends a group and all its sequences, wherever it is (waiting or running); an unknown group (one
    /// that already ended) is a no-op.
    pub fn finish_group(&mut self, g: GroupId) {
        for s in self.group_seqs(g).to_vec() {
            if let Ok(mut seq) = self.reg.remove_seq(s) {
                self.kv.release(&mut seq.blocks);
            }
        }
        self.remove_group(g);
    }

    fn remove_group(&mut self, g: GroupId) {
        self.held.remove(&g);
        self.reg.remove_group(g);
        self.waiting.retain(|&x| x != g);
        self.running.retain(|&x| x != g);
    }

    /// Pins the full blocks among the first `tokens` tokens of a sequence (those computed) until `until`
    /// (a caller-defined clock value); returns how many blocks. `keep_alive` pins never hold more than
    /// [`Scheduler::max_pinned_blocks`], session retention never more than
    /// [`Scheduler::max_retained_blocks`]: older pins of the kind are released to make room (a retained
    /// state younger than the starvation bound stays, see [`Admission`]), and a prefix larger than the cap is
    /// not pinned at all (0). See [`Scheduler::expire_pins`].
    pub fn pin_prefix(
        &mut self,
        seq: SeqId,
        tokens: usize,
        until: u64,
        tenant: Option<u32>,
        kind: PinKind,
    ) -> Result<usize> {
        let s = self.reg.seq(seq)?;
        let n = tokens.min(s.computed) / self.cfg.block_size;
        // Released blocks (slid out of a windowed model's reach) cannot be pinned; the rest can.
        let blocks: Vec<_> = (0..n).filter_map(|i| s.blocks.get(i)).collect();
        let n = blocks.len();
        let tenant_cap = tenant.and(self.cfg.caps.max_pinned_per_tenant).unwrap_or(usize::MAX);
        let cap = match kind {
            PinKind::KeepAlive => self.max_pinned,
            PinKind::Session => self.max_retained,
        };
        if n == 0 || n > cap || n > tenant_cap {
            return Ok(0);
        }
        if let Some(t) = tenant {
            // a tenant over its share gives up its own oldest pins first
            while self.pins.count_of(t) + n > tenant_cap {
                let old = self.pins.take_oldest_of(t);
                if !self.release_early(old) {
                    break;
                }
            }
        }
        self.trim_pins(kind, cap - n);
        self.kv.pin(&blocks);
        // a next turn's pin keeps when its session's state has been held since
        let held_since = match kind {
            PinKind::Session => self.reg.group(self.reg.seq(seq)?.group)?.held_since.unwrap_or(self.now),
            PinKind::KeepAlive => self.now,
        };
        self.pins
            .add((self.now, held_since, self.steps), until, tenant, kind, blocks);
        Ok(n)
    }

    /// Releases the oldest pin before its deadline (its blocks stay cached, now evictable); false when
    /// nothing is pinned. Pins give way to real work: the scheduler calls this before it preempts a
    /// running request or leaves a waiting one waiting for blocks.
    pub fn release_oldest_pin(&mut self) -> bool {
        let oldest = self.pins.take_oldest();
        self.release_early(oldest)
    }

    /// Drops a pin taken off before its deadline (false when there is none).
    fn release_early(&mut self, pin: Option<Vec<BlockId>>) -> bool {
        let Some(blocks) = pin else { return false };
        self.kv.unpin(&blocks);
        self.pins_released_early += 1;
        true
    }

    /// Releases the oldest pins of `kind` until they hold at most `limit` blocks. Under cache-aware
    /// admission the retention cap is soft for a state younger than the starvation bound (a session
    /// between two turns keeps its state over the cap; it is released once it is that old).
    fn trim_pins(&mut self, kind: PinKind, limit: usize) {
        let cutoff = match kind {
            PinKind::Session if self.cfg.admission.cache_aware => self.now.checked_sub(self.cfg.admission.max_wait_ms),
            _ => Some(u64::MAX),
        };
        while self.pins.count_kind(kind) > limit {
            let Some(cutoff) = cutoff else { break };
            let oldest = self.pins.take_oldest_kind_since(kind, cutoff);
            if !self.release_early(oldest) {
                break;
            }
        }
    }

    /// Pins released before their deadline to make room (pressure or the cap).
    pub fn pins_released_early(&self) -> u64 {
        self.pins_released_early
    }

    /// The cap of a chunk whose every row returns an output.
    pub fn all_rows_cap(&self) -> usize {
        self.cfg.caps.all_rows_cap.max(1)
    }

    /// Session pins taken over by their session's next turn.
    pub fn pins_consumed(&self) -> u64 {
        self.pins_consumed
    }

    /// Blocks held by session retention (with multiplicity).
    pub fn retained_blocks(&self) -> usize {
        self.pins.count_kind(PinKind::Session)
    }

    /// Releases pins whose time is `≤ now`; returns how many were released.
    pub fn expire_pins(&mut self, now: u64) -> usize {
        self.now = self.now.max(now);
        self.release_pins_until(now)
    }

    fn release_pins_until(&mut self, now: u64) -> usize {
        let done = self.pins.take_expired(now);
        for b in &done {
            self.kv.unpin(b);
        }
        done.len()
    }

    /// Releases the pins `owner` holds (their blocks stay cached, now evictable); returns how many.
    pub fn release_owned(&mut self, owner: u64) -> usize {
        let gone = self.pins.take_owned(owner);
        for b in &gone {
            self.kv.unpin(b);
        }
        gone.len()
    }

    /// Releases every pin.
    pub fn clear_pins(&mut self) {
        self.release_pins_until(u64::MAX);
    }

    /// Earliest pin expiry, if any.
    pub fn next_pin_expiry(&self) -> Option<u64> {
        self.pins.next_expiry()
    }

    /// Blocks held by pins.
    pub fn pinned_blocks(&self) -> usize {
        self.pins.blocks().count()
    }

    /// Checks that every block's reference count equals the number of tables (and pins) holding it, that
    /// no sequence holds a block twice, and the pool's own invariants.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.kv.pool().check_invariants();
        let mut refs = vec![0u32; self.kv.pool().total()];
        for s in self.reg.seqs() {
            let mut seen = HashSet::new();
            for &b in s.blocks.live() {
                assert!(seen.insert(b), "block {b} twice in one table");
                refs[b.index()] += 1;
            }
            assert!(s.computed <= s.tokens.len());
            assert!(s.blocks.len() >= s.computed.div_ceil(self.cfg.block_size));
            // no block holding a tree token is in the prefix cache under this sequence's chain
            assert!(s.blocks.registered() <= s.plain_upto / self.cfg.block_size);
            if s.spec.draft.is_empty() {
                // rejected proposals' blocks went back
                assert!(s.blocks.len() <= s.tokens.len().div_ceil(self.cfg.block_size));
            }
            if let Some(w) = self.cfg.release_window {
                // nothing a future query can read was given back
                assert!(s.blocks.released() * self.cfg.block_size <= (s.computed + 1).saturating_sub(w));
            }
        }
        for b in self.pins.blocks() {
            refs[b.index()] += 1;
        }
        for (b, &r) in refs.iter().enumerate() {
            assert_eq!(self.kv.pool().ref_count_at(b), r, "ref count of block {b}");
        }
        for g in &self.running {
            assert!(self.reg.group(*g).unwrap().running);
        }
        for g in &self.waiting {
            assert!(!self.reg.group(*g).unwrap().running);
        }
        assert_eq!(self.running.len() + self.waiting.len(), self.reg.num_groups());
        let orders: Vec<u64> = self.running.iter().map(|g| self.reg.group(*g).unwrap().order).collect();
        assert!(orders.windows(2).all(|w| w[0] < w[1]), "running not in arrival order");
    }
}
