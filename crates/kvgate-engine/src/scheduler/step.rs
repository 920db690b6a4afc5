//! The scheduling pass: decode tokens, then prefill chunks of running groups, then admission of
//! waiting ones; preemption by recompute when a sequence cannot grow; groups that can never fit are
//! reported as failed. Ends by filling each chunk with its tokens, slots and table.

use std::collections::HashSet;

use super::plan::{Chunk, Logits, Plan, Planned, StepState};
use super::{Result, Scheduler};
use crate::kv_manager::Salts;
use crate::registry::{GroupId, Registry, SchedError, Seq, SeqId};
use kvgate_backend::BlockCopy;

/// Where a group that arrived at `order` goes in a queue kept in arrival order (before the first newer
/// group).
fn arrival_slot<'a>(reg: &Registry, queue: impl IntoIterator<Item = &'a GroupId>, order: u64) -> usize {
    let mut n = 0;
    for &g in queue {
        if reg.group(g).is_ok_and(|x| x.order > order) {
            return n;
        }
        n += 1;
    }
    n
}

impl Scheduler {
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
        let pos = arrival_slot(&self.reg, &self.waiting, order);
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
        let grp = self.reg.group(s.group)?;
        let max_blocks = self.matchable_blocks(s);
        let salts = Salts {
            own: &grp.salt,
            exact: grp.exact_salt.as_deref(),
        };
        let sb = self.kv.match_prefix(&s.tokens, max_blocks, salts, false);
        let hit = sb.len() * self.cfg.block_size;
        let s = self.reg.seq_mut(sid)?;
        s.blocks = sb;
        s.computed = hit;
        s.matched = true;
        Ok(hit)
    }

    /// How many leading full blocks of a sequence a prefix-cache match may take: the last token is
    /// recomputed so there are logits to read (none when every row's logits are wanted); a decision
    /// prefix has no logits and may match every full block.
    pub(super) fn matchable_blocks(&self, s: &Seq) -> usize {
        let n = if s.all_logits {
            0
        } else if s.wants_logits {
            s.tokens.len().saturating_sub(1) / self.cfg.block_size
        } else {
            s.tokens.len() / self.cfg.block_size
        };
        // a block holding tree tokens is never matched (their K/V are not a causal prefix's)
        n.min(s.plain_upto / self.cfg.block_size)
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
    pub(super) fn try_reserve(&mut self, sid: SeqId, len: usize, copies: &mut Vec<(SeqId, BlockCopy)>) -> Result<bool> {
        let s = self.reg.seq_mut(sid)?;
        let mut c = vec![];
        let ok = self.kv.reserve(&mut s.blocks, s.computed, s.computed + len, &mut c);
        copies.extend(c.into_iter().map(|c| (sid, c)));
        Ok(ok)
    }

    /// Blocks a group needs at least when it runs alone: the distinct blocks its sequences hold plus
    /// what `sid`'s next `len` tokens need beyond them (at least one: the step could not reserve it).
    fn needed_alone(&self, g: GroupId, sid: SeqId, len: usize) -> Result<usize> {
        let mut held = HashSet::new();
        for &s in self.group_seqs(g) {
            held.extend(self.reg.seq(s)?.blocks.live().iter().copied());
        }
        Ok(held.len() + self.blocks_needed(sid, len)?.max(1))
    }

    /// Blocks a sequence's next `len` tokens need beyond what it holds.
    fn blocks_needed(&self, sid: SeqId, len: usize) -> Result<usize> {
        let s = self.reg.seq(sid)?;
        Ok(self.kv.blocks_needed(&s.blocks, s.computed, s.computed + len))
    }

    /// The next chunk's length of a sequence within `budget` (and the cap of a sequence whose every row
    /// returns an output).
    fn chunk_len(&self, s: &Seq, budget: usize) -> usize {
        let len = (s.tokens.len() - s.computed).min(budget);
        if s.all_logits {
            len.min(self.all_rows_cap())
        } else {
            len
        }
    }

    fn plan_chunk(&self, sid: SeqId, len: usize, draft: usize) -> Result<Planned> {
        let s = self.reg.seq(sid)?;
        let end = s.computed + len;
        let logits = if s.all_logits || draft > 0 {
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
            draft,
        })
    }

    /// Turns a planned chunk into a self-contained [`Chunk`].
    fn fill(&self, p: Planned) -> Result<Chunk> {
        let s = self.reg.seq(p.seq)?;
        let bs = self.cfg.block_size;
        let end = p.start + p.len;
        let tree = if p.draft > 0 { s.spec.tree.clone() } else { vec![] };
        let slots = (0..p.len)
            .map(|i| p.start + crate::token_tree::offset(&tree, i))
            .map(|pos| {
                s.blocks
                    .get(pos / bs)
                    .map(|b| b.index() * bs + pos % bs)
                    .ok_or(SchedError::NoBlock { seq: p.seq, pos })
            })
            .collect::<Result<Vec<usize>>>()?;
        // a decode chunk's proposed tokens follow the sequence's own
        let known = end - p.draft;
        let mut tokens = s.tokens[p.start..known].to_vec();
        tokens.extend(s.spec.draft.iter().take(p.draft));
        Ok(Chunk {
            seq: p.seq,
            group: s.group,
            start: p.start,
            len: p.len,
            logits: p.logits,
            read: s.read,
            at_end: known == s.tokens.len(),
            tokens,
            slots,
            table: s.blocks.table(),
            draft: p.draft,
            tree,
        })
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> Result<Plan> {
        self.schedule_step(false)
    }

    /// Plans the next step; with `decode_only`, only the decode tokens of running sequences (no
    /// prefill chunk, no admission: the decode floor's steps).
    pub fn schedule_step(&mut self, decode_only: bool) -> Result<Plan> {
        let mut st = StepState {
            chunks: vec![],
            copies: vec![],
            preempted: vec![],
            failed: vec![],
            budget: self.cfg.max_num_batched_tokens,
            planned: HashSet::new(),
            speculate: self.speculates_now(),
        };
        self.fork_ready_decisions()?;
        // 1 and 2: running groups, decode tokens first, then prefill chunks.
        self.schedule_running(&mut st, true)?;
        if decode_only {
            return self.finish_plan(st);
        }
        // Next to decoding streams, prefill comes in shorter steps (the decode floor's granularity).
        if let (Some(cap), false) = (self.cfg.caps.prefill_cap, st.chunks.is_empty()) {
            let decoded = self.cfg.max_num_batched_tokens - st.budget;
            st.budget = st.budget.min(cap.saturating_sub(decoded).max(1));
        }
        // Cache-aware: sessions' next turns before the running prompts' chunks (a few tokens over a
        // warm state: they do not wait behind a cold prefill).
        if self.cfg.admission.cache_aware && self.admit_waiting(&mut st, true)? {
            self.fork_ready_decisions()?;
            self.schedule_running(&mut st, true)?;
        }
        self.schedule_running(&mut st, false)?;
        // 3: admit waiting groups (admission's order); decisions whose prefix is fully cached fork at
        // once and their questions join this step.
        if self.admit_waiting(&mut st, false)? {
            self.fork_ready_decisions()?;
            self.schedule_running(&mut st, true)?;
            self.schedule_running(&mut st, false)?;
        }
        self.finish_plan(st)
    }

    /// The plan of a finished scheduling pass.
    fn finish_plan(&self, st: StepState) -> Result<Plan> {
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
                let len = self.chunk_len(s, st.budget);
                if len == 0 {
                    continue;
                }
                // Proposed tokens ride along when their blocks are free (never at anyone's expense),
                // while the step speculates or, past `max_batch`, while the sequence keeps them.
                let draft = if is_decode {
                    let may = self.may_speculate(self.reg.seq(sid)?, st.speculate);
                    if !may && self.cfg.speculation.is_some() {
                        self.decoded_without_proposals(sid)?;
                    }
                    let room = if may { st.budget - len } else { 0 };
                    self.plan_draft(sid, room, &mut st.copies)?
                } else {
                    0
                };
                if draft > 0 {
                    st.chunks.push(self.plan_chunk(sid, len + draft, draft)?);
                    st.planned.insert(sid);
                    st.budget -= len + draft;
                    continue;
                }
                loop {
                    if self.try_reserve(sid, len, &mut st.copies)? {
                        st.chunks.push(self.plan_chunk(sid, len, 0)?);
                        st.planned.insert(sid);
                        st.budget -= len;
                        break;
                    }
                    // Pins give way before any running request is preempted.
                    if self.release_pin_for_running() {
                        continue;
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
                            // Alone, nothing pinned, and still too big: it can never run.
                            let needed = self.needed_alone(g, sid, len)?;
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

    /// Admits waiting groups (in the order [`Scheduler::pick_waiting`] gives; with `next_turns_only`
    /// only sessions' next turns); returns whether any was admitted.
    fn admit_waiting(&mut self, st: &mut StepState, next_turns_only: bool) -> Result<bool> {
        let mut admitted = false;
        while st.budget > 0 {
            let Some(at) = self.pick_waiting(next_turns_only) else {
                break;
            };
            let Some(&g) = self.waiting.get(at) else { break };
            let seqs = self.group_seqs(g);
            if self.num_running_seqs() + seqs.len() > self.cfg.max_num_seqs && !self.running.is_empty() {
                break;
            }
            let Some(&first) = seqs.first() else {
                return Err(SchedError::UnknownGroup(g));
            };
            let hit = self.match_seq(first)?;
            let nothing_else = self.running.is_empty() && st.chunks.is_empty();
            if self.must_wait_whole(g, first, nothing_else)? {
                self.unmatch_seq(first)?;
                break;
            }
            let s = self.reg.seq(first)?;
            let len = self.chunk_len(s, st.budget);
            let mut fits = len == 0 || self.try_reserve(first, len, &mut st.copies)?;
            // Pins give way before a request is left waiting for blocks (cache-aware: only old ones,
            // to one that starves, or past the idle grace when nothing else holds blocks).
            while !fits && self.release_pin_for(g, nothing_else) {
                fits = self.try_reserve(first, len, &mut st.copies)?;
            }
            if !fits {
                let needed = self.needed_alone(g, first, len)?;
                self.unmatch_seq(first)?;
                if nothing_else && self.pins.is_empty() {
                    // Nothing else holds blocks, and it still does not fit.
                    self.waiting.remove(at);
                    st.failed.push((g, needed));
                    self.finish_group(g);
                    continue;
                }
                break;
            }
            if len > 0 {
                st.chunks.push(self.plan_chunk(first, len, 0)?);
                st.planned.insert(first);
                st.budget -= len;
            }
            self.waiting.remove(at);
            self.consume_session_pins(first)?;
            let order = self.reg.group(g)?.order;
            let pos = arrival_slot(&self.reg, &self.running, order);
            self.running.insert(pos, g);
            admitted = true;
            let s = self.reg.seq(first)?;
            let tokens = s.tokens.len();
            let warmed = s
                .blocks
                .live()
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
}
