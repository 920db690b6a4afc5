//! Deterministic cases of the scheduler, the KV manager and the pool together, beside the randomized
//! ones of `scheduler_fuzz.rs`: prefix hits across groups, a windowed sequence's table.

use crate::scheduler::{Logits, Scheduler, SchedulerConfig};

#[test]
fn prefix_hits_happen() {
    let cfg = SchedulerConfig::new(8, 64, 4);
    let mut s = Scheduler::new(cfg, 32);
    let prompt: Vec<u32> = (0..21).collect();
    let (g1, s1) = s.add_generate(prompt.clone(), "", false);
    let p = s.schedule().unwrap();
    for c in &p.chunks {
        s.advance(c).unwrap();
    }
    s.finish_seq(s1).unwrap();
    assert!(!s.has_group(g1));
    let (g2, s2) = s.add_generate(prompt.clone(), "", false);
    let p = s.schedule().unwrap();
    assert_eq!(p.chunks[0].start, 20, "5 full blocks hit, last token recomputed");
    assert_eq!(s.usage(g2).cached_tokens, 20);
    s.advance(&p.chunks[0]).unwrap();
    s.finish_seq(s2).unwrap();
    let (g3, _) = s.add_generate(prompt, "other-tenant", false);
    let p = s.schedule().unwrap();
    assert_eq!(p.chunks[0].start, 0, "a different cache_salt never hits");
    assert_eq!(s.usage(g3).cached_tokens, 0);
}

#[test]
fn a_windowed_sequence_holds_only_its_window() {
    let cfg = SchedulerConfig {
        release_window: Some(10),
        ..SchedulerConfig::new(4, 16, 4)
    };
    // 8 blocks = 32 tokens of cache, a 40-token prompt and 60 generated tokens
    let mut s = Scheduler::new(cfg, 8);
    let (g, seq) = s.add_generate((0..40).collect(), "", false);
    let mut most = 0;
    for step in 0..200 {
        let p = s.schedule().unwrap();
        assert!(p.failed.is_empty() && p.preempted.is_empty(), "step {step}");
        for c in &p.chunks {
            s.advance(c).unwrap();
            if c.at_end {
                s.append_token(c.seq, 7).unwrap();
            }
        }
        s.check_invariants();
        most = most.max(s.pool().counts().used);
        if s.seq(seq).unwrap().tokens.len() == 100 {
            break;
        }
    }
    assert_eq!(s.seq(seq).unwrap().tokens.len(), 100);
    // the window (10) plus a 16-token chunk spans at most 8 blocks of 4; never the whole 100 tokens
    assert!(most <= 8, "{most} blocks held at once");
    s.finish_group(g);
    assert_eq!(s.pool().counts().used, 0);
}

/// Runs one decision to its end (each read finishes at its logits); returns the tokens computed.
fn run_decision(s: &mut Scheduler, prompts: Vec<Vec<u32>>) -> usize {
    let g = s.add_decision(prompts, "");
    let mut computed = 0;
    while s.has_group(g) {
        let plan = s.schedule().unwrap();
        computed += plan.num_tokens();
        for c in &plan.chunks {
            s.advance(c).unwrap();
        }
        for c in plan.chunks {
            if c.logits == Logits::Last {
                s.finish_seq(c.seq).unwrap();
            }
        }
    }
    computed
}

#[test]
fn decision_computes_the_shared_prefix_once() {
    let cfg = SchedulerConfig::new(64, 4096, 16);
    let mut s = Scheduler::new(cfg, 256);
    let state: Vec<u32> = (0..2000).map(|i| i % 97).collect();
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|q| {
            let mut p = state.clone();
            p.extend([1000 + q, 2000, 3000 + q]);
            p
        })
        .collect();
    let computed = run_decision(&mut s, prompts.clone());
    assert_eq!(computed, 2000 + 8 * 3, "state once plus the suffixes");
    // warm: only the partial tail of the state and the suffixes
    let computed = run_decision(&mut s, prompts);
    assert_eq!(computed, (8 * 3));
    assert_eq!(s.pool().counts().used, 0);
}
