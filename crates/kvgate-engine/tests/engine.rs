//! The engine end to end on the tiny in-memory model: greedy outputs do not depend on batching, chunked
//! prefill, prefix-cache hits or preemption; every way a request ends returns its blocks; int8
//! completions are cached apart from decisions; a panic fails the requests in flight and the engine
//! keeps serving. Decisions' own invariants are in `engine_decisions.rs`.

use kvgate_engine::{
    DecideRequest, DecisionRead, EngineError, EngineHandle, Event, FinishReason, GenerateRequest, SamplingParams,
};

mod common;

use common::*;

#[test]
fn greedy_is_invariant_to_batching_chunking_caching_and_preemption() {
    rt().block_on(async {
        let (base, tok) = engine(Opts {
            prefix: false,
            ..Default::default()
        });
        let ps = prompts(&tok, 32);
        let reference = run_all(&base, &ps, 24, false).await;
        assert_eq!(run_all(&base, &ps, 24, true).await, reference, "concurrency 32 vs 1");
        for budget in [16, 64, 2048] {
            let (h, _) = engine(Opts {
                budget,
                ..Default::default()
            });
            // sequential runs hit the prefix cache (shared system prompt), concurrent ones batch
            assert_eq!(
                run_all(&h, &ps, 24, false).await,
                reference,
                "budget {budget}, prefix hits"
            );
            assert_eq!(
                run_all(&h, &ps, 24, true).await,
                reference,
                "budget {budget}, concurrent"
            );
            let s = h.stats().await.unwrap();
            assert!(s.prefix_hits > 0, "prefix cache was exercised");
            assert_pool_clean(&h).await;
        }
        // a cache of a few blocks forces preemption under concurrency
        let need = ps.iter().map(|p| (p.len() + 24).div_ceil(4)).max().unwrap();
        let (h, _) = engine(Opts {
            blocks: need + 6,
            budget: 64,
            ..Default::default()
        });
        assert_eq!(run_all(&h, &ps, 24, true).await, reference, "with preemption");
        let s = h.stats().await.unwrap();
        assert!(s.preemptions > 0, "preemption was exercised: {s:?}");
        assert_pool_clean(&h).await;
    });
}

#[test]
fn sliding_window_in_every_layer_gives_back_blocks_and_stays_invariant() {
    rt().block_on(async {
        let window = Some(10);
        let (base, tok) = engine(Opts {
            prefix: false,
            window,
            ..Default::default()
        });
        let ps = prompts(&tok, 12);
        assert!(ps.iter().all(|p| p.len() > 30), "prompts longer than the window");
        let reference = run_all(&base, &ps, 24, false).await;
        let (full, _) = engine(Opts {
            prefix: false,
            ..Default::default()
        });
        assert_ne!(
            run_all(&full, &ps, 24, false).await,
            reference,
            "the window changes what the model computes"
        );
        for budget in [4, 16, 2048] {
            let (h, _) = engine(Opts {
                budget,
                window,
                ..Default::default()
            });
            assert_eq!(
                run_all(&h, &ps, 24, false).await,
                reference,
                "budget {budget}, prefix hits"
            );
            assert_eq!(
                run_all(&h, &ps, 24, true).await,
                reference,
                "budget {budget}, concurrent"
            );
            let s = h.stats().await.unwrap();
            assert!(s.prefix_hits > 0, "prefix cache was exercised");
            assert_pool_clean(&h).await;
        }
        // 12 blocks of 4 tokens hold 48 tokens: each request needs ~60 positions but only its window
        // (10 tokens) plus the chunk being written, so one at a time they all run
        let (h, _) = engine(Opts {
            blocks: 12,
            budget: 8,
            window,
            ..Default::default()
        });
        assert_eq!(
            run_all(&h, &ps[..3], 24, false).await,
            reference[..3].to_vec(),
            "tiny cache"
        );
        assert_pool_clean(&h).await;
    });
}

#[test]
fn quantized_weights_are_batch_invariant_too() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            quantized: true,
            ..Default::default()
        });
        let ps = prompts(&tok, 12);
        let alone = run_all(&h, &ps, 16, false).await;
        assert_eq!(run_all(&h, &ps, 16, true).await, alone);
    });
}

