//! The scheduler's side of speculation ([`crate::speculation`]): a decode chunk takes a sequence's
//! proposed tokens as extra rows when the step speculates and their blocks are free (a proposal never
//! preempts or waits for anyone); after the request kind verified them, the kept tokens' K/V stay
//! (their full blocks join the prefix cache exactly as decoding them one by one would register them),
//! and the blocks reserved only for rejected tokens go back to the pool.

use super::{Result, Scheduler};
use crate::kv_manager::KvManager;
use crate::registry::{GroupKind, SchedError, SeqId};
use crate::speculation::{self, SpecConfig};
use kvgate_backend::BlockCopy;

impl Scheduler {
    /// Turns speculation on (or off with `None`); sequences never propose past `max_len` positions.
    pub fn set_speculation(&mut self, spec: Option<SpecConfig>, max_len: usize) {
        self.spec = spec;
        self.spec_max_len = max_len;
    }

    /// The speculation settings and the position limit (to carry them over a reset).
    pub fn speculation(&self) -> (Option<SpecConfig>, usize) {
        (self.spec, self.spec_max_len)
    }

    /// Whether this step speculates: on, and few enough sequences decode that a step is bound by
    /// reading the weights rather than by computing (`max_batch`).
    pub(super) fn speculates_now(&self) -> bool {
        self.spec
            .is_some_and(|c| self.num_running_seqs() <= c.max_batch && c.max_batch > 0)
    }

    /// Proposes tokens for decode sequence `sid` (at most `room` of them) and reserves their slots;
    /// returns how many (0: none found, none allowed, or no free blocks for them, and then nothing
    /// changed).
    pub(super) fn plan_draft(
        &mut self,
        sid: SeqId,
        room: usize,
        copies: &mut Vec<(SeqId, BlockCopy)>,
    ) -> Result<usize> {
        let Some(cfg) = self.spec else { return Ok(0) };
        let max_len = self.spec_max_len;
        let s = self.reg.seq_mut(sid)?;
        s.draft.clear();
        // the chunk's first row is the sequence's last token, at position `computed`
        let past_end = max_len.saturating_sub(s.computed + 1);
        let k = s.spec_len.min(s.spec_limit).min(room).min(past_end);
        if k == 0 {
            return Ok(0);
        }
        let proposal = speculation::propose(&s.tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max, k);
        if proposal.is_empty() {
            return Ok(0);
        }
        s.draft = proposal.to_vec();
        let n = s.draft.len();
        if !self.try_reserve(sid, 1 + n, copies)? {
            self.reg.seq_mut(sid)?.draft.clear();
            return Ok(0);
        }
        Ok(n)
    }

    /// The request kind kept the first `accepted` tokens its last decode chunk proposed (and appended
    /// them, with the token sampled after them): they count as computed, full blocks are registered,
    /// and blocks past what the sequence now needs are given back.
    pub(crate) fn accept_draft(&mut self, seq: SeqId, accepted: usize) -> Result<()> {
        let (bs, max) = (self.cfg.block_size, self.spec.map_or(1, |c| c.num_speculative_tokens));
        let s = self.reg.seq_mut(seq)?;
        let proposed = std::mem::take(&mut s.draft).len();
        if accepted > proposed || s.computed + accepted > s.tokens.len() {
            return Err(SchedError::BadAccept {
                seq,
                accepted,
                proposed,
            });
        }
        s.computed += accepted;
        s.spec_len = speculation::next_len(s.spec_len, proposed, accepted, max);
        let g = s.group;
        let grp = self.reg.group(g)?;
        let (salt, decision) = (grp.salt.clone(), matches!(grp.kind, GroupKind::Decide(_)));
        let s = self.reg.seq_mut(seq)?;
        self.kv.commit(&mut s.blocks, &s.tokens, s.computed, &salt, decision);
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
