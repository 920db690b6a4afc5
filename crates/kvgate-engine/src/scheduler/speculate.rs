//! The scheduler's side of speculation ([`crate::speculation`]): a decode chunk takes a sequence's
//! proposed tokens as extra rows when the step speculates and their blocks are free (a proposal never
//! preempts or waits for anyone); after the request kind verified them, the kept tokens' K/V stay
//! (their full blocks join the prefix cache exactly as decoding them one by one would register them),
//! and the blocks reserved only for rejected tokens go back to the pool. With a draft model the
//! proposals come from the engine's drafter ([`crate::draft`]): the scheduler says who may be
//! proposed how many tokens ([`Scheduler::draft_asks`]) and takes what was drafted as the proposal.

use super::{Chunk, Result, Scheduler};
use crate::kv_manager::KvManager;
use crate::registry::{GroupKind, SchedError, SeqId};
use crate::speculation::{self, Cursor, SpecConfig};
use kvgate_backend::BlockCopy;

/// A sequence the draft model is asked to propose for this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DraftAsk<'a> {
    /// The sequence.
    pub(crate) seq: SeqId,
    /// Its tokens.
    pub(crate) tokens: &'a [u32],
    /// How many of them the draft should hold: all of them for a sequence that decodes next (the
    /// last one's row gives the first proposal), what the target computed so far for one that is
    /// still computing its prompt (the draft follows the target's chunks, so its prompt is ready
    /// when decoding starts and its cost falls on the prompt's time, not between tokens).
    pub(crate) upto: usize,
    /// Most tokens to propose (0 for a prompt still being computed).
    pub(crate) k: usize,
    /// Its group's prefix-cache key (the draft's cache is keyed the same way).
    pub(crate) salt: &'a str,
}

impl Scheduler {
    /// The speculation settings, when on.
    fn spec(&self) -> Option<SpecConfig> {
        self.cfg.speculation.map(|p| p.config)
    }

    /// Most positions a sequence may reach (proposals stop there).
    fn spec_max_len(&self) -> usize {
        self.cfg.speculation.map_or(usize::MAX, |p| p.max_len)
    }

    /// Whether this step speculates: on, and few enough sequences decode that a step is bound by
    /// reading the weights rather than by computing (`max_batch`).
    pub(super) fn speculates_now(&self) -> bool {
        self.spec()
            .is_some_and(|c| self.num_running_seqs() <= c.max_batch && c.max_batch > 0)
    }

    /// Whether sequence `s` may propose in a step that speculates (`step`) or not: speculation is on,
    /// and the step speculates or the sequence keeps its proposals.
    pub(super) fn may_speculate(&self, s: &crate::registry::Seq, step: bool) -> bool {
        self.spec().is_some() && (step || s.spec.keep.speculates())
    }

    /// Whether prompt lookup has a proposal for `s` now (its context holds a match).
    fn looked_up(&self, s: &crate::registry::Seq) -> bool {
        self.spec().is_some_and(|c| {
            c.method.looks_up()
                && !speculation::propose(&s.tokens, s.spec.cursor, c.prompt_lookup_min, c.prompt_lookup_max, 1)
                    .0
                    .is_empty()
        })
    }

