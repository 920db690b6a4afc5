//! The continuous-batching scheduler: which sequences run in the next step and how many tokens each
//! gets. Pure bookkeeping over integer ids (no tensors), so it is unit-tested and fuzzed on its own.
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
//! Groups are the unit of admission and preemption: a completion (one sequence, forked into `n` once its
//! prompt is computed) or a decision (a shared-prefix sequence, forked into one sequence per question
//! once the prefix is computed; all questions are then scheduled together).

use std::collections::{HashMap, HashSet, VecDeque};

use crate::block_pool::{BlockId, BlockPool};
use crate::kv_manager::{BlockCopy, KvManager, PrefixStats, SeqBlocks};

/// A sequence id.
pub type SeqId = u64;
/// A group (request) id.
pub type GroupId = u64;

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

/// One sequence's share of a step: tokens `start..start + len` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence.
    pub seq: SeqId,
    /// First token position.
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// Which logits are wanted.
    pub logits: Logits,
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
    /// Groups that cannot fit in the pool even alone (the engine fails them).
    pub failed: Vec<GroupId>,
}

impl Plan {
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

/// A sequence.
#[derive(Debug, Clone)]
pub struct Seq {
    /// Owning group.
    pub group: GroupId,
    /// All known tokens: prompt, then generated ones.
    pub tokens: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    pub computed: usize,
    /// Its block table.
    pub blocks: SeqBlocks,
    /// Logits for every prompt row (prompt logprobs; disables prefix matching).
    pub all_logits: bool,
    /// Whether it produces logits at all (a decision's shared prefix does not).
    pub wants_logits: bool,
    /// For a decision's question sequence: the index of its read.
    pub read: Option<usize>,
    matched: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Generate,
    Decide {
        prompts: Vec<Vec<u32>>,
        shared: usize,
        forked: bool,
    },
}

#[derive(Debug, Clone)]
struct Group {
    order: u64,
    salt: String,
    seqs: Vec<SeqId>,
    kind: Kind,
    running: bool,
    admitted_once: bool,
    cached_tokens: usize,
    decision_warmed_tokens: usize,
    computed_tokens: usize,
}

/// Work in progress of one scheduling pass.
struct StepState {
    plan: Plan,
    copies: Vec<(SeqId, BlockCopy)>,
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

/// The scheduler and everything it owns: the block tables, the pool, the queues.
#[derive(Debug, Clone)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvManager,
    seqs: HashMap<SeqId, Seq>,
    groups: HashMap<GroupId, Group>,
    waiting: VecDeque<GroupId>,
    running: Vec<GroupId>,
    pins: Vec<(u64, Vec<BlockId>)>,
    next_id: u64,
    next_order: u64,
    preemptions: u64,
}

/// Length of the longest common prefix of all prompts.
fn common_prefix(prompts: &[Vec<u32>]) -> usize {
    let first = &prompts[0];
    let mut n = first.len();
    for p in &prompts[1..] {
        n = n.min(first.iter().zip(p).take_while(|(a, b)| a == b).count());
    }
    n
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
            seqs: HashMap::new(),
            groups: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pins: Vec::new(),
            next_id: 1,
            next_order: 0,
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

    /// A sequence.
    pub fn seq(&self, id: SeqId) -> Option<&Seq> {
        self.seqs.get(&id)
    }

    /// Live sequences of a group.
    pub fn group_seqs(&self, g: GroupId) -> &[SeqId] {
        self.groups.get(&g).map(|g| g.seqs.as_slice()).unwrap_or(&[])
    }

    /// Whether a group exists.
    pub fn has_group(&self, g: GroupId) -> bool {
        self.groups.contains_key(&g)
    }

    /// Usage of a group.
    pub fn usage(&self, g: GroupId) -> GroupUsage {
        self.groups
            .get(&g)
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
        self.running.iter().map(|g| self.groups[g].seqs.len()).sum()
    }

    /// Whether nothing is waiting or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Whether a group is admitted (running).
    pub fn is_running(&self, g: GroupId) -> bool {
        self.groups.get(&g).is_some_and(|g| g.running)
    }

    /// Blocks a sequence of `tokens` tokens needs.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.block_size)
    }

    fn new_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn new_seq(&mut self, group: GroupId, tokens: Vec<u32>, all_logits: bool, wants_logits: bool) -> SeqId {
        let id = self.new_id();
        self.seqs.insert(
            id,
            Seq {
                group,
                tokens,
                computed: 0,
                blocks: SeqBlocks::default(),
                all_logits,
                wants_logits,
                read: None,
                matched: false,
            },
        );
        id
    }

