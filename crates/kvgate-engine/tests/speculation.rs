//! Speculative decoding (prompt lookup) end to end on the tiny model: whatever a request asks —
//! greedy or seeded sampling, penalties, logprobs, `n` choices, stop strings, `max_tokens`, a grammar
//! — its event stream is the one decoding a token per step produces, under batching and preemption;
//! proposals are made and kept (the counters say so); every way a request ends returns its blocks.

use kvgate_engine::{EngineHandle, Event, GenerateRequest, SamplingParams, SpecConfig};

mod common;

use common::*;

fn spec(k: usize, max_batch: usize) -> SpecConfig {
    SpecConfig {
        num_speculative_tokens: k,
        prompt_lookup_min: 1,
        prompt_lookup_max: 3,
        max_batch,
    }
}

/// Prompts whose text repeats, so that lookups find continuations.
fn repeating(tok: &kvgate_model::Tokenizer, k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .map(|i| {
            let line = format!("item {i}: the sea is calm and the wind is low; ");
            tok.encode(&format!("{line}{line}{line}copy it again: {line}"), false)
                .unwrap()
        })
        .collect()
}

/// Every event of one request, as text, choice by choice (tokens, their texts and logprobs,
/// finishes), then the usage: with `n` choices, how their events interleave depends on how many
/// tokens each step emitted, what each choice streams does not.
async fn events(h: &EngineHandle, prompt: &[u32], params: SamplingParams) -> Vec<String> {
    let mut s = h
        .generate(GenerateRequest {
            prompt: prompt.to_vec(),
            params,
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        })
        .unwrap();
    let mut by_choice = std::collections::BTreeMap::<usize, Vec<String>>::new();
    loop {
        let e = s.next().await.unwrap();
        let choice = match &e {
            Event::Token { choice, .. } | Event::Finished { choice, .. } => *choice,
            // what the prefix cache held before differs between runs; the counts do not
            Event::Done(u) => {
                let mut out: Vec<String> = by_choice.into_values().flatten().collect();
                out.push(format!("done: {} + {}", u.prompt_tokens, u.completion_tokens));
                return out;
            }
            _ => usize::MAX,
        };
        by_choice.entry(choice).or_default().push(format!("{e:?}"));
    }
}

async fn all_events(h: &EngineHandle, ps: &[Vec<u32>], params: &SamplingParams, concurrent: bool) -> Vec<Vec<String>> {
    if concurrent {
        futures::future::join_all(ps.iter().map(|p| events(h, p, params.clone()))).await
    } else {
        let mut out = vec![];
        for p in ps {
            out.push(events(h, p, params.clone()).await);
        }
        out
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
        let cases = [
            SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                seed: Some(7),
                max_tokens: 30,
                ignore_eos: true,
                ..Default::default()
            },
            SamplingParams {
                temperature: 1.0,
                seed: Some(11),
                n: 3,
                logprobs: Some(3),
                max_tokens: 25,
                ignore_eos: true,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.0,
                logprobs: Some(2),
                frequency_penalty: 0.4,
                presence_penalty: 0.3,
                repetition_penalty: 1.1,
                max_tokens: 30,
                ignore_eos: true,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.0,
                stop: vec!["wind".into(), "calm and".into()],
                max_tokens: 60,
                ..Default::default()
            },
            SamplingParams {
                temperature: 0.7,
                seed: Some(3),
                min_tokens: 5,
                max_tokens: 9,
                ..Default::default()
            },
        ];
        for (i, params) in cases.iter().enumerate() {
            let want = all_events(&base, &ps, params, false).await;
            assert_eq!(all_events(&h, &ps, params, false).await, want, "case {i}, sequential");
            assert_eq!(all_events(&h, &ps, params, true).await, want, "case {i}, concurrent");
        }
        // every seed: seeded sampling draws the same tokens, so the distribution is the same one
        for seed in 0..24 {
            let params = SamplingParams {
                temperature: 1.0,
                seed: Some(seed),
                max_tokens: 16,
                ignore_eos: true,
                ..Default::default()
            };
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
fn many_streams_pause_speculation() {
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
        // twelve streams at once are past the batch limit of 2: (almost) nothing was proposed then,
        // one stream at a time proposes on every step it finds a match
        assert!(
            alone.drafts - concurrent.drafts > 10 * concurrent.drafts.max(1),
            "{concurrent:?} then {alone:?}"
        );
        assert_pool_clean(&h).await;
    });
}
