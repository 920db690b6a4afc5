//! Speculative decoding by a draft model end to end on tiny models: the draft is the target itself
//! (its proposals are almost always kept) or another model of the same vocabulary (mostly
//! rejected), over a cache of another block size; whatever a request asks, its event stream is the
//! one decoding a token per step produces — under batching, a small token budget, preemption and a
//! draft cache too small for every sequence — and every way a request ends returns its blocks in
//! both caches.

use kvgate_cpu::tiny::TinySpec;
use kvgate_engine::{GenerateRequest, SpecConfig, SpecMethod};

mod common;

use common::*;

fn spec(k: usize) -> SpecConfig {
    SpecConfig {
        method: SpecMethod::DraftModel,
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 1,
        max_batch: 64,
        draft_p_min: 0.0,
        draft_window: kvgate_engine::DEFAULT_DRAFT_WINDOW,
        // whole prompts: the target as its own draft then proposes the target's own tokens
        draft_share: 10,
        tree_branches: 1,
    }
}

/// The target itself as its draft (same seed and layers).
fn same() -> TinySpec {
    TinySpec::default()
}

/// Another model of the same vocabulary: other weights, one layer.
fn other() -> TinySpec {
    TinySpec {
        seed: 7,
        layers: 1,
        ..Default::default()
    }
}

#[test]
fn greedy_outputs_are_those_of_one_token_per_step() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let ps = prompts(&tok, 10);
        let reference = run_all(&base, &ps, 40, false).await;
        for (name, draft, draft_bs, k, budget) in [
            ("same", same(), 4, 4, 2048),
            ("same", same(), 8, 8, 16),
            ("other", other(), 16, 3, 2048),
        ] {
            let (h, _) = engine(Opts {
                budget,
                spec: Some(spec(k)),
                draft: Some((draft, draft_bs, 512)),
                ..Default::default()
            });
            let what = format!("draft {name}, k {k}, budget {budget}");
            assert_eq!(run_all(&h, &ps, 40, false).await, reference, "{what}, sequential");
            assert_eq!(run_all(&h, &ps, 40, true).await, reference, "{what}, concurrent");
            let s = h.stats().await.unwrap();
            let d = s.draft.expect("a draft model runs");
            assert!(s.spec.drafts > 50, "{what}: proposals were made: {:?}", s.spec);
            assert!(d.forwards > 0 && d.rows > 0, "{what}: {d:?}");
            // the second round finds every prompt in the draft's prefix cache
            assert!(d.cached_tokens > 0, "{what}: {d:?}");
            if name == "same" {
                // the draft is the target: its greedy proposals are the target's greedy tokens
                assert!(s.spec.accepted * 10 >= s.spec.draft_tokens * 9, "{what}: {:?}", s.spec);
            }
            assert_pool_clean(&h).await;
        }
    });
}

#[test]
fn sampling_logprobs_choices_stops_and_penalties_see_the_same_stream() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let ps = repeating(&tok, 4);
        let cases = sampling_cases();
        for (name, draft) in [("same", same()), ("other", other())] {
            let (h, _) = engine(Opts {
                spec: Some(spec(5)),
                draft: Some((draft, 8, 512)),
                ..Default::default()
            });
            for (i, params) in cases.iter().enumerate() {
                let want = all_events(&base, &ps, params, false).await;
                assert_eq!(
                    all_events(&h, &ps, params, false).await,
                    want,
                    "{name}, case {i}, sequential"
                );
                assert_eq!(
                    all_events(&h, &ps, params, true).await,
                    want,
                    "{name}, case {i}, concurrent"
                );
            }
            // seeded sampling draws the same tokens, seed by seed: the same distribution
            for seed in 0..16 {
                let params = seeded(seed);
                assert_eq!(
                    events(&h, &ps[0], params.clone()).await,
                    events(&base, &ps[0], params).await,
                    "{name}, seed {seed}"
                );
            }
            let s = h.stats().await.unwrap();
            assert!(s.spec.accepted > 0, "{name}: {:?}", s.spec);
            assert_pool_clean(&h).await;
        }
    });
}

#[test]
fn preemption_and_a_small_draft_cache_keep_the_outputs() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let ps = prompts(&tok, 16);
        let reference = run_all(&base, &ps, 32, false).await;
        let need = ps.iter().map(|p| (p.len() + 32).div_ceil(4)).max().unwrap();
        // the draft's cache holds about three sequences: the others are not drafted for
        let (h, _) = engine(Opts {
            blocks: need + 8,
            budget: 64,
            spec: Some(spec(4)),
            draft: Some((same(), 4, 3 * need)),
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
fn a_request_dropped_mid_stream_returns_its_blocks_in_both_caches() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            spec: Some(spec(6)),
            draft: Some((other(), 4, 512)),
            ..Default::default()
        });
        let ps = repeating(&tok, 6);
        for (i, p) in ps.iter().enumerate() {
            let mut s = h
                .generate(GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(200),
                    cache_salt: Some(format!("tenant {}", i % 2)),
                    retain: None,
                    breakpoints: vec![],
                })
                .unwrap();
            for _ in 0..(3 + i * 2) {
                s.next().await.unwrap();
            }
        }
        assert_pool_clean(&h).await;
    });
}

/// Both methods in one configuration (prompt lookup where the context holds a match, the draft
/// elsewhere) and the draft's defaults as `serve` has them (proposals end where the draft doubts a
/// token; the draft reads a window of the prompt), with a batch limit the streams go past (a sequence
/// then speculates while it keeps its proposals): the streams are those of one token per step.
#[test]
fn both_methods_with_the_drafts_defaults_keep_the_outputs() {
    rt().block_on(async {
        let (base, tok) = engine(Opts::default());
        let mut ps = repeating(&tok, 4);
        ps.extend(prompts(&tok, 4));
        let reference = run_all(&base, &ps, 32, false).await;
        for method in [SpecMethod::LookupThenDraft, SpecMethod::DraftModel] {
            let cfg = SpecConfig {
                method,
                prompt_lookup_min: 2,
                prompt_lookup_max: 4,
                max_batch: 2,
                draft_p_min: kvgate_engine::DEFAULT_DRAFT_P_MIN,
                draft_window: 48,
                draft_share: kvgate_engine::DRAFT_PROMPT_SHARE,
                tree_branches: 1,
                ..spec(4)
            };
            for draft in [same(), other()] {
                let (h, _) = engine(Opts {
                    spec: Some(cfg),
                    draft: Some((draft, 4, 512)),
                    ..Default::default()
                });
                let what = format!("{method:?}");
                assert_eq!(run_all(&h, &ps, 32, false).await, reference, "{what}, sequential");
                assert_eq!(run_all(&h, &ps, 32, true).await, reference, "{what}, concurrent");
                let s = h.stats().await.unwrap();
                // the repeating prompts' lookups propose whatever the draft's confidence (a random
                // tiny draft is rarely 75% sure of a token: alone it may propose nothing at all)
                if method == SpecMethod::LookupThenDraft {
                    assert!(s.spec.drafts > 0, "{what}: {:?}", s.spec);
                }
                assert_pool_clean(&h).await;
            }
        }
    });
}
