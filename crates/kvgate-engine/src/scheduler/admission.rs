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
        self.waiting.front()?;
        if !self.cfg.admission.cache_aware {
            return (!next_turns_only).then_some(0);
        }
        let mut warmest = (0, 0);
        let mut starving = None;
        for (i, &g) in self.waiting.iter().take(self.cfg.admission.scan).enumerate() {
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
mod tests {
    use super::*;
    use crate::layout::PinKind;
    use crate::scheduler::{Caps, SchedulerConfig};

    /// Cache-aware with a 1 s bound, or arrival order.
    fn policy(cache_aware: bool) -> Admission {
        if cache_aware {
            Admission::cache_aware(1_000)
        } else {
            Admission::default()
        }
    }

    fn sched(blocks: usize, budget: usize, admission: Admission) -> Scheduler {
        let cfg = SchedulerConfig {
            admission,
            ..SchedulerConfig::new(8, budget, 4)
        };
        Scheduler::new(cfg, blocks)
    }

    /// One turn of a session: `prompt` prefilled, then its state retained and the turn ended.
    fn turn(s: &mut Scheduler, prompt: Vec<u32>) {
        let (_, seq) = s.add_generate(prompt, "", false);
        loop {
            let plan = s.schedule().unwrap();
            if plan.chunks.is_empty() {
                break;
            }
            s.advance_step(&plan.chunks).unwrap();
        }
        s.pin_prefix(seq, usize::MAX, 1_000_000, None, PinKind::Session)
            .unwrap();
        s.finish_seq(seq).unwrap();
    }

    #[test]
    fn a_next_turn_jumps_the_queue_only_when_cache_aware() {
        for (admission, warm_first) in [(Admission::cache_aware(1_000), true), (Admission::default(), false)] {
            let mut s = sched(64, 8, admission);
            turn(&mut s, (0..16).collect());
            let (cold, _) = s.add_generate((100..116).collect(), "", false);
            let (next, _) = s.add_generate((0..20).collect(), "", false);
            let plan = s.schedule().unwrap();
            let first = plan.chunks[0].group;
            assert_eq!(first == next, warm_first, "{admission:?}");
            assert_eq!(first == cold, !warm_first);
            if warm_first {
                // it took its session's retained state over
                assert_eq!((s.pinned_blocks(), s.pins_consumed()), (0, 1));
                assert_eq!(plan.chunks[0].start, 16, "only the new tokens are computed");
            }
            s.check_invariants();
        }
    }

    #[test]
    fn a_cold_prefill_waits_for_retained_states_until_it_starves() {
        for cache_aware in [true, false] {
            let admission = policy(cache_aware);
            let mut s = sched(8, 64, admission);
            turn(&mut s, (0..16).collect()); // 4 blocks retained
            let (other, _) = s.add_generate((50..58).collect(), "", false);
            s.schedule().unwrap(); // it runs and holds 2 blocks: 2 free
            assert!(s.is_running(other));
            let (cold, _) = s.add_generate((100..116).collect(), "", false); // needs 4
            s.schedule().unwrap();
            assert_eq!(s.is_running(cold), !cache_aware, "cache-aware keeps the retained state");
            assert_eq!(s.pinned_blocks(), if cache_aware { 4 } else { 0 });
            if cache_aware {
                s.expire_pins(999);
                s.schedule().unwrap();
                assert!(!s.is_running(cold), "not yet starving");
                s.expire_pins(1_000);
                s.run_steps(2);
                s.schedule().unwrap();
                assert!(s.is_running(cold), "past the bound it goes, releasing the pin");
                assert_eq!((s.pinned_blocks(), s.pins_released_early()), (0, 1));
            }
            s.check_invariants();
        }
    }

    #[test]
    fn a_starving_prefill_takes_only_an_idle_state() {
        // (a bound of 1 s: the idle grace is the bound's when shorter)
        let mut s = sched(12, 64, Admission::cache_aware(1_000));
        turn(&mut s, (0..16).collect()); // a session's state, retained at 0
        let (other, _) = s.add_generate((50..58).collect(), "", false);
        s.schedule().unwrap(); // holds 2: 6 free
        assert!(s.is_running(other));
        let (cold, _) = s.add_generate((100..132).collect(), "", false); // needs 8, arrives at 0
        s.schedule().unwrap();
        assert!(!s.is_running(cold));
        // the session's next turn at 900 jumps the queue, takes its state over and retains the longer one
        s.expire_pins(900);
        turn(&mut s, (0..20).collect());
        assert!(!s.is_running(cold));
        assert_eq!((s.pinned_blocks(), s.pins_consumed()), (5, 1));
        s.expire_pins(1_000);
        s.schedule().unwrap();
        assert!(!s.is_running(cold), "starving, but the state is younger than the grace");
        assert_eq!(s.pinned_blocks(), 5);
        s.expire_pins(1_900);
        s.run_steps(2);
        s.schedule().unwrap();
        assert!(s.is_running(cold), "once the state is idle for the grace");
        assert_eq!(s.pinned_blocks(), 0);
        s.check_invariants();
    }

    #[test]
    fn a_state_idle_for_the_grace_goes_to_a_starving_request_only() {
        let mut s = sched(12, 64, Admission::cache_aware(10_000));
        turn(&mut s, (0..16).collect()); // retained at 0
        let (other, _) = s.add_generate((50..58).collect(), "", false);
        drain(&mut s); // holds 2: 6 free
        let (cold, _) = s.add_generate((100..132).collect(), "", false); // needs 8, arrives at 0
        s.expire_pins(9_999);
        drain(&mut s);
        assert!(!s.is_running(cold), "idle for 10 s, but nothing starves yet");
        s.expire_pins(10_000);
        drain(&mut s);
        assert!(
            !s.is_running(cold),
            "no step has run since it was retained: its next turn may come"
        );
        s.run_steps(2);
        drain(&mut s);
        assert!(
            s.is_running(cold) && s.is_running(other),
            "starving: an idle state gives way"
        );
        assert_eq!(s.pinned_blocks(), 0);
        s.check_invariants();
    }

    #[test]
    fn a_starving_prefill_does_not_hold_a_next_turn_back() {
        let mut s = sched(12, 64, Admission::cache_aware(1_000));
        turn(&mut s, (0..16).collect()); // a session's state, retained at 0: 4 blocks
        let (other, _) = s.add_generate((50..58).collect(), "", false);
        s.schedule().unwrap(); // holds 2: 6 free
        let (cold, _) = s.add_generate((100..132).collect(), "", false); // needs 8, arrives at 0
        s.expire_pins(900);
        turn(&mut s, (0..20).collect()); // its next turn at 900 goes first and retains 5 blocks
        assert!(s.is_running(other) && !s.is_running(cold));
        assert_eq!((s.pinned_blocks(), s.pins_consumed()), (5, 1));
        s.expire_pins(1_000); // the cold one starves at the front; the state is young
        let (next, _) = s.add_generate((0..24).collect(), "", false);
        s.schedule().unwrap();
        assert!(s.is_running(next), "the next turn goes past the starving one");
        assert!(!s.is_running(cold));
        assert_eq!(s.pins_consumed(), 2);
        s.check_invariants();
    }

    #[test]
    fn with_nothing_else_running_retained_states_give_way_after_the_grace() {
        let mut s = sched(8, 64, Admission::cache_aware(1_000_000));
        turn(&mut s, (0..16).collect());
        let (cold, _) = s.add_generate((100..120).collect(), "", false); // needs 5 of 8, 4 free
        s.expire_pins(999);
        s.schedule().unwrap();
        assert!(
            !s.is_running(cold),
            "the state is younger than the grace: its next step may come"
        );
        assert_eq!(s.pinned_blocks(), 4);
        s.expire_pins(1_000);
        s.schedule().unwrap();
        assert!(s.is_running(cold));
        assert_eq!(s.pinned_blocks(), 0);
        s.check_invariants();
    }

    /// Two sessions' next turns wait, each needing blocks the other's retained state holds, and nothing
    /// runs: past the grace the one picked takes the other's state instead of both waiting until the
    /// pins expire (a stall the agents' load test hit once in many runs).
    #[test]
    fn next_turns_that_wait_on_each_others_states_do_not_stall() {
        let mut s = sched(8, 64, Admission::cache_aware(1_000_000));
        turn(&mut s, (0..12).collect()); // 3 blocks retained
        turn(&mut s, (100..112).collect()); // 3 more: 2 free
        let (a, _) = s.add_generate((0..24).collect(), "", false); // 3 matched, 3 more needed
        let (b, _) = s.add_generate((100..124).collect(), "", false);
        s.expire_pins(999);
        s.schedule().unwrap();
        assert!(!s.is_running(a) && !s.is_running(b), "within the grace both states stay");
        assert_eq!(s.pinned_blocks(), 6);
        s.expire_pins(1_000);
        s.schedule().unwrap();
        assert!(s.is_running(a), "the first next turn runs on its own state");
        assert!(!s.is_running(b));
        assert_eq!((s.pins_consumed(), s.pins_released_early()), (1, 1));
        s.check_invariants();
    }

    /// Runs every planned chunk until a plan is empty.
    fn drain(s: &mut Scheduler) {
        loop {
            let plan = s.schedule().unwrap();
            if plan.chunks.is_empty() {
                break;
            }
            s.advance_step(&plan.chunks).unwrap();
        }
    }

    #[test]
    fn a_cold_prompt_starts_only_when_all_of_it_fits_beside_retained_states() {
        for cache_aware in [true, false] {
            let admission = policy(cache_aware);
            // chunks of 8 tokens (2 blocks); a session retains 4 blocks; another request holds 2
            let mut s = sched(16, 8, admission);
            turn(&mut s, (0..16).collect());
            let (other, _) = s.add_generate((50..58).collect(), "", false);
            drain(&mut s);
            assert!(s.is_running(other));
            // 10 free: a 12-block prompt's first chunk fits, the whole of it does not
            let (cold, _) = s.add_generate((100..148).collect(), "", false);
            drain(&mut s);
            assert_eq!(s.is_running(cold), !cache_aware);
            // FIFO took the retained state as the prompt grew; cache-aware kept it
            assert_eq!(s.pinned_blocks(), if cache_aware { 4 } else { 0 });
            s.check_invariants();
        }
        // a 10-block prompt fits whole and starts at once
        let mut s = sched(16, 8, Admission::cache_aware(1_000));
        turn(&mut s, (0..16).collect());
        let (other, _) = s.add_generate((50..58).collect(), "", false);
        drain(&mut s);
        let (cold, _) = s.add_generate((100..140).collect(), "", false);
        drain(&mut s);
        assert!(s.is_running(other) && s.is_running(cold));
        assert_eq!(s.pinned_blocks(), 4);
        s.check_invariants();
    }

    #[test]
    fn the_retention_cap_spares_states_younger_than_the_bound() {
        for cache_aware in [true, false] {
            let admission = policy(cache_aware);
            let cfg = SchedulerConfig {
                admission,
                caps: Caps {
                    max_retained_blocks: Some(6),
                    ..Caps::default()
                },
                ..SchedulerConfig::new(8, 64, 4)
            };
            let mut s = Scheduler::new(cfg, 16);
            turn(&mut s, (0..16).collect()); // 4 blocks at 0
            turn(&mut s, (100..116).collect()); // 4 more at 0: over the cap
            assert_eq!(s.pinned_blocks(), if cache_aware { 8 } else { 4 });
            s.expire_pins(1_000);
            turn(&mut s, (200..216).collect()); // at 1,000 both older ones are as old as the bound
            assert_eq!(s.pinned_blocks(), 4);
            s.check_invariants();
        }
    }

    #[test]
    fn a_next_turn_does_not_wait_behind_a_running_prefill() {
        for cache_aware in [true, false] {
            let admission = policy(cache_aware);
            let mut s = sched(64, 8, admission); // 8 tokens a step
            turn(&mut s, (0..16).collect());
            let (cold, _) = s.add_generate((100..140).collect(), "", false);
            s.schedule().unwrap(); // the cold prompt runs, its first chunk taking the whole budget
            assert!(s.is_running(cold));
            let (next, _) = s.add_generate((0..18).collect(), "", false);
            let plan = s.schedule().unwrap();
            let groups: Vec<_> = plan.chunks.iter().map(|c| c.group).collect();
            assert_eq!(groups.first() == Some(&next), cache_aware, "{groups:?}");
            s.check_invariants();
        }
    }

    #[test]
    fn a_next_turn_waits_for_room_beside_a_running_prefill_and_keeps_its_state() {
        // 18 blocks: a session retains 4; a cold prompt takes the other 14 (8 tokens a step)
        let mut s = sched(18, 8, Admission::cache_aware(1_000));
        turn(&mut s, (0..16).collect());
        let (cold, cold_seq) = s.add_generate((100..156).collect(), "", false);
        let plan = s.schedule().unwrap();
        s.advance_step(&plan.chunks).unwrap();
        assert!(s.is_running(cold));
        // every free block is the cold prompt's: the next turn (one new block) waits, its state kept
        let (next, _) = s.add_generate((0..20).collect(), "", false);
        let (fresh, _) = s.add_generate((200..204).collect(), "", false);
        s.expire_pins(5_000);
        let plan = s.schedule().unwrap();
        assert!(!s.is_running(next) && !s.is_running(fresh));
        assert_eq!(s.pinned_blocks(), 4);
        s.advance_step(&plan.chunks).unwrap();
        drain(&mut s);
        assert_eq!(s.pinned_blocks(), 4, "the cold prompt grew into its own room only");
        s.finish_seq(cold_seq).unwrap();
        drain(&mut s);
        assert!(s.is_running(next));
        assert_eq!(s.pins_consumed(), 1, "the next turn took its state over");
        s.check_invariants();
    }

    #[test]
    fn a_session_that_never_pauses_gives_way_to_a_starving_request_at_a_turn_end() {
        let mut s = sched(12, 64, Admission::cache_aware(1_000));
        turn(&mut s, (0..16).collect()); // held since 0: 4 blocks
        let (other, _) = s.add_generate((50..58).collect(), "", false);
        drain(&mut s); // holds 2: 6 free
        assert!(s.is_running(other));
        let (cold, _) = s.add_generate((100..132).collect(), "", false); // needs 8, arrives at 0
                                                                         // the session takes a turn every 900 ms: its pin is always young
        for (k, at) in [900u64, 1_800, 2_700, 3_600].into_iter().enumerate() {
            s.expire_pins(at);
            turn(&mut s, (0..(20 + 4 * k as u32)).collect());
            drain(&mut s);
            assert!(!s.is_running(cold), "at {at} the state is younger than the bound");
        }
        // at 4,000 it has been held four times the bound: it gives way, though taken at 3,600
        s.expire_pins(4_000);
        drain(&mut s);
        assert!(s.is_running(cold));
        s.check_invariants();
    }
}
