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
//! [`Registry`]; decision layouts and keep-alive pins in [`crate::decision`].

use std::collections::{HashSet, VecDeque};

use crate::block_pool::{BlockId, BlockPool};
use crate::decision::{DecisionState, Pins};
use crate::kv_manager::{BlockCopy, KvManager, PrefixStats};
#[cfg(test)]
use crate::registry::Seq;
use crate::registry::{GroupId, GroupKind, Registry, SchedError, SeqId};

type Result<T> = std::result::Result<T, SchedError>;

/// Which rows of a chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (an intermediate prefill chunk, a decision prefix).
    None,
    /// The chunk's last row (the next-token distribution).
    Last,
    /// Every row (prompt logprobs).
    All,
}

/// One sequence's share of a step: tokens `start..start + len` of it, with everything needed to run
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence.
    pub seq: SeqId,
    /// Its group.
    pub group: GroupId,
    /// First token position.
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// Which logits are wanted.
    pub logits: Logits,
    /// For a decision's read: its index.
    pub read: Option<usize>,
    /// Whether the chunk ends at the sequence's last known token (its last row predicts the next one).
    pub at_end: bool,
    /// The tokens `start..start + len`.
    pub tokens: Vec<u32>,
    /// The cache slot (`block · block_size + offset`) of each token.
    pub slots: Vec<usize>,
    /// The sequence's block table (covers `start + len` tokens).
    pub table: Vec<BlockId>,
}

/// A chunk while a pass is still deciding (filled into a [`Chunk`] at the end of the pass).
#[derive(Debug, Clone, Copy)]
struct Planned {
    seq: SeqId,
    start: usize,
    len: usize,
    logits: Logits,
}

/// The outcome of one scheduling pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The chunks to run, decode chunks first.
    pub chunks: Vec<Chunk>,
    /// Block copies to perform before running (copy-on-write).
    pub copies: Vec<BlockCopy>,
    /// Groups preempted during this pass (by recompute).
    pub preempted: Vec<GroupId>,
    /// Groups that cannot fit in the pool even alone (the engine fails them), with the blocks they
    /// needed for their next chunk.
    pub failed: Vec<(GroupId, usize)>,
}

impl Plan {
    #[cfg(test)]
    /// Tokens scheduled.
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }
}

/// Limits of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per step.
    pub max_num_batched_tokens: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Prefix caching on.
    pub prefix_caching: bool,
}

/// Work in progress of one scheduling pass.
struct StepState {
    chunks: Vec<Planned>,
    copies: Vec<(SeqId, BlockCopy)>,
    preempted: Vec<GroupId>,
    failed: Vec<(GroupId, usize)>,
    budget: usize,
    planned: HashSet<SeqId>,
}

/// Per-group accounting, for usage and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// Prompt tokens found in the prefix cache on first admission.
    pub cached_tokens: usize,
    /// Tokens actually computed (prefill chunks and decode tokens, recomputation included).
    pub computed_tokens: usize,
    /// Of the cached prompt tokens, those found in blocks a decision computed.
    pub decision_warmed_tokens: usize,
}

/// The scheduler and everything it owns: the sequences, the block tables, the pool, the queues, the pins.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    reg: Registry,
    waiting: VecDeque<GroupId>,
    running: Vec<GroupId>,
    pins: Pins,
    preemptions: u64,
}

impl Scheduler {
    /// A scheduler over a pool of `num_blocks` blocks.
    pub fn new(cfg: SchedulerConfig, num_blocks: usize) -> Scheduler {
        Self::with_pool(cfg, BlockPool::new(num_blocks))
    }

    /// A scheduler over a given pool (tests use pools with colliding hashes).
    pub fn with_pool(cfg: SchedulerConfig, pool: BlockPool) -> Scheduler {
        Scheduler {
            cfg,
            kv: KvManager::new(pool, cfg.block_size, cfg.prefix_caching),
            reg: Registry::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pins: Pins::default(),
            preemptions: 0,
        }
    }

    /// Limits.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The pool.
    pub fn pool(&self) -> &BlockPool {
        self.kv.pool()
    }

