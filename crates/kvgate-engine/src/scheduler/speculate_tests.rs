//! The scheduler's speculation: proposals past the batch, a resting draft, token trees against a
//! single path.

use std::collections::HashMap;

use super::trimmed;
use crate::block_pool::BlockPool;
use crate::registry::SeqId;
use crate::scheduler::{Logits, Scheduler, SchedulerConfig, SpecPlan, StepUpdate};
use crate::speculation::{SpecConfig, SpecMethod};

#[test]
fn a_proposal_that_spills_a_row_or_two_into_another_read_is_trimmed() {
    // 8 rows a read: 9 or 10 rows are trimmed to 8, 11 rows are not, 17 to 16
    assert_eq!(
        [7, 8, 9, 10, 15, 16].map(|n| trimmed(n, Some(8))),
        [7, 7, 7, 10, 15, 15]
    );
    // 4 rows a read: a fifth row is trimmed, a sixth is not
    assert_eq!([3, 4, 5, 8].map(|n| trimmed(n, Some(4))), [3, 3, 5, 7]);
    assert_eq!(trimmed(8, None), 8);
    assert_eq!(trimmed(0, Some(8)), 0);
}

/// Past `max_batch`, a sequence whose proposals are kept goes on speculating, and one whose proposals
/// are rejected stops after a verification or two and tries again only now and then (its keep rate
/// creeps back as it decodes).
#[test]
fn past_the_batch_a_sequence_speculates_while_it_keeps_its_proposals() {
    let spec = SpecConfig {
        method: SpecMethod::Ngram,
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 1,
        max_batch: 1,
        draft_p_min: 0.0,
        draft_window: crate::speculation::DEFAULT_DRAFT_WINDOW,
        draft_share: crate::speculation::DRAFT_PROMPT_SHARE,
        tree_branches: 1,
    };
    let mut cfg = SchedulerConfig {
        prefix_caching: false,
        ..SchedulerConfig::new(8, 64, 4)
    };
    cfg.speculation = Some(SpecPlan::new(spec));
    let mut s = Scheduler::with_pool(cfg, BlockPool::new(96));
    // contexts of 1s and 2s: prompt lookup always finds a match
    let seqs: Vec<SeqId> = (0..3)
        .map(|_| s.add_generate(vec![1, 2, 1, 2, 1, 2, 1], "", false).1)
        .collect();
    let keeper = seqs[0];
    let mut proposing_steps: HashMap<SeqId, usize> = HashMap::new();
    for _ in 0..40 {
        let plan = s.schedule().unwrap();
        for c in &plan.chunks {
            s.advance(c).unwrap();
        }
        for c in plan.chunks {
            if !c.at_end || c.logits == Logits::None {
                continue;
            }
            let mut u = StepUpdate::default();
            if c.draft > 0 {
                *proposing_steps.entry(c.seq).or_default() += 1;
                // the keeper's verifier agrees with every proposed token, the others' with none
                let kept = if c.seq == keeper { c.draft } else { 0 };
                for i in 0..kept {
                    u.append(c.seq, c.tokens[1 + i]);
                }
                let own = if c.seq == keeper { 1 } else { 3 - c.tokens[1] };
                u.append(c.seq, own);
                u.accept(c.seq, kept);
            } else {
                u.append(c.seq, 1 + (c.start % 2) as u32);
            }
            u.spec_limit(c.seq, 64);
            s.update_from_output(u).unwrap();
        }
    }
    let keeper_steps = proposing_steps.get(&keeper).copied().unwrap_or(0);
    assert!(
        keeper_steps >= 20,
        "the keeper speculates past the batch: {proposing_steps:?}"
    );
    for &other in &seqs[1..] {
        let n = proposing_steps.get(&other).copied().unwrap_or(0);
        assert!(
            n >= 1 && n * 3 <= 40,
            "a rejected sequence tries now and then: {proposing_steps:?}"
        );
    }
    s.check_invariants();
}

/// A sequence is asked for a draft at every decode step, whether its draft proposed or doubted
/// its first token last time, and what it proposed is verified in the next step's chunk.
#[test]
fn a_doubting_draft_is_asked_again_at_the_next_step() {
    let spec = SpecConfig {
        method: SpecMethod::DraftModel,
        num_speculative_tokens: 4,
        prompt_lookup_min: 1,
        prompt_lookup_max: 1,
        max_batch: 4,
        draft_p_min: 0.0,
        draft_window: crate::speculation::DEFAULT_DRAFT_WINDOW,
        draft_share: crate::speculation::DRAFT_PROMPT_SHARE,
        tree_branches: 1,
    };
    let mut cfg = SchedulerConfig {
        prefix_caching: false,
        ..SchedulerConfig::new(4, 64, 4)
    };
    cfg.speculation = Some(SpecPlan::new(spec));
    let mut s = Scheduler::with_pool(cfg, BlockPool::new(64));
    let (_, seq) = s.add_generate(vec![5, 6, 7], "", false);
    let (mut asked_at, mut verified) = (vec![], vec![]);
    for step in 0..40 {
        let asked = s.draft_asks().iter().any(|a| a.seq == seq && a.k > 0);
        if asked {
            asked_at.push(step);
            // the draft doubts everything until step 25, then proposes
            let proposal = if step >= 25 { vec![1] } else { vec![] };
            s.set_drafted(seq, proposal).unwrap();
        }
        let plan = s.schedule().unwrap();
        if plan.chunks.iter().any(|c| c.seq == seq && c.draft > 0) {
            verified.push(step);
        }
        for c in &plan.chunks {
            s.advance(c).unwrap();
        }
        for c in plan.chunks {
            if c.at_end && c.logits != Logits::None {
                let mut u = StepUpdate::default();
                for i in 0..c.draft {
                    u.append(c.seq, c.tokens[1 + i]);
                }
                u.append(c.seq, 2);
                u.accept(c.seq, c.draft);
                u.spec_limit(c.seq, 64);
                s.update_from_output(u).unwrap();
            }
        }
    }
    // asked at every decode step from the first (the prompt's step) on; proposals verified from
    // step 25 on, and only then
    assert_eq!(asked_at, (1..40).collect::<Vec<_>>());
    assert_eq!(verified, (25..40).collect::<Vec<_>>());
}

