//! The drafter's tests: proposals are the greedy continuation whatever came before, a prompt followed
//! in chunks, the window, the confidence cut-off, a cache too small.

use super::*;
use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A drafter over the tiny model that reads whole prompts and never ends a proposal early.
fn drafter(blocks: usize) -> Drafter {
    drafter_with(blocks, 0.0, (usize::MAX, 10))
}

fn drafter_with(blocks: usize, p_min: f32, window: (usize, usize)) -> Drafter {
    let m = tiny_model(TinySpec::default()).unwrap();
    let vocab = m.tokenizer.vocab_size();
    let cache = CpuCache {
        block_size: 4,
        num_blocks: blocks,
        ..Default::default()
    };
    Drafter::new(
        Box::new(CpuBackend::with_cache(m.model, cache).unwrap()),
        vocab,
        7,
        p_min,
        window,
    )
}

fn ask<'a>(seq: u64, tokens: &'a [u32], k: usize, salt: &'a str) -> DraftAsk<'a> {
    DraftAsk {
        seq: SeqId::test(seq),
        tokens,
        upto: tokens.len(),
        k,
        salt,
    }
}

/// Whatever was kept, rejected, forgotten and asked again, a proposal is the draft's greedy
/// continuation of the sequence's tokens as a drafter that never saw them computes it: the
/// cache holds exactly the sequence's K/V (a stale row from a rejected proposal would change it).
#[test]
fn proposals_are_the_greedy_continuation_of_the_tokens_whatever_came_before() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut d = drafter(256);
    let salts = ["", "tenant"];
    let mut seqs: Vec<Vec<u32>> = (0..3)
        .map(|i| (0..5 + 3 * i).map(|_| rng.random_range(0..300)).collect())
        .collect();
    let mut kept_some = false;
    for round in 0..40 {
        // every few rounds one sequence sits out (forgotten, then found in the prefix cache)
        let out = round % 5;
        let ks: Vec<usize> = (0..3).map(|_| rng.random_range(1..6)).collect();
        let live: Vec<usize> = (0..3).filter(|&i| i != out).collect();
        let asks: Vec<DraftAsk> = live
            .iter()
            .map(|&i| ask(i as u64, &seqs[i], ks[i], salts[i % 2]))
            .collect();
        // the sequence that sits out is forgotten (as the engine forgets one that stops running)
        d.retain(|s| s != SeqId::test(out as u64));
        let got = d.propose(&asks).unwrap();
        assert_eq!(
            got.len(),
            asks.len(),
            "every ask fits the cache: round {round}, {:?}",
            d.stats()
        );
        drop(asks);
        for (sid, proposal) in got {
            let i = live.iter().copied().find(|&i| SeqId::test(i as u64) == sid).unwrap();
            let fresh = drafter(256).propose(&[ask(9, &seqs[i], ks[i], "")]).unwrap();
            assert_eq!(proposal, fresh[0].1, "round {round}, sequence {i}");
            // the target keeps a random prefix of it, then samples a token of its own
            let keep = rng.random_range(0..=proposal.len());
            kept_some |= keep > 0;
            seqs[i].extend_from_slice(&proposal[..keep]);
            let next = loop {
                let t = rng.random_range(0..300);
                if proposal.get(keep) != Some(&t) {
                    break t;
                }
            };
            seqs[i].push(next);
        }
    }
    assert!(kept_some);
    assert!(
        d.stats().cached_tokens > 0,
        "forgotten sequences were found again: {:?}",
        d.stats()
    );
    assert!(d.stats().held_blocks > 0);
    d.retain(|_| false);
    assert_eq!(d.stats().held_blocks, 0, "nothing running, nothing held");
}

/// A prompt followed chunk by chunk while the target computes it is ready when decoding starts:
/// the first proposal costs one row past it, and it is the fresh drafter's.
#[test]
fn a_prompt_followed_in_chunks_is_ready_when_decoding_starts() {
    let mut d = drafter(64);
    let tokens: Vec<u32> = (0..30).map(|i| (i * 37 % 300) as u32).collect();
    for upto in [8, 16, 24, 29] {
        let a = DraftAsk {
            upto,
            ..ask(1, &tokens, 0, "")
        };
        assert!(
            d.propose(&[a]).unwrap().is_empty(),
            "nothing proposed while computing the prompt"
        );
    }
    assert_eq!(d.stats().rows, 29);
    let got = d.propose(&[ask(1, &tokens, 3, "")]).unwrap();
    assert_eq!(d.stats().rows, 29 + 1 + 2, "one row caught up, two proposals fed back");
    let fresh = drafter(64).propose(&[ask(2, &tokens, 3, "")]).unwrap();
    assert_eq!(got, vec![(SeqId::test(1), fresh[0].1.clone())]);
    assert_eq!(got[0].1.len(), 3);
}

/// A cache too small for a sequence proposes nothing for it and holds nothing for it.
#[test]
fn a_sequence_that_does_not_fit_gets_no_proposal() {
    let mut d = drafter(3);
    let long: Vec<u32> = (0..20).collect();
    let short: Vec<u32> = (0..5).collect();
    let got = d.propose(&[ask(1, &long, 4, ""), ask(2, &short, 2, "")]).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, SeqId::test(2));
    assert_eq!(got[0].1.len(), 2);
    assert_eq!(d.stats().held_blocks, 2);
    d.reset();
    assert_eq!(d.stats().held_blocks, 0);
}

