//! Speculative decoding (prompt lookup) end to end on the tiny model: whatever a request asks —
//! greedy or seeded sampling, penalties, logprobs, `n` choices, stop strings, `max_tokens`, a grammar
//! (every verified row masked, forced tokens in between) — its event stream is the one decoding a token per step produces, under batching and preemption;
//! proposals are made and kept (the counters say so); every way a request ends returns its blocks.

use std::sync::Arc;

use kvgate_engine::{
    ConstraintFactory, GenerateRequest, Guide, SamplingParams, SpecConfig, TokenConstraint, TokenMask,
};

mod common;

use common::*;

fn spec(k: usize, max_batch: usize) -> SpecConfig {
    SpecConfig {
        method: kvgate_engine::SpecMethod::Ngram,
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        max_batch,
        draft_p_min: 0.0,
        draft_window: kvgate_engine::DEFAULT_DRAFT_WINDOW,
        draft_share: kvgate_engine::DRAFT_PROMPT_SHARE,
        tree_branches: 1,
    }
}

#[test]
fn greedy_outputs_are_those_of_one_token_per_step() {
    rt().block_on(async {
        for int8 in [false, true] {
            let (base, tok) = engine(Opts {
                int8,
                quantized: int8,
                ..Default::default()
            });
            let ps = repeating(&tok, 12);
            let reference = run_all(&base, &ps, 40, false).await;
            for (k, budget) in [(1, 2048), (4, 2048), (7, 16)] {
                let (h, _) = engine(Opts {
                    int8,
                    quantized: int8,
                    budget,
                    spec: Some(spec(k, 64)),
                    ..Default::default()
                });
                assert_eq!(
                    run_all(&h, &ps, 40, false).await,
                    reference,
                    "k {k}, sequential, int8 {int8}"
                );
                assert_eq!(
                    run_all(&h, &ps, 40, true).await,
                    reference,
                    "k {k}, concurrent, int8 {int8}"
                );
                let s = h.stats().await.unwrap();
                assert!(s.spec.drafts > 50, "proposals were made: {:?}", s.spec);
                assert!(s.spec.accepted > 0, "and some were kept: {:?}", s.spec);
                assert!(s.spec.accepted <= s.spec.draft_tokens);
                assert_pool_clean(&h).await;
            }
        }
    });
}

/// Token trees (several prompt-lookup proposals verified in one pass, the kept path's rows moved to
/// their plain slots): greedy text, seeded draws, logprobs and `n` choices are those of decoding a
/// token per step, under batching, preemption and a small budget — and paths off the first proposal
/// are kept (so the moved rows are what later tokens read).
#[test]
fn token_trees_keep_every_stream_exact() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let tree = |k: usize| SpecConfig {
            tree_branches: 4,
            prompt_lookup_min: 1,
            prompt_lookup_max: 2,
            ..spec(k, 64)
        };
        let ps = repeating(&tok, 12);
        let reference = run_all(&base, &ps, 40, false).await;
        let need = ps.iter().map(|p| (p.len() + 40).div_ceil(4)).max().unwrap();
        for (k, budget, blocks) in [(2, 2048, 512), (4, 2048, 512), (3, 64, need + 8)] {
            let (h, _) = engine(Opts {
                budget,
                blocks,
                spec: Some(tree(k)),
                ..Default::default()
            });
            assert_eq!(run_all(&h, &ps, 40, false).await, reference, "k {k}, sequential");
            assert_eq!(run_all(&h, &ps, 40, true).await, reference, "k {k}, concurrent");
            let s = h.stats().await.unwrap();
            assert!(s.spec.trees > 20, "trees were verified: {:?}", s.spec);
            assert!(
                s.spec.tree_branch_kept > 0,
                "paths off the first proposal kept: {:?}",
                s.spec
            );
            assert_pool_clean(&h).await;
        }
        let (h, _) = engine(Opts {
            spec: Some(tree(4)),
            ..Default::default()
        });
        let short = &ps[..4];
        for (i, params) in sampling_cases().iter().enumerate() {
            let want = all_events(&base, short, params, false).await;
            assert_eq!(all_events(&h, short, params, true).await, want, "case {i}");
        }
        for seed in 0..12 {
            let params = seeded(seed);
            assert_eq!(
                events(&h, &ps[seed as usize % ps.len()], params.clone()).await,
                events(&base, &ps[seed as usize % ps.len()], params).await,
                "seed {seed}"
            );
        }
        assert_pool_clean(&h).await;
    });
}