#[test]
fn int8_activations_are_batch_invariant_and_cached_one_way() {
    rt().block_on(async {
        let mk = |int8| {
            engine(Opts {
                quantized: true,
                int8,
                ..Default::default()
            })
        };
        let ((f, tok), (q, _)) = (mk(false), mk(true));
        let ps = prompts(&tok, 8);
        let alone = run_all(&q, &ps, 16, false).await;
        assert_eq!(
            run_all(&q, &ps, 16, true).await,
            alone,
            "int8 completions are batch-invariant"
        );
        // the same greedy tokens on this model, other logprobs: the int8 path ran
        let first_logprobs = |h: &EngineHandle| {
            let mut s = h
                .generate(GenerateRequest {
                    prompt: ps[0].clone(),
                    params: SamplingParams {
                        logprobs: Some(5),
                        ..greedy(1)
                    },
                    cache_salt: Some("logprobs".into()),
                    retain: None,
                    breakpoints: vec![],
                })
                .unwrap();
            async move {
                loop {
                    if let Event::Token { logprob: Some(l), .. } = s.next().await.unwrap() {
                        return l.top;
                    }
                }
            }
        };
        let (lf, lq) = (first_logprobs(&f).await, first_logprobs(&q).await);
        assert_ne!(lf, lq, "the int8 engine computes differently");
        for ((tf, pf), (tq, pq)) in lf.iter().zip(&lq) {
            assert_eq!(tf, tq);
            assert!((pf - pq).abs() < 0.05, "int8 logprob {pq} vs f32 {pf}");
        }
        // A decision over a prefix an int8 completion just computed: f32 (equal to the f32 engine's,
        // bit for bit) and no int8 block is reused; int8 completions share blocks, and read the exact
        // blocks a decision computed (its state, warm for the follow-up).
        let fresh = tok
            .encode(
                "Another opening, about rivers and mountains, that nothing before shared.",
                false,
            )
            .unwrap();
        let req = || GenerateRequest {
            prompt: fresh.clone(),
            params: greedy(2),
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        };
        let (_, first) = collect(&q, req()).await;
        let (_, again) = collect(&q, req()).await;
        assert_eq!(first.cached_tokens, 0);
        assert!(again.cached_tokens > 0, "int8 completions share their blocks");
        // a yes/no decision over `prompt`: its reads and usage
        let decide_on = |h: &EngineHandle, prompt: Vec<u32>| {
            let labels = vec![tok.encode("yes", false).unwrap(), tok.encode("no", false).unwrap()];
            let s = h.decide(DecideRequest {
                reads: vec![DecisionRead {
                    prompt,
                    labels,
                    tree: None,
                }],
                cache_salt: None,
                keep_alive: None,
                tenant: None,
                ..Default::default()
            });
            async move {
                let o = s.unwrap().outcome().await.unwrap();
                (o.reads, o.usage)
            }
        };
        let decide = |h: &EngineHandle| {
            let mut prompt = fresh.clone();
            prompt.extend(tok.encode(" Is it urgent? Answer yes or no.", false).unwrap());
            decide_on(h, prompt)
        };
        let (on_q, usage) = decide(&q).await;
        assert_eq!(usage.cached_tokens, 0, "a decision never reads int8-computed blocks");
        assert_eq!(
            on_q,
            decide(&f).await.0,
            "decisions compute in f32 whatever the engine's mode"
        );
        // the follow-up completion over the decided state: the decision's exact blocks are warm for it
        // (the state's full blocks; its own suffix computes on the int8 path)
        let state = tok
            .encode(
                "A third opening, about lighthouses and the sea, that nothing before shared at all.",
                false,
            )
            .unwrap();
        let mut read = state.clone();
        read.extend(tok.encode(" Is it calm? Answer yes or no.", false).unwrap());
        assert_eq!(decide_on(&q, read).await.1.cached_tokens, 0);
        let mut follow = state.clone();
        follow.extend(tok.encode(" Then the keeper", false).unwrap());
        let (_, warm) = collect(
            &q,
            GenerateRequest {
                prompt: follow.clone(),
                params: greedy(2),
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            },
        )
        .await;
        let full = state.len() / 4 * 4; // blocks of 4 tokens
        assert!(full > 0);
        assert_eq!(
            warm.cached_tokens,
            full,
            "the follow-up reads the decision's blocks ({} state tokens)",
            state.len()
        );
        // and a second decision over the completion's int8 blocks still reads only exact ones
        let mut again = follow.clone();
        again.extend(tok.encode(" Is it calm? Answer yes or no.", false).unwrap());
        let cached = decide_on(&q, again).await.1.cached_tokens;
        assert_eq!(cached, full, "a decision reads exact blocks only");
        assert_pool_clean(&q).await;
    });
}

