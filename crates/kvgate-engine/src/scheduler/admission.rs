//! Cache-aware admission, for agents under load: a session's next turn jumps the queue (its state is
//! in the cache now, and may not be later), then a request that waited past the bound, then the one
//! whose prefix is warmest. A request starts only when its whole prompt fits beside what the running
//! requests still need and the retained states (not merely its first chunk: its later chunks would
//! take the states as they grow), so as many agent loops run as the cache holds, each keeping its
//! state from step to step, and the rest wait their turn instead of evicting them. Retained states
//! give way only when they are idle: to any request when nothing runs, once idle for the grace (a
//! second, longer than an agent loop's gap between two steps: a loop that has ended frees its room,
//! one between two steps keeps it); to a request that waited past the bound, once idle for the grace
//! and two whole steps (on a slow host one step outlasts the grace); to a request that
//! waited past the bound also once its session has held it for four times the bound turn after turn
//! (so sessions that never pause cannot starve the rest: they give way at a turn's end, never in the
//! middle of one). A state whose next turn is waiting is never idle, and running work that cannot grow
//! takes such a state last. Next turns are admitted before the running prompts' chunks take
//! the step's budget: a loop's step is a few tokens over its warm state and does not wait behind a
//! cold prefill. When a next turn is admitted it takes its session's retained blocks over (the pin is
//! consumed; the turn retains again at its own end, keeping when its state has been held since). The
//! retention cap spares states younger than the bound. FIFO admission is the other policy (and the
//! scheduler's default; the engine turns this one on).

use super::{Result, Scheduler};
use crate::kv_manager::Salts;
use crate::registry::{GroupId, SeqId};

/// How waiting requests are admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Warmest prefix first, and retained blocks only for the starving (else strict arrival order,
    /// pins released for anyone).
    pub cache_aware: bool,
    /// Milliseconds a request waits before it is admitted in arrival order, whatever it evicts.
    pub max_wait_ms: u64,
    /// Waiting requests ranked per step (past these, arrival order; SGLang's bound is 128).
    pub scan: usize,
    /// Milliseconds a retained state is spared after its turn when nothing else runs (and over the
    /// retention cap): the gap between an agent loop's steps.
    pub idle_grace_ms: u64,
}

impl Default for Admission {
    /// Arrival order.
    fn default() -> Admission {
        Admission {
            cache_aware: false,
            max_wait_ms: 30_000,
            scan: 128,
            idle_grace_ms: 1_000,
        }
    }
}

impl Admission {
    /// The cache-aware policy with a starvation bound of `max_wait_ms`.
    pub fn cache_aware(max_wait_ms: u64) -> Admission {
        Admission {
            cache_aware: true,
            max_wait_ms,
            ..Admission::default()
        }
    }
}

impl Scheduler {
    /// Whether `g` has waited past the starvation bound.
    pub(super) fn starving(&self, g: GroupId) -> bool {
        self.reg
            .group(g)
            .is_ok_and(|grp| self.now.saturating_sub(grp.arrived) >= self.cfg.admission.max_wait_ms)
    }

    /// The full blocks of `g`'s first sequence the prefix cache holds now, and how many more past them
    /// the second tier holds.
    fn warm_blocks(&self, g: GroupId) -> (Vec<crate::block_pool::BlockId>, usize) {
        let Some(&sid) = self.group_seqs(g).first() else {
            return (vec![], 0);
        };
        let (Ok(s), Ok(grp)) = (self.reg.seq(sid), self.reg.group(g)) else {
            return (vec![], 0);
        };
        let salts = Salts {
            own: &grp.salt,
            exact: grp.exact_salt.as_deref(),
        };
        self.kv.probe_prefix(&s.tokens, self.matchable_blocks(s), salts)
    }

    /// The index in `waiting` of the group to admit next. In arrival order, the front. Cache-aware,
    /// among the first `scan`: a session's next turn first (it would take a retained state over:
    /// cheap, and the state may not be there later), then the oldest starving group, then the warmest
    /// (blocks in the hot pool or the second tier; earliest among equals).
    /// With `next_turns_only`, only a session's next turn (else `None`).
    pub(super) fn pick_waiting(&self, next_turns_only: bool) -> Option<usize> {
        // a group held for its shared-tier fetch is passed over
        let first = self.waiting.iter().position(|&g| self.admissible(g))?;
        if !self.cfg.admission.cache_aware {
            return (!next_turns_only).then_some(first);
        }
        let mut warmest = (first, 0);
        let mut starving = None;
        for (i, &g) in self.waiting.iter().take(self.cfg.admission.scan).enumerate() {
            if !self.admissible(g) {
                continue;
            }
            let (warm, in_tier) = self.warm_blocks(g);
            if !warm.is_empty() && self.pins.any_session_over(&warm) {
                return Some(i);
            }
            if next_turns_only {
                continue;
            }
            if starving.is_none() && self.starving(g) {
                starving = Some(i);
            }
            if warm.len() + in_tier > warmest.1 {
                warmest = (i, warm.len() + in_tier);
            }
        }
        if next_turns_only {
            return None;
        }
        Some(starving.unwrap_or(warmest.0))
    }