    /// The sequences a draft model proposes for before this step is planned: each running sequence
    /// that decodes next and may speculate (and, with both methods, has no lookup match), with the
    /// most tokens it may be proposed (its adaptive length, its request's limit, the context), and —
    /// while the step speculates — each completion still computing its prompt, with what the target
    /// computed of it. Empty unless a draft model proposes.
    pub(crate) fn draft_asks(&self) -> Vec<DraftAsk<'_>> {
        let mut out = vec![];
        if !self.spec().is_some_and(|c| c.method.drafts()) {
            return out;
        }
        let step = self.speculates_now();
        for &g in &self.running {
            let Ok(grp) = self.reg.group(g) else { continue };
            let completion = matches!(grp.kind, GroupKind::Generate);
            for &sid in &grp.seqs {
                let Ok(s) = self.reg.seq(sid) else { continue };
                let (upto, k) = if s.tokens.len() == s.computed + 1 && s.matched {
                    if !self.may_speculate(s, step) || self.looked_up(s) {
                        continue;
                    }
                    let past_end = self.spec_max_len().saturating_sub(s.computed + 1);
                    (s.tokens.len(), s.spec.len.min(s.spec.limit).min(past_end))
                } else if completion && s.matched && step {
                    (s.computed, 0)
                } else {
                    continue;
                };
                if upto > 0 && (k > 0 || upto < s.tokens.len()) {
                    out.push(DraftAsk {
                        seq: sid,
                        tokens: &s.tokens,
                        upto,
                        k,
                        salt: &grp.salt,
                    });
                }
            }
        }
        out
    }

    /// Whether the draft model keeps `seq`'s state: it exists and its group runs (a preempted or
    /// ended sequence's draft blocks go back).
    pub(crate) fn drafting(&self, seq: SeqId) -> bool {
        self.reg
            .seq(seq)
            .and_then(|s| self.reg.group(s.group))
            .is_ok_and(|g| g.running)
    }

    /// What the draft computes beside a planned step: every chunk of a completion that carries no
    /// proposal (a prompt chunk), up to its end — so the draft holds a prompt's end (its window,
    /// [`crate::speculation::draft_start`]) when its first token is sampled, and its cost falls on the
    /// prompt's time, not between tokens, as when a GPU computes the draft's prefill in the target's
    /// step.
    pub(crate) fn draft_follows(&self, chunks: &[Chunk]) -> Vec<DraftAsk<'_>> {
        let mut out = vec![];
        if !self.speculates_now() || !self.spec().is_some_and(|c| c.method.drafts()) {
            return out;
        }
        for c in chunks.iter().filter(|c| c.draft == 0 && c.len > 0) {
            let (Ok(s), Ok(grp)) = (self.reg.seq(c.seq), self.reg.group(c.group)) else {
                continue;
            };
            if matches!(grp.kind, GroupKind::Generate) {
                out.push(DraftAsk {
                    seq: c.seq,
                    tokens: &s.tokens,
                    upto: (c.start + c.len).min(s.tokens.len()),
                    k: 0,
                    salt: &grp.salt,
                });
            }
        }
        out
    }

    /// What the draft model proposed for `seq` this step (taken by its next decode chunk; empty when
    /// the draft doubted its first token). A sequence is asked again at its next decode step whatever
    /// it proposed: resting one that doubted (1, 2, 4 … 8 steps, as before) measured 1.23× instead of
    /// 1.30× on the 1.5B's chat with its head-cut 0.5B draft — a doubt is local, and the tokens a rest
    /// skips are as likely to draft well as any.
    pub(crate) fn set_drafted(&mut self, seq: SeqId, tokens: Vec<u32>) -> Result<()> {
        self.reg.seq_mut(seq)?.spec.drafted = tokens;
        Ok(())
    }

    /// Proposes tokens for decode sequence `sid` (at most `room` of them) and reserves their slots;
    /// returns how many (0: none found, none allowed, or no free blocks for them, and then nothing
    /// changed). Prompt lookup first where the method looks up, then what the draft model proposed.
    pub(super) fn plan_draft(
        &mut self,
        sid: SeqId,
        room: usize,
        copies: &mut Vec<(SeqId, BlockCopy)>,
    ) -> Result<usize> {
        let Some(cfg) = self.spec() else { return Ok(0) };
        let max_len = self.spec_max_len();
        let s = self.reg.seq_mut(sid)?;
        s.spec.draft.clear();
        let drafted = std::mem::take(&mut s.spec.drafted);
        // the chunk's first row is the sequence's last token, at position `computed`
        let past_end = max_len.saturating_sub(s.computed + 1);
        let k = s.spec.len.min(s.spec.limit).min(room).min(past_end);
        if k == 0 {
            return Ok(0);
        }
        let plan = self.cfg.speculation;
        let rows = plan.and_then(|p| p.rows_per_weight_read).filter(|&r| r > 1);
        let grain = plan.and_then(|p| p.tree).filter(|_| cfg.tree_branches > 1);
        let mut proposal: &[u32] = &[];
        let mut others = vec![];
        if cfg.method.looks_up() {
            let (min, max) = (cfg.prompt_lookup_min, cfg.prompt_lookup_max);
            // other proposals may run as long as the most a sequence proposes
            let long = cfg
                .num_speculative_tokens
                .min(s.spec.limit)
                .min(room)
                .min(past_end)
                .max(k);
            let want = if grain.is_some() { cfg.tree_branches } else { 1 };
            let found = speculation::candidates(&s.tokens, s.spec.cursor, min, max, long, want);
            if let Some(&(p, from)) = found.first() {
                proposal = &p[..p.len().min(k)];
                others = found[1..].to_vec();
                s.spec.cursor = Some(Cursor {
                    from,
                    len: s.tokens.len(),
                });
            } else {
                s.spec.cursor = None;
            }
        }
        if proposal.is_empty() && cfg.method.drafts() {
            proposal = &drafted[..drafted.len().min(k)];
        }
        let n = trimmed(proposal.len(), rows);
        if n == 0 {
            return Ok(0);
        }
        let (mut draft, mut span) = (proposal[..n].to_vec(), n);
        s.spec.main = n;
        s.spec.tree.clear();
        s.spec.sources.clear();
        if grain.is_some() && !others.is_empty() && !s.spec.branching.branches() {
            s.spec.branching = s.spec.branching.skipped();
            others.clear();
        }
        if let (Some(grain), false) = (grain, others.is_empty()) {
            // the other proposals fill the rows the weight read computes anyway
            let fill = rows.map_or(cfg.num_speculative_tokens, |r| (1 + n).div_ceil(r) * r - 1);
            let max_nodes = fill.min(room).min(speculation::MAX_SPECULATIVE_TOKENS);
            let from = s.spec.cursor.map_or(0, |c| c.from);
            let mut all = vec![(&draft[..], from)];
            all.extend(others);
            let t = crate::token_tree::Tree::build(&all, s.computed, grain, max_nodes);
            if t.branches() {
                span = t.span();
                draft = t.tokens;
                s.spec.tree = t.nodes;
                s.spec.sources = t.from;
            }
        }
        let len = draft.len();
        s.spec.draft = draft;
        if !self.try_reserve(sid, 1 + span, copies)? {
            let s = self.reg.seq_mut(sid)?;
            s.spec.draft.clear();
            s.spec.tree.clear();
            return Ok(0);
        }
        Ok(len)
    }

    /// A decode sequence that may not propose this step because the batch is past `max_batch` and it
    /// has not been keeping its proposals: its keep rate creeps back up (it tries again later).
    pub(super) fn decoded_without_proposals(&mut self, sid: SeqId) -> Result<()> {
        let s = self.reg.seq_mut(sid)?;
        s.spec.keep = s.spec.keep.decoded();
        Ok(())
    }

    /// The request kind kept the first `accepted` tokens its last decode chunk proposed (and appended
    /// them, with the token sampled after them): they count as computed, full blocks are registered,
    /// and blocks past what the sequence now needs are given back.
    pub(crate) fn accept_draft(&mut self, seq: SeqId, accepted: usize) -> Result<()> {
        let (bs, max) = (self.cfg.block_size, self.spec().map_or(1, |c| c.num_speculative_tokens));
        let s = self.reg.seq_mut(seq)?;
        let (proposed, main) = (std::mem::take(&mut s.spec.draft).len(), s.spec.main);
        s.spec.tree.clear();
        if accepted > proposed || s.computed + accepted > s.tokens.len() {
            return Err(SchedError::BadAccept {
                seq,
                accepted,
                proposed,
            });
        }
        s.computed += accepted;
        s.spec.len = speculation::next_len(s.spec.len, main, accepted, max);
        s.spec.keep = s.spec.keep.verified(proposed, accepted);
        let g = s.group;
        let grp = self.reg.group(g)?;
        let (salt, decision) = (grp.salt.clone(), matches!(grp.kind, GroupKind::Decide(_)));
        let s = self.reg.seq_mut(seq)?;
        self.kv
            .commit(&mut s.blocks, &s.tokens, s.computed.min(s.plain_upto), &salt, decision);
        if let Some(w) = self.cfg.release_window {
            self.kv.release_slid(&mut s.blocks, s.computed, w);
        }
        // the pending last token's slot stays (the next decode writes it)
        let keep = s.tokens.len().max(s.computed).div_ceil(bs);
        KvManager::truncate(&mut self.kv, &mut s.blocks, keep);
        self.spec_stats.record(proposed, accepted);
        Ok(())
    }
}