    fn enqueue(&mut self, kind: Kind, salt: String) -> GroupId {
        let id = self.new_id();
        self.next_order += 1;
        self.groups.insert(
            id,
            Group {
                order: self.next_order,
                salt,
                seqs: vec![],
                kind,
                running: false,
                admitted_once: false,
                cached_tokens: 0,
                decision_warmed_tokens: 0,
                computed_tokens: 0,
            },
        );
        self.waiting.push_back(id);
        id
    }

    /// Queues a completion: one sequence over `prompt` (forked later with [`Scheduler::fork`]).
    pub fn add_generate(&mut self, prompt: Vec<u32>, salt: &str, all_logits: bool) -> (GroupId, SeqId) {
        let g = self.enqueue(Kind::Generate, salt.to_string());
        let s = self.new_seq(g, prompt, all_logits, true);
        self.groups.get_mut(&g).expect("just added").seqs.push(s);
        (g, s)
    }

    /// Queues a decision: one read per prompt. Their longest common prefix is computed once by a prefix
    /// sequence, then one sequence per prompt is forked from it. Returns the group; the question
    /// sequences exist once [`Scheduler::question_seqs`] returns them.
    pub fn add_decision(&mut self, prompts: Vec<Vec<u32>>, salt: &str) -> GroupId {
        assert!(!prompts.is_empty() && prompts.iter().all(|p| !p.is_empty()));
        let min_len = prompts.iter().map(Vec::len).min().unwrap_or(1);
        let shared = if prompts.len() == 1 {
            0
        } else {
            common_prefix(&prompts).min(min_len - 1)
        };
        let g = self.enqueue(
            Kind::Decide {
                prompts: prompts.clone(),
                shared,
                forked: false,
            },
            salt.to_string(),
        );
        self.init_decision(g);
        g
    }