/// Prompt lookup as a single path and as token trees on a text that copies from one of several
/// places, verified by the text itself (the scheduler's whole path: proposals, layout, kept paths).
mod trees {
    use crate::block_pool::BlockPool;
    use crate::scheduler::{Logits, Scheduler, SchedulerConfig, SpecPlan, StepUpdate};
    use crate::speculation::{SpecConfig, SpecMethod};

    /// Verifies `all[plen..]` after prompt `all[..plen]`: (verified steps, rows, tokens kept).
    pub(super) fn run(all: &[u32], plen: usize, branches: usize) -> (usize, usize, usize) {
        let spec = SpecConfig {
            method: SpecMethod::Ngram,
            num_speculative_tokens: 8,
            prompt_lookup_min: 2,
            prompt_lookup_max: 5,
            max_batch: 64,
            draft_p_min: 0.0,
            draft_window: crate::speculation::DEFAULT_DRAFT_WINDOW,
            draft_share: crate::speculation::DRAFT_PROMPT_SHARE,
            tree_branches: branches,
        };
        let mut cfg = SchedulerConfig {
            prefix_caching: false,
            ..SchedulerConfig::new(8, 8192, 16)
        };
        let mut plan = SpecPlan::new(spec);
        plan.rows_per_weight_read = Some(8);
        plan.tree = Some(kvgate_backend::TreeGrain {
            lanes: 8,
            partition: 256,
        });
        cfg.speculation = Some(plan);
        let mut s = Scheduler::with_pool(cfg, BlockPool::new(2048));
        let (_, seq) = s.add_generate(all[..plen].to_vec(), "", false);
        let (mut steps, mut rows, mut emitted, mut kept) = (0, 0, 0, 0);
        while emitted < all.len() - plen {
            let p = s.schedule().unwrap();
            for c in &p.chunks {
                s.advance(c).unwrap();
            }
            for c in p.chunks {
                if !c.at_end || c.logits == Logits::None {
                    continue;
                }
                let at0 = plen + emitted;
                let mut u = StepUpdate::default();
                let mut path = vec![];
                let mut at = 0;
                while let Some(&tok) = all.get(at0 + path.len()) {
                    u.append(seq, tok);
                    emitted += 1;
                    match c.next_row(at, tok) {
                        Some(r) => {
                            path.push(r);
                            at = r;
                        }
                        None => break,
                    }
                }
                if c.draft > 0 {
                    steps += 1;
                    rows += c.len;
                    kept += path.len();
                    u.accept_path(seq, path);
                }
                u.spec_limit(seq, 1000);
                s.update_from_output(u).unwrap();
                let _ = s.take_slot_moves();
            }
        }
        (steps, rows, kept)
    }

    /// Lines alike but for three tokens, the output copying them in another order: a single path
    /// copies the most recent match and is rejected where the lines differ; a tree holds other
    /// matches too and keeps the right one where it has room — more tokens per verified step, within
    /// one read of the weights.
    #[test]
    fn a_tree_keeps_the_older_copy_a_single_path_misses() {
        // a line: 10 11 (a) 12 13 (b) 14 15 (c) 16; the prompt holds 12 of them, the output copies them
        let line = |i: u32| vec![10, 11, 20 + i % 3, 12, 13, 30 + i % 4, 14, 15, 40 + i % 5, 16];
        let mut all: Vec<u32> = (0..12).flat_map(line).collect();
        let plen = all.len();
        for i in [7, 2, 11, 0, 5, 9, 3, 8, 1, 6, 10, 4] {
            all.extend(line(i));
        }
        let (s1, _, k1) = run(&all, plen, 1);
        let (s4, r4, k4) = run(&all, plen, 4);
        let (per1, per4) = (k1 as f64 / s1 as f64, k4 as f64 / s4 as f64);
        // (measured: 2.08 and 2.24 tokens kept per verified step)
        assert!(
            per4 > per1 * 1.05,
            "kept per step: single path {per1:.2}, tree {per4:.2}"
        );
        assert!(
            r4 as f64 / s4 as f64 <= 8.0,
            "within one weight read: {r4} rows in {s4} steps"
        );
    }
}