impl Scheduler {
    /// The request kind kept path `rows` of its last decode chunk's token tree (chunk rows, each the
    /// child of the one before, the first a child of the chunk's first row; their tokens appended):
    /// the rows not at their plain positions are to be copied there ([`Scheduler::take_slot_moves`],
    /// before anything reads them), the copy goes on where the kept proposal came from, and the rest
    /// is [`Scheduler::accept_draft`]'s. A single-path proposal takes the path `1, 2, …`.
    pub(crate) fn accept_path(&mut self, seq: SeqId, rows: &[usize]) -> Result<()> {
        let bs = self.cfg.block_size;
        let s = self.reg.seq_mut(seq)?;
        let bad = SchedError::BadAccept {
            seq,
            accepted: rows.len(),
            proposed: s.spec.draft.len(),
        };
        if s.spec.tree.is_empty() {
            if rows.iter().enumerate().any(|(i, &r)| r != i + 1) {
                return Err(bad);
            }
            return self.accept_draft(seq, rows.len());
        }
        let chained = rows.iter().enumerate().all(|(i, &r)| {
            let parent = if i == 0 { 0 } else { rows[i - 1] };
            r >= 1 && s.spec.tree.get(r - 1).is_some_and(|n| n.parent == parent)
        });
        // the chunk's first row is the token before the kept ones
        let Some(start) = s.computed.checked_sub(1).filter(|_| chained) else {
            return Err(bad);
        };
        let slot = |pos: usize| s.blocks.get(pos / bs).map(|b| b.index() * bs + pos % bs);
        let moves = crate::token_tree::moves(&s.spec.tree, rows, start, |p| slot(p).unwrap_or(usize::MAX));
        if moves.iter().any(|m| m.src == usize::MAX || m.dst == usize::MAX) {
            return Err(bad);
        }
        if let Some(&from) = rows.last().and_then(|&r| s.spec.sources.get(r - 1)) {
            s.spec.cursor = Some(Cursor { from, len: start + 1 });
        }
        // what the other proposals' rows kept beyond the first's common part with the path
        let on_main = rows
            .iter()
            .take_while(|&&r| s.spec.tree[r - 1].at == s.spec.tree[r - 1].depth);
        let gained = rows.len() - on_main.count().min(s.spec.main);
        let gained = if moves.is_empty() { 0 } else { gained };
        let alt_rows = s.spec.tree.len().saturating_sub(s.spec.main);
        s.spec.branching = s.spec.branching.verified(alt_rows, gained);
        self.spec_stats.trees += 1;
        self.spec_stats.tree_branch_kept += u64::from(!moves.is_empty());
        self.slot_moves.extend(moves);
        self.accept_draft(seq, rows.len())
    }

    /// The slot copies kept tree paths need, to run before the next forward pass.
    pub(crate) fn take_slot_moves(&mut self) -> Vec<kvgate_backend::SlotCopy> {
        std::mem::take(&mut self.slot_moves)
    }
}

/// A proposal of `n` tokens trimmed so that its chunk (`1 + n` rows) does not spill a quarter of a
/// weight read or less (`rows` per read) into one more read: that read would cost about a whole
/// one-token step for at most that many tokens. (AVX-512, `num_speculative_tokens` 8, measured: 9 rows
/// to 8 took an edit from 1.91× to 2.16× of decoding without speculation.)
fn trimmed(n: usize, rows: Option<usize>) -> usize {
    let Some(r) = rows else { return n };
    let spill = (1 + n) % r;
    if 1 + n > r && spill > 0 && spill <= (r / 4).max(1) {
        n - spill
    } else {
        n
    }
}

#[cfg(test)]
#[path = "speculate_tests.rs"]
mod tests;