    fn init_decision(&mut self, g: GroupId) {
        let (prompts, shared) = match &self.groups[&g].kind {
            Kind::Decide { prompts, shared, .. } => (prompts.clone(), *shared),
            Kind::Generate => unreachable!(),
        };
        let seqs = if shared == 0 {
            // A single read (or nothing shared): the reads are plain sequences.
            let ids: Vec<SeqId> = prompts
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let id = self.new_seq(g, p, false, true);
                    self.seqs.get_mut(&id).expect("just added").read = Some(i);
                    id
                })
                .collect();
            if let Some(Kind::Decide { forked, .. }) = self.groups.get_mut(&g).map(|g| &mut g.kind) {
                *forked = true;
            }
            ids
        } else {
            vec![self.new_seq(g, prompts[0][..shared].to_vec(), false, false)]
        };
        self.groups.get_mut(&g).expect("exists").seqs = seqs;
    }

    /// The question sequences of a decision, in prompt order, once forked.
    pub fn question_seqs(&self, g: GroupId) -> Option<&[SeqId]> {
        let grp = self.groups.get(&g)?;
        match grp.kind {
            Kind::Decide { forked: true, .. } => Some(&grp.seqs),
            _ => None,
        }
    }

    /// Forks `n` new sequences off `seq`, sharing its blocks (copy-on-write on their first write).
    pub fn fork(&mut self, seq: SeqId, n: usize) -> Vec<SeqId> {
        let (g, tokens, computed, blocks, all_logits) = {
            let s = &self.seqs[&seq];
            (s.group, s.tokens.clone(), s.computed, s.blocks.clone(), s.all_logits)
        };
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.new_seq(g, tokens.clone(), all_logits, true);
            let sb = self.kv.fork(&blocks);
            let s = self.seqs.get_mut(&id).expect("just added");
            s.blocks = sb;
            s.computed = computed;
            s.matched = true;
            self.groups.get_mut(&g).expect("exists").seqs.push(id);
            out.push(id);
        }
        out
    }

    /// Appends a sampled token to a sequence.
    pub fn append_token(&mut self, seq: SeqId, tok: u32) {
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.tokens.push(tok);
        }
    }

    /// Records that a chunk ran: its tokens are now in the cache; full blocks join the prefix cache.
    pub fn advance(&mut self, c: &Chunk) {
        let Some(s) = self.seqs.get_mut(&c.seq) else { return };
        debug_assert_eq!(s.computed, c.start);
        s.computed = c.start + c.len;
        let g = s.group;
        let grp = self.groups.get_mut(&g).expect("seq without group");
        grp.computed_tokens += c.len;
        let salt = grp.salt.clone();
        let decision = matches!(grp.kind, Kind::Decide { .. });
        let s = self.seqs.get_mut(&c.seq).expect("exists");
        self.kv.commit(&mut s.blocks, &s.tokens, s.computed, &salt, decision);
    }

    /// Ends one sequence, releasing its blocks. The group ends with its last sequence.
    pub fn finish_seq(&mut self, seq: SeqId) {
        let Some(mut s) = self.seqs.remove(&seq) else { return };
        self.kv.release(&mut s.blocks);
        let g = s.group;
        let empty = {
            let grp = self.groups.get_mut(&g).expect("seq without group");
            grp.seqs.retain(|&x| x != seq);
            grp.seqs.is_empty()
        };
        if empty {
            self.remove_group(g);
        }
    }

    /// Ends a group and all its sequences, wherever it is (waiting or running).
    pub fn finish_group(&mut self, g: GroupId) {
        if let Some(grp) = self.groups.get(&g) {
            for s in grp.seqs.clone() {
                if let Some(mut seq) = self.seqs.remove(&s) {
                    self.kv.release(&mut seq.blocks);
                }
            }
            self.remove_group(g);
        }
    }

    fn remove_group(&mut self, g: GroupId) {
        self.groups.remove(&g);
        self.waiting.retain(|&x| x != g);
        self.running.retain(|&x| x != g);
    }

    /// Pins the first `tokens / block_size` full blocks of a sequence until `until` (a caller-defined
    /// clock value); see [`Scheduler::expire_pins`].
    pub fn pin_prefix(&mut self, seq: SeqId, tokens: usize, until: u64) -> usize {
        let Some(s) = self.seqs.get(&seq) else { return 0 };
        let n = (tokens / self.cfg.block_size).min(s.computed / self.cfg.block_size);
        let blocks = s.blocks.blocks[..n].to_vec();
        self.kv.pin(&blocks);
        self.pins.push((until, blocks));
        n
    }

    /// Releases pins whose time is `≤ now`; returns how many were released.
    pub fn expire_pins(&mut self, now: u64) -> usize {
        let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pins).into_iter().partition(|(t, _)| *t <= now);
        self.pins = keep;
        for (_, b) in &done {
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
        self.pins.iter().map(|(t, _)| *t).min()
    }

    /// Preempts a running group by recompute: releases every block, resets its sequences (a forked decision
    /// goes back to its prefix), and puts it back into the waiting queue by arrival order.
    fn preempt(&mut self, g: GroupId, st: &mut StepState) {
        self.preemptions += 1;
        self.drop_chunks(g, st);
        let seqs = self.groups[&g].seqs.clone();
        for s in &seqs {
            let seq = self.seqs.get_mut(s).expect("exists");
            self.kv.release(&mut seq.blocks);
            seq.computed = 0;
            seq.matched = false;
        }
        let is_forked_decision =
            matches!(self.groups[&g].kind, Kind::Decide { forked: true, shared, .. } if shared > 0);
        if is_forked_decision {
            for s in &seqs {
                self.seqs.remove(s);
            }
            if let Some(Kind::Decide { forked, .. }) = self.groups.get_mut(&g).map(|g| &mut g.kind) {
                *forked = false;
            }
            self.init_decision(g);
        }
        let order = self.groups[&g].order;
        self.groups.get_mut(&g).expect("exists").running = false;
        self.running.retain(|&x| x != g);
        let pos = self
            .waiting
            .iter()
            .position(|w| self.groups[w].order > order)
            .unwrap_or(self.waiting.len());
        self.waiting.insert(pos, g);
        st.plan.preempted.push(g);
    }

    /// Prefix-matches a sequence that has no blocks yet (first admission or after preemption).
    fn match_seq(&mut self, sid: SeqId) -> usize {
        let (g, all_logits, wants_logits, len) = {
            let s = &self.seqs[&sid];
            if s.matched {
                return 0;
            }
            (s.group, s.all_logits, s.wants_logits, s.tokens.len())
        };
        let salt = self.groups[&g].salt.clone();
        // The last token is recomputed so there are logits to read; a decision prefix has no logits and
        // may match every full block.
        let max_blocks = if all_logits {
            0
        } else if wants_logits {
            (len - 1) / self.cfg.block_size
        } else {
            len / self.cfg.block_size
        };
        let tokens = self.seqs[&sid].tokens.clone();
        let sb = self.kv.match_prefix(&tokens, max_blocks, &salt, false);
        let hit = sb.blocks.len() * self.cfg.block_size;
        let s = self.seqs.get_mut(&sid).expect("exists");
        s.blocks = sb;
        s.computed = hit;
        s.matched = true;
        hit
    }

    fn unmatch_seq(&mut self, sid: SeqId) {
        let s = self.seqs.get_mut(&sid).expect("exists");
        self.kv.release(&mut s.blocks);
        s.computed = 0;
        s.matched = false;
    }

    fn try_reserve(&mut self, sid: SeqId, len: usize, copies: &mut Vec<(SeqId, BlockCopy)>) -> bool {
        let s = self.seqs.get_mut(&sid).expect("exists");
        let mut c = vec![];
        let ok = self.kv.reserve(&mut s.blocks, s.computed, s.computed + len, &mut c);
        copies.extend(c.into_iter().map(|c| (sid, c)));
        ok
    }

    fn chunk_for(&self, sid: SeqId, len: usize) -> Chunk {
        let s = &self.seqs[&sid];
        let end = s.computed + len;
        let logits = if !s.wants_logits || end < s.tokens.len() {
            if s.all_logits {
                Logits::All
            } else {
                Logits::None
            }
        } else if s.all_logits {
            Logits::All
        } else {
            Logits::Last
        };
        Chunk {
            seq: sid,
            start: s.computed,
            len,
            logits,
        }
    }

    /// Forks every running decision whose shared prefix is computed into its question sequences.
    fn fork_ready_decisions(&mut self) {
        for g in self.running.clone() {
            let (prompts, shared) = match &self.groups[&g].kind {
                Kind::Decide {
                    prompts,
                    shared,
                    forked: false,
                } => (prompts.clone(), *shared),
                _ => continue,
            };
            let prefix = self.groups[&g].seqs[0];
            if self.seqs[&prefix].computed < shared {
                continue;
            }
            let mut ids = Vec::with_capacity(prompts.len());
            for (i, p) in prompts.into_iter().enumerate() {
                let id = self.new_seq(g, p, false, true);
                let sb = self.kv.fork(&self.seqs[&prefix].blocks);
                let s = self.seqs.get_mut(&id).expect("just added");
                s.read = Some(i);
                s.blocks = sb;
                s.computed = shared;
                s.matched = true;
                ids.push(id);
            }
            let mut pre = self.seqs.remove(&prefix).expect("exists");
            self.kv.release(&mut pre.blocks);
            let grp = self.groups.get_mut(&g).expect("exists");
            grp.seqs = ids;
            if let Kind::Decide { forked, .. } = &mut grp.kind {
                *forked = true;
            }
        }
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> Plan {
        let mut st = StepState {
            plan: Plan::default(),
            copies: vec![],
            budget: self.cfg.max_num_batched_tokens,
            planned: HashSet::new(),
        };
        self.fork_ready_decisions();
        // 1 and 2: running groups, decode tokens first, then prefill chunks.
        self.schedule_running(&mut st, true);
        self.schedule_running(&mut st, false);
        // 3: admit waiting groups in FIFO order; decisions whose prefix is fully cached fork at once and
        // their questions join this step.
        if self.admit_waiting(&mut st) {
            self.fork_ready_decisions();
            self.schedule_running(&mut st, true);
            self.schedule_running(&mut st, false);
        }
        st.plan.copies = st.copies.into_iter().map(|(_, c)| c).collect();
        st.plan
    }

    fn schedule_running(&mut self, st: &mut StepState, decode_phase: bool) {
        let mut i = 0;
        while i < self.running.len() {
            let g = self.running[i];
            let mut group_gone = false;
            for sid in self.groups[&g].seqs.clone() {
                if st.budget == 0 {
                    return;
                }
                if st.planned.contains(&sid) {
                    continue;
                }
                let s = &self.seqs[&sid];
                let remaining = s.tokens.len() - s.computed;
                let is_decode = remaining == 1 && s.matched;
                if remaining == 0 || is_decode != decode_phase {
                    continue;
                }
                self.match_seq(sid);
                let s = &self.seqs[&sid];
                let len = (s.tokens.len() - s.computed).min(st.budget);
                if len == 0 {
                    continue;
                }
                loop {
                    if self.try_reserve(sid, len, &mut st.copies) {
                        st.plan.chunks.push(self.chunk_for(sid, len));
                        st.planned.insert(sid);
                        st.budget -= len;
                        break;
                    }
                    let victim = self.running.iter().rev().copied().find(|&v| v != g);
                    match victim {
                        Some(v) if self.groups[&v].order > self.groups[&g].order => self.preempt(v, st),
                        Some(_) => {
                            // This group is the newest that could give way: it yields itself.
                            self.preempt(g, st);
                            group_gone = true;
                            break;
                        }
                        None => {
                            // Alone and still too big: it can never run.
                            self.drop_chunks(g, st);
                            st.plan.failed.push(g);
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
    }

    /// Admits waiting groups; returns whether any was admitted.
    fn admit_waiting(&mut self, st: &mut StepState) -> bool {
        let mut admitted = false;
        while st.budget > 0 {
            let Some(&g) = self.waiting.front() else { break };
            let n_seqs = self.groups[&g].seqs.len();
            if self.num_running_seqs() + n_seqs > self.cfg.max_num_seqs && !self.running.is_empty() {
                break;
            }
            let first = self.groups[&g].seqs[0];
            let hit = self.match_seq(first);
            let s = &self.seqs[&first];
            let len = (s.tokens.len() - s.computed).min(st.budget);
            if len > 0 && !self.try_reserve(first, len, &mut st.copies) {
                self.unmatch_seq(first);
                if self.running.is_empty() && st.plan.chunks.is_empty() {
                    // Nothing else holds blocks, and it still does not fit.
                    self.waiting.pop_front();
                    st.plan.failed.push(g);
                    self.finish_group(g);
                    continue;
                }
                break;
            }
            if len > 0 {
                st.plan.chunks.push(self.chunk_for(first, len));
                st.planned.insert(first);
                st.budget -= len;
            }
            self.waiting.pop_front();
            let order = self.groups[&g].order;
            let pos = self
                .running
                .iter()
                .position(|r| self.groups[r].order > order)
                .unwrap_or(self.running.len());
            self.running.insert(pos, g);
            admitted = true;
            let tokens = self.seqs[&first].tokens.len();
            let warmed = self.seqs[&first]
                .blocks
                .blocks
                .iter()
                .take(hit / self.cfg.block_size)
                .filter(|&&b| self.kv.pool().is_decision_warmed(b))
                .count()
                * self.cfg.block_size;
            let grp = self.groups.get_mut(&g).expect("exists");
            grp.running = true;
            if !grp.admitted_once {
                grp.admitted_once = true;
                grp.cached_tokens = hit;
                grp.decision_warmed_tokens = warmed;
                self.kv_record(tokens as u64, hit as u64);
            }
        }
        admitted
    }

    fn drop_chunks(&mut self, g: GroupId, st: &mut StepState) {
        let set: HashSet<SeqId> = self.groups[&g].seqs.iter().copied().collect();
        st.plan.chunks.retain(|c| {
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

    fn kv_record(&mut self, queries: u64, hits: u64) {
        self.kv.record(queries, hits);
    }

    /// Checks that every block's reference count equals the number of tables (and pins) holding it, that
    /// no sequence holds a block twice, and the pool's own invariants.
    pub fn check_invariants(&self) {
        self.kv.pool().check_invariants();
        let mut refs = vec![0u32; self.kv.pool().total()];
        for s in self.seqs.values() {
            let mut seen = HashSet::new();
            for &b in &s.blocks.blocks {
                assert!(seen.insert(b), "block {b} twice in one table");
                refs[b as usize] += 1;
            }
            assert!(s.computed <= s.tokens.len());
            assert!(s.blocks.blocks.len() >= s.computed.div_ceil(self.cfg.block_size));
        }
        for (_, blocks) in &self.pins {
            for &b in blocks {
                refs[b as usize] += 1;
            }
        }
        for (b, &r) in refs.iter().enumerate() {
            assert_eq!(self.kv.pool().ref_count(b as BlockId), r, "ref count of block {b}");
        }
        for g in &self.running {
            assert!(self.groups[g].running);
        }
        for g in &self.waiting {
            assert!(!self.groups[g].running);
        }
        assert_eq!(self.running.len() + self.waiting.len(), self.groups.len());
        let orders: Vec<u64> = self.running.iter().map(|g| self.groups[g].order).collect();
        assert!(orders.windows(2).all(|w| w[0] < w[1]), "running not in arrival order");
    }
}