/// A short prompt (read whole, more than its share) is not followed while the target computes it:
/// the draft computes it when it first drafts, so the time to the first token is the target's.
#[test]
fn a_short_prompt_is_read_after_the_first_token() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 31 % 300) as u32).collect();
    let mut d = drafter_with(64, 0.0, (1024, crate::speculation::DRAFT_PROMPT_SHARE));
    for upto in [16, 32, 40] {
        let a = DraftAsk {
            upto,
            ..ask(1, &tokens, 0, "")
        };
        assert!(d.propose(&[a]).unwrap().is_empty());
    }
    assert_eq!(d.stats().rows, 0, "nothing computed during the prompt");
    let got = d.propose(&[ask(1, &tokens, 3, "")]).unwrap();
    assert_eq!(d.stats().rows, 40 + 2, "the whole prompt, then two proposals fed back");
    let fresh = drafter(64).propose(&[ask(2, &tokens, 3, "")]).unwrap();
    assert_eq!(got, vec![(SeqId::test(1), fresh[0].1.clone())]);
}

/// A long prompt followed chunk by chunk costs the draft only its window: the rows before it are
/// never computed, and the first proposal is a fresh drafter's over the window's tokens alone.
#[test]
fn a_long_prompt_costs_the_draft_its_window() {
    let tokens: Vec<u32> = (0..400).map(|i| (i * 53 % 300) as u32).collect();
    let window = (1024, crate::speculation::DRAFT_PROMPT_SHARE);
    let start = crate::speculation::draft_start(tokens.len(), window.0, window.1);
    assert_eq!(start, 400 - 80, "a fifth of the prompt");
    let mut d = drafter_with(128, 0.0, window);
    for upto in (16..400).step_by(16).chain([399]) {
        let a = DraftAsk {
            upto,
            ..ask(1, &tokens, 0, "")
        };
        assert!(d.propose(&[a]).unwrap().is_empty());
    }
    assert_eq!(d.stats().rows as usize, 399 - start, "only the window's rows");
    let got = d.propose(&[ask(1, &tokens, 3, "")]).unwrap();
    let fresh = drafter(128).propose(&[ask(2, &tokens[start..], 3, "")]).unwrap();
    assert_eq!(got, vec![(SeqId::test(1), fresh[0].1.clone())]);
}

/// A proposal ends at the first token the draft doubts: with a higher `draft_p_min` it is a prefix
/// of the proposal without one, and at 1 (no token is that sure) nothing is proposed.
#[test]
fn a_proposal_ends_where_the_draft_doubts_it() {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 29 % 300) as u32).collect();
    let full = drafter(64).propose(&[ask(1, &tokens, 6, "")]).unwrap();
    assert_eq!(full[0].1.len(), 6);
    let mut d = drafter_with(64, 1.0, (usize::MAX, 10));
    let none = d.propose(&[ask(1, &tokens, 6, "")]).unwrap();
    assert!(none.iter().all(|(_, p)| p.is_empty()), "{none:?}");
    assert_eq!(d.stats().doubted, 1);
    for p_min in [0.01, 0.05, 0.2] {
        let got = drafter_with(64, p_min, (usize::MAX, 10))
            .propose(&[ask(1, &tokens, 6, "")])
            .unwrap();
        let p = got.first().map_or(&[][..], |(_, p)| p.as_slice());
        assert_eq!(p, &full[0].1[..p.len()], "p_min {p_min}");
    }
}

/// A proposal is as long as the draft's probability of all of it stays at `draft_p_min` or above:
/// the product of its tokens' probabilities (each computed here by the same model, fresh), not
/// each token's alone.
#[test]
fn a_proposal_ends_where_the_product_of_its_probabilities_falls_below_p_min() {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 29 % 300) as u32).collect();
    let full = drafter(64).propose(&[ask(1, &tokens, 6, "")]).unwrap()[0].1.clone();
    assert_eq!(full.len(), 6);
    // each proposed token's probability, from a fresh pass of the tiny model over what precedes it
    let m = tiny_model(TinySpec::default()).unwrap();
    let cache = CpuCache {
        block_size: 4,
        num_blocks: 64,
        ..Default::default()
    };
    let mut be = CpuBackend::with_cache(m.model, cache).unwrap();
    let probs: Vec<f32> = (0..full.len())
        .map(|j| {
            let seq: Vec<u32> = tokens.iter().chain(&full[..j]).copied().collect();
            let mut b = Batch::default();
            for (p, &t) in seq.iter().enumerate() {
                b.tokens.push(t);
                b.positions.push(p as u32);
                b.slots.push(p);
                b.seq_of_row.push(0);
            }
            b.tables.push((0..seq.len().div_ceil(4) as u32).collect());
            b.outputs.push(Output {
                row: seq.len() - 1,
                want: Want::Logits,
            });
            let out = be.forward(&b).unwrap();
            assert_eq!(argmax(&out.logits), full[j], "the proposal is the greedy continuation");
            top_probability(&out.logits, full[j])
        })
        .collect();
    let products: Vec<f32> = probs
        .iter()
        .scan(1.0f32, |acc, &p| {
            *acc *= p;
            Some(*acc)
        })
        .collect();
    // a cut-off just under the product after 1, 2 … tokens keeps exactly that many, even where the
    // next token alone is above it
    for n in 1..full.len() {
        let p_min = products[n - 1] * 0.999;
        if products[n] >= p_min {
            continue; // (a certain next token: the same product)
        }
        let got = drafter_with(64, p_min, (usize::MAX, 10))
            .propose(&[ask(1, &tokens, 6, "")])
            .unwrap();
        assert_eq!(got[0].1, full[..n], "p_min {p_min}, token probabilities {probs:?}");
    }
    assert!(
        probs.iter().any(|&p| p < 0.999),
        "the tiny model is unsure of some token: {probs:?}"
    );
}