    /// Prefix-cache counters.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.kv.stats()
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
        let g = self.reg.add_group(GroupKind::Generate, salt.to_string());
        let s = self.reg.add_seq(g, prompt, all_logits, true);
        if let Ok(grp) = self.reg.group_mut(g) {
            grp.seqs.push(s);
        }
        self.waiting.push_back(g);
        (g, s)
    }

    /// Queues a decision: one read per prompt (each non-empty), laid out by
    /// [`crate::decision::DecisionLayout`]: a shared prefix computed once and forked per read, or plain
    /// sequences.
    pub fn add_decision(&mut self, prompts: Vec<Vec<u32>>, salt: &str) -> GroupId {
        let g = self
            .reg
            .add_group(GroupKind::Decide(DecisionState::new(prompts)), salt.to_string());
        // The group was just added, so this cannot fail.
        let _ = self.init_decision(g);
        self.waiting.push_back(g);
        g
    }

    fn decision(&self, g: GroupId) -> Result<&DecisionState> {
        match &self.reg.group(g)?.kind {
            GroupKind::Decide(d) => Ok(d),
            GroupKind::Generate => Err(SchedError::NotADecision(g)),
        }
    }

    fn decision_mut(&mut self, g: GroupId) -> Result<&mut DecisionState> {
        match &mut self.reg.group_mut(g)?.kind {
            GroupKind::Decide(d) => Ok(d),
            GroupKind::Generate => Err(SchedError::NotADecision(g)),
        }
    }

    /// (Re)creates a decision's sequences: the shared-prefix sequence, or one plain sequence per read.
    fn init_decision(&mut self, g: GroupId) -> Result<()> {
        let d = self.decision(g)?;
        let (prompts, layout) = (d.prompts.clone(), d.layout);
        let seqs = if layout.forks {
            vec![self.reg.add_seq(g, prompts[0][..layout.shared].to_vec(), false, false)]
        } else {
            let mut ids = Vec::with_capacity(prompts.len());
            for (i, p) in prompts.into_iter().enumerate() {
                let id = self.reg.add_seq(g, p, false, true);
                self.reg.seq_mut(id)?.read = Some(i);
                ids.push(id);
            }
            ids
        };
        self.decision_mut(g)?.forked = !layout.forks;
        self.reg.group_mut(g)?.seqs = seqs;
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
        s.computed = c.start + c.len;
        let g = s.group;
        let grp = self.reg.group_mut(g)?;
        grp.computed_tokens += c.len;
        let salt = grp.salt.clone();
        let decision = matches!(grp.kind, GroupKind::Decide(_));
        let s = self.reg.seq_mut(c.seq)?;
        self.kv.commit(&mut s.blocks, &s.tokens, s.computed, &salt, decision);
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
        self.reg.remove_group(g);
        self.waiting.retain(|&x| x != g);
        self.running.retain(|&x| x != g);
    }

    /// Pins the full blocks among the first `tokens` tokens of a sequence (those computed) until `until`
    /// (a caller-defined clock value); returns how many blocks. See [`Scheduler::expire_pins`].
    pub fn pin_prefix(&mut self, seq: SeqId, tokens: usize, until: u64) -> Result<usize> {
        let s = self.reg.seq(seq)?;
        let n = tokens.min(s.computed) / self.cfg.block_size;
        let blocks = s.blocks.blocks[..n.min(s.blocks.blocks.len())].to_vec();
        self.kv.pin(&blocks);
        let n = blocks.len();
        self.pins.add(until, blocks);
        Ok(n)
    }

    /// Releases pins whose time is `≤ now`; returns how many were released.
    pub fn expire_pins(&mut self, now: u64) -> usize {
        let done = self.pins.take_expired(now);
        for b in &done {
            self.kv.unpin(b);
        }
        done.len()
    }

    /// Releases every pin.
    pub fn clear_pins(&mut self) {
        self.expire_pins(u64::MAX);
    }

    /// Earliest pin expiry, if any.
    pub fn next_pin_expiry(&self) -> Option<u64> {
        self.pins.next_expiry()
    }

    /// Blocks held by pins.
    pub fn pinned_blocks(&self) -> usize {
        self.pins.blocks().count()
    }

    /// Preempts a running group by recompute: releases every block, resets its sequences (a forked
    /// decision goes back to its prefix), and puts it back into the waiting queue by arrival order.
    fn preempt(&mut self, g: GroupId, st: &mut StepState) -> Result<()> {
        self.preemptions += 1;
        self.drop_chunks(g, st);
        let seqs = self.group_seqs(g).to_vec();
        for &s in &seqs {
            let seq = self.reg.seq_mut(s)?;
            self.kv.release(&mut seq.blocks);
            seq.computed = 0;
            seq.matched = false;
        }
        let forked_decision = self.decision(g).is_ok_and(|d| d.forked && d.layout.forks);
        if forked_decision {
            for &s in &seqs {
                self.reg.remove_seq(s)?;
            }
            self.init_decision(g)?;
        }
        let grp = self.reg.group_mut(g)?;
        grp.running = false;
        let order = grp.order;
        self.running.retain(|&x| x != g);
        let pos = self
            .waiting
            .iter()
            .position(|&w| self.reg.group(w).is_ok_and(|w| w.order > order))
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, g);
        st.preempted.push(g);
        Ok(())
    }

    /// Prefix-matches a sequence that has no blocks yet (first admission or after preemption).
    fn match_seq(&mut self, sid: SeqId) -> Result<usize> {
        let s = self.reg.seq(sid)?;
        if s.matched {
            return Ok(0);
        }
        let salt = self.reg.group(s.group)?.salt.clone();
        // The last token is recomputed so there are logits to read; a decision prefix has no logits and
        // may match every full block.
        let max_blocks = if s.all_logits {
            0
        } else if s.wants_logits {
            (s.tokens.len() - 1) / self.cfg.block_size
        } else {
            s.tokens.len() / self.cfg.block_size
        };
        let sb = self.kv.match_prefix(&s.tokens, max_blocks, &salt, false);
        let hit = sb.blocks.len() * self.cfg.block_size;
        let s = self.reg.seq_mut(sid)?;
        s.blocks = sb;
        s.computed = hit;
        s.matched = true;
        Ok(hit)
    }

    fn unmatch_seq(&mut self, sid: SeqId) -> Result<()> {
        let s = self.reg.seq_mut(sid)?;
        self.kv.release(&mut s.blocks);
        s.computed = 0;
        s.matched = false;
        Ok(())
    }

    /// Grows a sequence's table for its next `len` tokens; `Ok(false)` (nothing changed) when the pool
    /// has too few free blocks.
    fn try_reserve(&mut self, sid: SeqId, len: usize, copies: &mut Vec<(SeqId, BlockCopy)>) -> Result<bool> {
        let s = self.reg.seq_mut(sid)?;
        let mut c = vec![];
        let ok = self.kv.reserve(&mut s.blocks, s.computed, s.computed + len, &mut c);
        copies.extend(c.into_iter().map(|c| (sid, c)));
        Ok(ok)
    }

    /// Blocks a sequence's next `len` tokens need beyond what it holds.
    fn blocks_needed(&self, sid: SeqId, len: usize) -> Result<usize> {
        let s = self.reg.seq(sid)?;
        Ok(self.kv.blocks_needed(&s.blocks, s.computed, s.computed + len))
    }

    fn plan_chunk(&self, sid: SeqId, len: usize) -> Result<Planned> {
        let s = self.reg.seq(sid)?;
        let end = s.computed + len;
        let logits = if s.all_logits {
            Logits::All
        } else if !s.wants_logits || end < s.tokens.len() {
            Logits::None
        } else {
            Logits::Last
        };
        Ok(Planned {
            seq: sid,
            start: s.computed,
            len,
            logits,
        })
    }

    /// Turns a planned chunk into a self-contained [`Chunk`].
    fn fill(&self, p: Planned) -> Result<Chunk> {
        let s = self.reg.seq(p.seq)?;
        let bs = self.cfg.block_size;
        let end = p.start + p.len;
        let slots = (p.start..end)
            .map(|pos| {
                s.blocks
                    .blocks
                    .get(pos / bs)
                    .map(|b| b.index() * bs + pos % bs)
                    .ok_or(SchedError::NoBlock { seq: p.seq, pos })
            })
            .collect::<Result<Vec<usize>>>()?;
        Ok(Chunk {
            seq: p.seq,
            group: s.group,
            start: p.start,
            len: p.len,
            logits: p.logits,
            read: s.read,
            at_end: end == s.tokens.len(),
            tokens: s.tokens[p.start..end].to_vec(),
            slots,
            table: s.blocks.blocks.clone(),
        })
    }

    /// Forks every running decision whose shared prefix is computed into its read sequences.
    fn fork_ready_decisions(&mut self) -> Result<()> {
        for g in self.running.clone() {
            let Ok(d) = self.decision(g) else { continue };
            if d.forked {
                continue;
            }
            let (prompts, shared) = (d.prompts.clone(), d.layout.shared);
            let Some(&prefix) = self.group_seqs(g).first() else {
                continue;
            };
            if self.reg.seq(prefix)?.computed < shared {
                continue;
            }
            let mut ids = Vec::with_capacity(prompts.len());
            for (i, p) in prompts.into_iter().enumerate() {
                let id = self.reg.add_seq(g, p, false, true);
                let sb = self.kv.fork(&self.reg.seq(prefix)?.blocks);
                let s = self.reg.seq_mut(id)?;
                s.read = Some(i);
                s.blocks = sb;
                s.computed = shared;
                s.matched = true;
                ids.push(id);
            }
            let mut pre = self.reg.remove_seq(prefix)?;
            self.kv.release(&mut pre.blocks);
            self.reg.group_mut(g)?.seqs = ids;
            self.decision_mut(g)?.forked = true;
        }
        Ok(())
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> Result<Plan> {
        let mut st = StepState {
            chunks: vec![],
            copies: vec![],
            preempted: vec![],
            failed: vec![],
            budget: self.cfg.max_num_batched_tokens,
            planned: HashSet::new(),
        };
        self.fork_ready_decisions()?;
        // 1 and 2: running groups, decode tokens first, then prefill chunks.
        self.schedule_running(&mut st, true)?;
        self.schedule_running(&mut st, false)?;
        // 3: admit waiting groups in FIFO order; decisions whose prefix is fully cached fork at once and
        // their questions join this step.
        if self.admit_waiting(&mut st)? {
            self.fork_ready_decisions()?;
            self.schedule_running(&mut st, true)?;
            self.schedule_running(&mut st, false)?;
        }
        let chunks = st.chunks.iter().map(|&p| self.fill(p)).collect::<Result<Vec<_>>>()?;
        Ok(Plan {
            chunks,
            copies: st.copies.into_iter().map(|(_, c)| c).collect(),
            preempted: st.preempted,
            failed: st.failed,
        })
    }

    fn schedule_running(&mut self, st: &mut StepState, decode_phase: bool) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            let g = self.running[i];
            let mut group_gone = false;
            for sid in self.group_seqs(g).to_vec() {
                if st.budget == 0 {
                    return Ok(());
                }
                if st.planned.contains(&sid) {
                    continue;
                }
                let s = self.reg.seq(sid)?;
                let remaining = s.tokens.len() - s.computed;
                let is_decode = remaining == 1 && s.matched;
                if remaining == 0 || is_decode != decode_phase {
                    continue;
                }
                self.match_seq(sid)?;
                let s = self.reg.seq(sid)?;
                let len = (s.tokens.len() - s.computed).min(st.budget);
                if len == 0 {
                    continue;
                }
                loop {
                    if self.try_reserve(sid, len, &mut st.copies)? {
                        st.chunks.push(self.plan_chunk(sid, len)?);
                        st.planned.insert(sid);
                        st.budget -= len;
                        break;
                    }
                    let victim = self.running.iter().rev().copied().find(|&v| v != g);
                    let newer =
                        |v: GroupId| -> Result<bool> { Ok(self.reg.group(v)?.order > self.reg.group(g)?.order) };
                    match victim {
                        Some(v) if newer(v)? => self.preempt(v, st)?,
                        Some(_) => {
                            // This group is the newest that could give way: it yields itself.
                            self.preempt(g, st)?;
                            group_gone = true;
                            break;
                        }
                        None => {
                            // Alone and still too big: it can never run.
                            let needed = self.blocks_needed(sid, len)?;
                            self.drop_chunks(g, st);
                            st.failed.push((g, needed));
                            self.finish_group(g);
                            group_gone = true;
                            break;
                        }
                    }
                }
                if group_gone {
                    break;
                }
            }
            if !group_gone {
                i += 1;
            }
            // Otherwise g left `running` at index i and the next group is there now.
        }
        Ok(())
    }

    /// Admits waiting groups; returns whether any was admitted.
    fn admit_waiting(&mut self, st: &mut StepState) -> Result<bool> {
        let mut admitted = false;
        while st.budget > 0 {
            let Some(&g) = self.waiting.front() else { break };
            let seqs = self.group_seqs(g);
            if self.num_running_seqs() + seqs.len() > self.cfg.max_num_seqs && !self.running.is_empty() {
                break;
            }
            let Some(&first) = seqs.first() else {
                return Err(SchedError::UnknownGroup(g));
            };
            let hit = self.match_seq(first)?;
            let s = self.reg.seq(first)?;
            let len = (s.tokens.len() - s.computed).min(st.budget);
            if len > 0 && !self.try_reserve(first, len, &mut st.copies)? {
                let needed = self.blocks_needed(first, len)?;
                self.unmatch_seq(first)?;
                if self.running.is_empty() && st.chunks.is_empty() {
                    // Nothing else holds blocks, and it still does not fit.
                    self.waiting.pop_front();
                    st.failed.push((g, needed));
                    self.finish_group(g);
                    continue;
                }
                break;
            }
            if len > 0 {
                st.chunks.push(self.plan_chunk(first, len)?);
                st.planned.insert(first);
                st.budget -= len;
            }
            self.waiting.pop_front();
            let order = self.reg.group(g)?.order;
            let pos = self
                .running
                .iter()
                .position(|&r| self.reg.group(r).is_ok_and(|r| r.order > order))
                .unwrap_or(self.running.len());
            self.running.insert(pos, g);
            admitted = true;
            let s = self.reg.seq(first)?;
            let tokens = s.tokens.len();
            let warmed = s
                .blocks
                .blocks
                .iter()
                .take(hit / self.cfg.block_size)
                .filter(|&&b| self.kv.pool().is_decision_warmed(b))
                .count()
                * self.cfg.block_size;
            let grp = self.reg.group_mut(g)?;
            grp.running = true;
            if !grp.admitted_once {
                grp.admitted_once = true;
                grp.cached_tokens = hit;
                grp.decision_warmed_tokens = warmed;
                self.kv.record(tokens as u64, hit as u64);
            }
        }
        Ok(admitted)
    }

    fn drop_chunks(&mut self, g: GroupId, st: &mut StepState) {
        let set: HashSet<SeqId> = self.group_seqs(g).iter().copied().collect();
        st.chunks.retain(|c| {
            if set.contains(&c.seq) {
                st.budget += c.len;
                false
            } else {
                true
            }
        });
        st.copies.retain(|(s, _)| !set.contains(s));
        st.planned.retain(|s| !set.contains(s));
    }

    /// Checks that every block's reference count equals the number of tables (and pins) holding it, that
    /// no sequence holds a block twice, and the pool's own invariants.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        self.kv.pool().check_invariants();
        let mut refs = vec![0u32; self.kv.pool().total()];
        for s in self.reg.seqs() {
            let mut seen = HashSet::new();
            for &b in &s.blocks.blocks {
                assert!(seen.insert(b), "block {b} twice in one table");
                refs[b.index()] += 1;
            }
            assert!(s.computed <= s.tokens.len());
            assert!(s.blocks.blocks.len() >= s.computed.div_ceil(self.cfg.block_size));
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