#[test]
fn n_choices_seeds_stops_and_lengths() {
    rt().block_on(async {
        let (h, tok) = engine(Opts::default());
        let prompt = tok.encode("Once upon a time", false).unwrap();
        let params = SamplingParams {
            temperature: 1.0,
            seed: Some(11),
            n: 3,
            max_tokens: 12,
            ignore_eos: true,
            ..Default::default()
        };
        let req = GenerateRequest {
            prompt: prompt.clone(),
            params: params.clone(),
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        };
        let (a, usage) = collect(&h, req.clone()).await;
        let (b, _) = collect(&h, req).await;
        assert_eq!(a, b, "same seed, same choices");
        assert_eq!(a.len(), 3);
        assert!(a[0].0 != a[1].0 || a[1].0 != a[2].0, "choices differ");
        assert!(a.iter().all(|c| c.0.len() == 12 && c.2 == FinishReason::Length));
        assert_eq!(usage.completion_tokens, 36);
        assert_eq!(usage.prompt_tokens, prompt.len());
        // a stop string cuts the text and ends with "stop"
        let (g, _) = collect(
            &h,
            GenerateRequest {
                prompt: prompt.clone(),
                params: greedy(40),
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            },
        )
        .await;
        let full = g[0].1.clone();
        let cut: String = full.chars().skip(3).take(2).collect();
        if !cut.trim().is_empty() {
            let mut p = greedy(40);
            p.stop = vec![cut.clone()];
            let (s, _) = collect(
                &h,
                GenerateRequest {
                    prompt,
                    params: p,
                    cache_salt: None,
                    retain: None,
                    breakpoints: vec![],
                },
            )
            .await;
            assert_eq!(s[0].2, FinishReason::Stop);
            assert_eq!(s[0].1, full[..full.find(&cut).unwrap()]);
        }
        assert_pool_clean(&h).await;
    });
}

#[test]
fn dropped_streams_free_their_blocks() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            budget: 32,
            ..Default::default()
        });
        let ps = prompts(&tok, 24);
        let mut streams = vec![];
        for p in &ps {
            streams.push(
                h.generate(GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(200),
                    cache_salt: None,
                    retain: None,
                    breakpoints: vec![],
                })
                .unwrap(),
            );
        }
        // read a few events of some, then drop everything mid-way
        for s in streams.iter_mut().take(5) {
            for _ in 0..3 {
                s.next().await.unwrap();
            }
        }
        drop(streams);
        assert_pool_clean(&h).await;
        assert_eq!(h.queued(), 0);
    });
}

#[test]
fn a_panic_fails_the_request_and_the_engine_keeps_serving() {
    rt().block_on(async {
        let (h, tok) = engine(Opts::default());
        let prompt = tok.encode("hello there", false).unwrap();
        // long enough that the request cannot finish before the injected panic arrives, even on a
        // loaded machine (50 tokens could, and the test then saw `Done` instead of the error)
        let mut s = h
            .generate(GenerateRequest {
                prompt: prompt.clone(),
                params: greedy(1000),
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            })
            .unwrap();
        s.next().await.unwrap();
        h.inject_panic();
        let mut saw_error = false;
        while let Some(e) = s.next().await {
            if let Event::Error(EngineError::Panic(m)) = e {
                assert!(m.contains("panic"));
                saw_error = true;
                break;
            }
            if matches!(e, Event::Done(_)) {
                break;
            }
        }
        assert!(saw_error);
        let (c, _) = collect(
            &h,
            GenerateRequest {
                prompt,
                params: greedy(5),
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            },
        )
        .await;
        assert_eq!(c[0].0.len(), 5);
        assert!(h.is_alive());
        assert_pool_clean(&h).await;
    });
}

#[test]
fn queue_limit_and_up_front_rejections() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            max_queue: 2,
            blocks: 64,
            ..Default::default()
        });
        let p = tok.encode("hi", false).unwrap();
        let mk = |max_tokens| GenerateRequest {
            prompt: p.clone(),
            params: greedy(max_tokens),
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        };
        let too_long = GenerateRequest {
            prompt: vec![5; 2000],
            params: greedy(1),
            cache_salt: None,
            retain: None,
            breakpoints: vec![],
        };
        assert!(matches!(
            h.generate(too_long).unwrap_err(),
            EngineError::PromptTooLong {
                prompt_tokens: 2000,
                max_model_len: 1024
            }
        ));
        assert!(matches!(
            h.generate(mk(1000)).unwrap_err(),
            EngineError::DoesNotFit { .. }
        ));
        assert!(matches!(
            h.generate(GenerateRequest {
                prompt: vec![99999],
                params: greedy(1),
                cache_salt: None,
                retain: None,
                breakpoints: vec![],
            })
            .unwrap_err(),
            EngineError::InvalidToken { .. }
        ));
        let mut held = vec![];
        let mut refused = 0;
        for _ in 0..50 {
            match h.generate(mk(100)) {
                Ok(s) => held.push(s),
                Err(EngineError::QueueFull { max_queue: 2 }) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(refused > 0, "the queue limit was reached");
        drop(held);
        assert_pool_clean(&h).await;
    });
}
