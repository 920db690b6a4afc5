//! Cache-aware admission, for agents under load: a session's next turn jumps the queue (its state is
//! in the cache now, and may not be later), then a request that waited past the bound, then the one
//! whose prefix is warmest; and a request may only take blocks that sessions retain (their pins) when
//! nothing else runs or it has waited past the starvation bound — so a cold prefill does not evict
//! the state of a session that is mid-turn. When a next turn is admitted it takes its session's
//! retained blocks over (the pin is consumed; the turn retains again at its own end). A starving
//! request may only take a retained state older than the bound: a session that has just finished a
//! turn keeps its state for the bound whatever waits (so a request waits at most about twice the
//! bound). FIFO admission is the other policy (and the scheduler's default; the engine turns this
//! one on).

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
}

impl Default for Admission {
    /// Arrival order.
    fn default() -> Admission {
        Admission {
            cache_aware: false,
            max_wait_ms: 30_000,
            scan: 128,
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
    /// Sets the admission policy.
    pub fn set_admission(&mut self, a: Admission) {
        self.admission = a;
    }

    /// The admission policy.
    pub fn admission(&self) -> Admission {
        self.admission
    }

    /// Whether `g` has waited past the starvation bound.
    pub(super) fn starving(&self, g: GroupId) -> bool {
        self.reg
            .group(g)
            .is_ok_and(|grp| self.now.saturating_sub(grp.arrived) >= self.admission.max_wait_ms)
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
    pub(super) fn pick_waiting(&self) -> Option<usize> {
        self.waiting.front()?;
        if !self.admission.cache_aware {
            return Some(0);
        }
        let mut warmest = (0, 0);
        let mut starving = None;
        for (i, &g) in self.waiting.iter().take(self.admission.scan).enumerate() {
            let (warm, in_tier) = self.warm_blocks(g);
            if !warm.is_empty() && self.pins.any_session_over(&warm) {
                return Some(i);
            }
            if starving.is_none() && self.starving(g) {
                starving = Some(i);
            }
            if warm.len() + in_tier > warmest.1 {
                warmest = (i, warm.len() + in_tier);
            }
        }
        Some(starving.unwrap_or(warmest.0))
    }

    /// Releases a pin so that `g` can be admitted; false when none may go. Under FIFO, or when nothing
    /// else holds blocks (nothing else would ever free them), the oldest pin; cache-aware, only for a
    /// starving group, and only a pin taken at least the bound ago.
    pub(super) fn release_pin_for(&mut self, g: GroupId, nothing_else: bool) -> bool {
        if !self.admission.cache_aware || nothing_else {
            return self.release_oldest_pin();
        }
        if !self.starving(g) {
            return false;
        }
        let cutoff = self.now.saturating_sub(self.admission.max_wait_ms);
        let old = self.pins.take_oldest_since(cutoff);
        self.release_early(old)
    }

    /// A sequence just matched its prefix at admission: the session pins over the blocks it matched
    /// are its session's previous turn, now taken over.
    pub(super) fn consume_session_pins(&mut self, sid: SeqId) -> Result<()> {
        let matched = self.reg.seq(sid)?.blocks.live().to_vec();
        if matched.is_empty() {
            return Ok(());
        }
        for blocks in self.pins.take_sessions_over(&matched) {
            self.kv.unpin(&blocks);
            self.pins_consumed += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PinKind;
    use crate::scheduler::SchedulerConfig;

    fn sched(blocks: usize, budget: usize, admission: Admission) -> Scheduler {
        let cfg = SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: budget,
            block_size: 4,
            prefix_caching: true,
            release_window: None,
        };
        let mut s = Scheduler::new(cfg, blocks);
        s.set_admission(admission);
        s
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
            let admission = if cache_aware {
                Admission::cache_aware(1_000)
            } else {
                Admission::default()
            };
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
                s.schedule().unwrap();
                assert!(s.is_running(cold), "past the bound it goes, releasing the pin");
                assert_eq!((s.pinned_blocks(), s.pins_released_early()), (0, 1));
            }
            s.check_invariants();
        }
    }

    #[test]
    fn a_starving_prefill_takes_only_a_state_older_than_the_bound() {
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
        assert!(!s.is_running(cold), "starving, but the state is younger than the bound");
        assert_eq!(s.pinned_blocks(), 5);
        s.expire_pins(1_900);
        s.schedule().unwrap();
        assert!(s.is_running(cold), "once the state is as old as the bound");
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
    fn with_nothing_else_running_retained_states_give_way() {
        let mut s = sched(8, 64, Admission::cache_aware(1_000_000));
        turn(&mut s, (0..16).collect());
        let (cold, _) = s.add_generate((100..120).collect(), "", false); // needs 5 of 8, 4 free
        s.schedule().unwrap();
        assert!(s.is_running(cold));
        assert_eq!(s.pinned_blocks(), 0);
        s.check_invariants();
    }
}
