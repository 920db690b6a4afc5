//! The engine end to end on the tiny in-memory model: greedy outputs do not depend on batching, chunked
//! prefill, prefix-cache hits or preemption; every way a request ends returns its blocks; decisions are
//! batch-invariant; a panic fails the requests in flight and the engine keeps serving.

use std::sync::Arc;
use std::time::Duration;

use kvgate_engine::{
    start, DecideRequest, DecisionRead, EngineConfig, EngineError, EngineHandle, Event, FinishReason, GenerateRequest,
    SamplingParams,
};
use kvgate_model::tiny::{tiny_model, TinySpec};

struct Opts {
    blocks: usize,
    budget: usize,
    prefix: bool,
    max_queue: usize,
    quantized: bool,
    int8: bool,
    window: Option<usize>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            blocks: 512,
            budget: 2048,
            prefix: true,
            max_queue: 1024,
            quantized: false,
            int8: false,
            window: None,
        }
    }
}

fn engine(o: Opts) -> (EngineHandle, Arc<kvgate_model::Tokenizer>) {
    let m = tiny_model(TinySpec {
        quantized: o.quantized,
        sliding_window: o.window,
        ..Default::default()
    })
    .unwrap();
    let tok = Arc::new(m.tokenizer);
    let cfg = EngineConfig {
        block_size: 4,
        num_blocks: o.blocks,
        max_num_seqs: 256,
        max_num_batched_tokens: o.budget,
        max_queue: o.max_queue,
        prefix_caching: o.prefix,
        max_model_len: m.max_model_len,
        model_name: "tiny".into(),
        int8_activations: o.int8,
        ..Default::default()
    };
    (start(m.model, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok)
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs one request to the end; returns per choice (tokens, text, finish reason) and the usage.
async fn collect(
    h: &EngineHandle,
    req: GenerateRequest,
) -> (Vec<(Vec<u32>, String, FinishReason)>, kvgate_engine::Usage) {
    let n = req.params.n.max(1);
    let mut s = h.generate(req).unwrap();
    let mut out: Vec<(Vec<u32>, String, Option<FinishReason>)> = vec![(vec![], String::new(), None); n];
    loop {
        match s.next().await.unwrap() {
            Event::Token {
                choice, token, text, ..
            } => {
                out[choice].0.push(token);
                out[choice].1.push_str(&text);
            }
            Event::Finished {
                choice, reason, text, ..
            } => {
                out[choice].1.push_str(&text);
                out[choice].2 = Some(reason);
            }
            Event::Done(u) => {
                return (out.into_iter().map(|(a, b, c)| (a, b, c.unwrap())).collect(), u);
            }
            Event::PromptLogprobs(_) => {}
            e => panic!("unexpected {e:?}"),
        }
    }
}

fn prompts(tok: &kvgate_model::Tokenizer, k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .map(|i| {
            let mut text = String::from("A shared system prompt about the weather and the sea, repeated. ");
            text.push_str(&format!("Request number {i}: tell me about item {} please", i * 7 % 13));
            tok.encode(&text, false).unwrap()
        })
        .collect()
}

async fn run_all(h: &EngineHandle, ps: &[Vec<u32>], max_tokens: usize, concurrent: bool) -> Vec<Vec<u32>> {
    if concurrent {
        let futs: Vec<_> = ps
            .iter()
            .map(|p| {
                collect(
                    h,
                    GenerateRequest {
                        prompt: p.clone(),
                        params: greedy(max_tokens),
                        cache_salt: None,
                    },
                )
            })
            .collect();
        let res = futures::future::join_all(futs).await;
        res.into_iter().map(|(c, _)| c[0].0.clone()).collect()
    } else {
        let mut out = vec![];
        for p in ps {
            let (c, _) = collect(
                h,
                GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(max_tokens),
                    cache_salt: None,
                },
            )
            .await;
            out.push(c[0].0.clone());
        }
        out
    }
}

async fn assert_pool_clean(h: &EngineHandle) {
    for _ in 0..200 {
        let s = h.stats().await.unwrap();
        if s.active_requests == 0 && s.pool.used == s.pins {
            assert_eq!(s.pool.used, 0, "blocks still held: {s:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("engine did not return to idle: {:?}", h.stats().await.unwrap());
}

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
fn int8_activations_are_opt_in_batch_invariant_and_cached_apart() {
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
        assert_ne!(
            run_all(&f, &ps, 16, false).await,
            alone,
            "the int8 engine computes differently"
        );
        // A decision over a prefix an int8 completion just computed: f32 (equal to the f32 engine's,
        // bit for bit) and no block of the other mode is reused; int8 completions do share blocks.
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
        };
        let (_, first) = collect(&q, req()).await;
        let (_, again) = collect(&q, req()).await;
        assert_eq!(first.cached_tokens, 0);
        assert!(again.cached_tokens > 0, "int8 completions share their blocks");
        let decide = |h: &EngineHandle| {
            let mut prompt = fresh.clone();
            prompt.extend(tok.encode(" Is it urgent? Answer yes or no.", false).unwrap());
            let labels = vec![tok.encode("yes", false).unwrap(), tok.encode("no", false).unwrap()];
            let s = h.decide(DecideRequest {
                reads: vec![DecisionRead { prompt, labels }],
                cache_salt: None,
                keep_alive: None,
                tenant: None,
            });
            async move {
                let o = s.unwrap().outcome().await.unwrap();
                (o.reads, o.usage)
            }
        };
        let (on_q, usage) = decide(&q).await;
        assert_eq!(usage.cached_tokens, 0, "a decision never reads int8-computed blocks");
        assert_eq!(
            on_q,
            decide(&f).await.0,
            "decisions compute in f32 whatever the engine's mode"
        );
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
fn decisions_are_bitwise_identical_alone_in_a_batch_and_warm() {
    rt().block_on(async {
        let (h, tok) = engine(Opts {
            budget: 64,
            ..Default::default()
        });
        let state = tok
            .encode(
                "<|im_start|>user\nThe payout failed three times and the customer is upset.<|im_end|>\n",
                false,
            )
            .unwrap();
        let yes = tok.encode("yes", false).unwrap()[0];
        let no = tok.encode("no", false).unwrap()[0];
        let reads: Vec<DecisionRead> = ["Is it urgent?", "Is it about money?", "Is the customer calm?"]
            .iter()
            .map(|q| {
                let mut p = state.clone();
                p.extend(
                    tok.encode(
                        &format!("<|im_start|>user\n{q} Answer yes or no.<|im_end|>\n<|im_start|>assistant\n"),
                        false,
                    )
                    .unwrap(),
                );
                DecisionRead {
                    prompt: p,
                    labels: vec![vec![yes], vec![no]],
                }
            })
            .collect();
        let ask = |salt: Option<&str>| {
            let s = h
                .decide(DecideRequest {
                    reads: reads.clone(),
                    cache_salt: salt.map(str::to_string),
                    keep_alive: None,
                    tenant: None,
                })
                .unwrap();
            async move {
                let o = s.outcome().await.unwrap();
                (o.reads, o.usage)
            }
        };
        let (cold, cold_usage) = ask(Some("cold")).await;
        let (warm, warm_usage) = ask(Some("cold")).await;
        assert_eq!(cold, warm, "warm prefix gives bitwise the same probabilities");
        assert!(warm_usage.cached_tokens > cold_usage.cached_tokens);
        // inside a batch of 16 concurrent completions
        let ps = prompts(&tok, 16);
        let mut streams = vec![];
        for p in &ps {
            streams.push(
                h.generate(GenerateRequest {
                    prompt: p.clone(),
                    params: greedy(30),
                    cache_salt: None,
                })
                .unwrap(),
            );
        }
        let (busy, _) = ask(Some("fresh-salt")).await;
        assert_eq!(cold, busy, "batch composition does not change the probabilities");
        for r in &cold {
            assert!(r.label_mass > 0.0 && r.label_mass <= 1.0 + 1e-9);
        }
        drop(streams);
        assert_pool_clean(&h).await;
    });
}

#[test]
fn decision_prefix_is_computed_once() {
    rt().block_on(async {
        let (h, tok) = engine(Opts::default());
        let state: Vec<u32> = tok.encode(&"the state of the world. ".repeat(30), false).unwrap();
        let reads: Vec<DecisionRead> = (0..8)
            .map(|i| {
                let mut p = state.clone();
                p.extend(tok.encode(&format!(" question {i}? Answer:"), false).unwrap());
                DecisionRead {
                    prompt: p,
                    labels: vec![vec![5], vec![6]],
                }
            })
            .collect();
        let first = &reads[0].prompt;
        let lcp = reads
            .iter()
            .map(|r| first.iter().zip(&r.prompt).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap();
        assert!(lcp >= state.len());
        let suffixes: usize = reads.iter().map(|r| r.prompt.len() - lcp).sum();
        let total: usize = reads.iter().map(|r| r.prompt.len()).sum();
        let usage = h
            .decide(DecideRequest {
                reads: reads.clone(),
                cache_salt: None,
                keep_alive: None,
                tenant: None,
            })
            .unwrap()
            .outcome()
            .await
            .unwrap()
            .usage;
        let computed = total - usage.cached_tokens;
        assert_eq!(
            computed,
            lcp + suffixes,
            "the shared prefix once, then each read's own tokens"
        );
        let usage = h
            .decide(DecideRequest {
                reads,
                cache_salt: None,
                keep_alive: None,
                tenant: None,
            })
            .unwrap()
            .outcome()
            .await
            .unwrap()
            .usage;
        let computed_warm = total - usage.cached_tokens;
        assert_eq!(
            computed_warm,
            lcp % 4 + suffixes,
            "warm: only the prefix's partial block and the suffixes"
        );
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
        };
        let too_long = GenerateRequest {
            prompt: vec![5; 2000],
            params: greedy(1),
            cache_salt: None,
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
                cache_salt: None
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
