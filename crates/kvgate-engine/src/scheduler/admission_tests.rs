//! Tests of `admission.rs`.

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
    assert!(
        !s.is_running(a) && !s.is_running(b),
        "within the grace both states stay"
    );
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