    /// Releases a pin so that `g` can be admitted; false when none may go. Under FIFO the oldest pin.
    /// Cache-aware, with nothing else running the oldest pin taken at least the idle grace ago (one
    /// whose next turn waits only when every such pin's does, never `g`'s own); for a
    /// starving group also one whose session has held its state for four times the bound (it gives
    /// way at a turn's end, never in the middle of one); otherwise none.
    pub(super) fn release_pin_for(&mut self, g: GroupId, nothing_else: bool) -> bool {
        if !self.cfg.admission.cache_aware {
            return self.release_oldest_pin();
        }
        let bound = self.cfg.admission.max_wait_ms;
        let grace = bound.min(self.cfg.admission.idle_grace_ms);
        // Idle: not taken over for the grace and, while steps run, for two whole steps (a session's
        // next turn, sent as the step that ended its last one returned, has had a step's time to
        // arrive: on a slow host one step takes longer than the grace).
        let after = self.now.checked_sub(grace);
        let (idle, held) = if nothing_else {
            (after.map(|t| (t, u64::MAX)), None)
        } else if self.starving(g) {
            let steps = self.steps.checked_sub(2);
            (after.zip(steps), self.now.checked_sub(bound.saturating_mul(4)))
        } else {
            return false;
        };
        let awaited = self.awaited();
        let mut old = self.pins.take_oldest_since(idle, held, &awaited);
        if old.is_none() && nothing_else {
            // Every pin old enough is a state whose own next turn waits too, and nothing runs: `g`
            // goes first (spared only its own state), or the waiting next turns would wait on each
            // other's states until the pins expire.
            let own = [self.warm_blocks(g).0];
            old = self.pins.take_oldest_since(idle, held, &own);
        }
        self.release_early(old)
    }

    /// The warm blocks of the waiting requests (the first `scan`): a retained state they continue has
    /// its next turn waiting, and is not idle.
    pub(super) fn awaited(&self) -> Vec<Vec<crate::block_pool::BlockId>> {
        self.waiting
            .iter()
            .take(self.cfg.admission.scan)
            .map(|&g| self.warm_blocks(g).0)
            .filter(|w| !w.is_empty())
            .collect()
    }

    /// Running work that cannot grow takes a retained state: cache-aware, one whose next turn is not
    /// waiting first; false when nothing is pinned.
    pub(super) fn release_pin_for_running(&mut self) -> bool {
        if !self.cfg.admission.cache_aware {
            return self.release_oldest_pin();
        }
        let awaited = self.awaited();
        let old = self.pins.take_oldest_sparing(&awaited);
        self.release_early(old)
    }

    /// Cache-aware, whether `sid` (just matched; the first sequence of `g`) must wait because the rest
    /// of its prompt does not fit beside what the running groups still need (it would take retained
    /// states as it grows). Retained states old enough to give way to `g` are released first; a group
    /// that nothing retained stands in the way of does not wait here.
    pub(super) fn must_wait_whole(&mut self, g: GroupId, sid: SeqId, nothing_else: bool) -> Result<bool> {
        if !self.cfg.admission.cache_aware {
            return Ok(false);
        }
        let s = self.reg.seq(sid)?;
        let need = self.kv.blocks_needed(&s.blocks, s.computed, s.tokens.len());
        let mut committed = 0;
        for &r in &self.running {
            for &rs in self.group_seqs(r) {
                let q = self.reg.seq(rs)?;
                committed += self.kv.blocks_needed(&q.blocks, q.computed, q.tokens.len());
            }
        }
        while need + committed > self.kv.pool().num_free() {
            if self.pins.is_empty() {
                return Ok(false);
            }
            if !self.release_pin_for(g, nothing_else) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// A sequence just matched its prefix at admission: the session pins over the blocks it matched
    /// are its session's previous turn, now taken over.
    pub(super) fn consume_session_pins(&mut self, sid: SeqId) -> Result<()> {
        let matched = self.reg.seq(sid)?.blocks.live().to_vec();
        if matched.is_empty() {
            return Ok(());
        }
        let g = self.reg.seq(sid)?.group;
        for (blocks, held_since) in self.pins.take_sessions_over(&matched) {
            self.kv.unpin(&blocks);
            self.pins_consumed += 1;
            let grp = self.reg.group_mut(g)?;
            grp.held_since = Some(grp.held_since.map_or(held_since, |h| h.min(held_since)));
        }
        Ok(())
    }
}

#[cfg(test)]
impl Scheduler {
    /// Counts `n` steps as run (the unit tests' running requests have no chunks to step).
    fn run_steps(&mut self, n: u64) {
        self.steps += n;
    }
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