#[test]
fn preemption_and_a_small_budget_keep_the_outputs() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let ps = repeating(&tok, 16);
        let reference = run_all(&base, &ps, 32, false).await;
        let need = ps.iter().map(|p| (p.len() + 32).div_ceil(4)).max().unwrap();
        let (h, _) = engine(Opts {
            blocks: need + 8,
            budget: 64,
            spec: Some(spec(5, 64)),
            ..Default::default()
        });
        assert_eq!(run_all(&h, &ps, 32, true).await, reference, "with preemption");
        let s = h.stats().await.unwrap();
        assert!(s.preemptions > 0, "preemption was exercised: {s:?}");
        assert!(s.spec.drafts > 0, "{:?}", s.spec);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn sampling_logprobs_choices_stops_and_penalties_see_the_same_stream() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let (h, _) = engine(Opts {
            spec: Some(spec(4, 64)),
            ..Default::default()
        });
        let ps = repeating(&tok, 6);
        let cases = sampling_cases();
        for (i, params) in cases.iter().enumerate() {
            let want = all_events(&base, &ps, params, false).await;
            assert_eq!(all_events(&h, &ps, params, false).await, want, "case {i}, sequential");
            assert_eq!(all_events(&h, &ps, params, true).await, want, "case {i}, concurrent");
        }
        // every seed: seeded sampling draws the same tokens, so the distribution is the same one
        for seed in 0..24 {
            let params = seeded(seed);
            assert_eq!(
                events(&h, &ps[0], params.clone()).await,
                events(&base, &ps[0], params).await,
                "seed {seed}"
            );
        }
        let s = h.stats().await.unwrap();
        assert!(s.spec.accepted > 0, "{:?}", s.spec);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn a_request_dropped_mid_stream_returns_its_blocks() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            spec: Some(spec(6, 64)),
            ..Default::default()
        });
        let ps = repeating(&tok, 8);
        for (i, p) in ps.iter().enumerate() {
            let mut s = h
                .generate(GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(200),
                    cache_salt: None,
                    retain: None,
                    breakpoints: vec![],
                })
                .unwrap();
            // read a few events, then drop the stream
            for _ in 0..(3 + i * 2) {
                s.next().await.unwrap();
            }
        }
        assert_pool_clean(&h).await;
    });
}

#[test]
fn many_streams_speculate_only_while_their_proposals_are_kept() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            spec: Some(spec(4, 2)),
            ..Default::default()
        });
        let ps = repeating(&tok, 12);
        let (base, _) = engine(Opts::default());
        let reference = run_all(&base, &ps, 24, false).await;
        assert_eq!(run_all(&h, &ps, 24, true).await, reference);
        let concurrent = h.stats().await.unwrap().spec;
        assert_eq!(run_all(&h, &ps, 24, false).await, reference);
        let alone = h.stats().await.unwrap().spec;
        // twelve streams at once are past the batch limit of 2: a stream whose proposals the tiny
        // model rejects stops after a try and tries again only some tokens later; one stream at a
        // time proposes on every step it finds a match
        assert!(concurrent.drafts * 5 <= 12 * 24, "{concurrent:?}");
        let alone_drafts = alone.drafts - concurrent.drafts;
        assert!(
            alone_drafts * 2 > concurrent.drafts * 3,
            "{concurrent:?} then {alone:?}"
        );
        assert_pool_clean(&h).await;
    });
}

/// A grammar for the test: only the tokens of `allowed`; after every `every` tokens it forces the
/// next two of `allowed` (when fast-forwarding is allowed); complete after `len` tokens.
#[derive(Clone)]
struct Subset {
    allowed: Vec<u32>,
    vocab: usize,
    every: usize,
    len: usize,
    done: usize,
}

impl TokenConstraint for Subset {
    fn mask(&mut self) -> Result<TokenMask, String> {
        Ok(TokenMask::from_ids(self.vocab, &self.allowed))
    }
    fn commit(&mut self, token: u32, fast_forward: bool) -> Result<Vec<u32>, String> {
        if !self.allowed.contains(&token) {
            return Err(format!("token {token} is not allowed"));
        }
        self.done += 1;
        if fast_forward && self.done.is_multiple_of(self.every) && self.done + 2 < self.len {
            self.done += 2;
            return Ok(self.allowed[..2].to_vec());
        }
        Ok(vec![])
    }
    fn is_stopped(&self) -> bool {
        self.done >= self.len
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

impl ConstraintFactory for Subset {
    fn start(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
    fn describe(&self) -> String {
        format!("subset of {} tokens", self.allowed.len())
    }
}

#[test]
fn a_grammar_masks_every_verified_row() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let (h, _) = engine(Opts {
            spec: Some(spec(6, 64)),
            ..Default::default()
        });
        let ps = repeating(&tok, 4);
        let mut allowed: Vec<u32> = ps[0].clone();
        allowed.sort_unstable();
        allowed.dedup();
        allowed.truncate(12);
        let vocab = tok.vocab_size();
        let guide = |every: usize| {
            Guide(Arc::new(Subset {
                allowed: allowed.clone(),
                vocab,
                every,
                len: 40,
                done: 0,
            }))
        };
        let before = h.stats().await.unwrap().spec;
        for (i, (temperature, n, logprobs, every)) in [
            (0.0, 1, None, 1000),
            (0.0, 1, None, 7),
            (0.9, 2, None, 5),
            (0.8, 1, Some(2), 4),
        ]
        .into_iter()
        .enumerate()
        {
            let params = SamplingParams {
                temperature,
                seed: Some(5),
                n,
                logprobs,
                max_tokens: 60,
                guide: Some(guide(every)),
                ..Default::default()
            };
            let want = all_events(&base, &ps, &params, false).await;
            assert_eq!(all_events(&h, &ps, &params, false).await, want, "case {i}, sequential");
            assert_eq!(all_events(&h, &ps, &params, true).await, want, "case {i}, concurrent");
        }
        let after = h.stats().await.unwrap().spec;
        assert!(
            after.accepted > before.accepted,
            "proposals were kept under the grammar: {after:?}"
        );
        assert_pool_clean(&h).await;
    });
}
