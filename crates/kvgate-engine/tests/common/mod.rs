//! What the engine's end-to-end tests share: an engine over the tiny model with the options a test
//! changes, greedy sampling, a runtime, running requests to the end, prompts, the pool-is-clean check.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache, CpuSettings};
use kvgate_engine::{
    start_with_draft, EngineConfig, EngineHandle, Event, FinishReason, GenerateRequest, SamplingParams,
};

pub struct Opts {
    pub blocks: usize,
    pub budget: usize,
    pub prefix: bool,
    pub max_queue: usize,
    pub quantized: bool,
    pub int8: bool,
    pub window: Option<usize>,
    pub spec: Option<kvgate_engine::SpecConfig>,
    /// A draft model (the tiny model of this spec) over a cache of this block size and count.
    pub draft: Option<(TinySpec, usize, usize)>,
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
            spec: None,
            draft: None,
        }
    }
}

pub fn engine(o: Opts) -> (EngineHandle, Arc<kvgate_model::Tokenizer>) {
    let m = tiny_model(TinySpec {
        quantized: o.quantized,
        sliding_window: o.window,
        ..Default::default()
    })
    .unwrap();
    let tok = Arc::new(m.tokenizer);
    let cfg = EngineConfig {
        max_num_seqs: 256,
        max_num_batched_tokens: o.budget,
        max_queue: o.max_queue,
        prefix_caching: o.prefix,
        max_model_len: m.max_model_len,
        model_name: "tiny".into(),
        speculation: o.spec,
        ..Default::default()
    };
    let settings = CpuSettings {
        int8_activations: o.int8,
    };
    let backend = Box::new(
        CpuBackend::with_cache(
            m.model,
            CpuCache {
                block_size: 4,
                num_blocks: o.blocks,
                settings,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let draft = o.draft.map(|(spec, block_size, num_blocks)| {
        let d = tiny_model(spec).unwrap();
        Box::new(
            CpuBackend::with_cache(
                d.model,
                CpuCache {
                    block_size,
                    num_blocks,
                    settings,
                    ..Default::default()
                },
            )
            .unwrap(),
        ) as Box<dyn kvgate_engine::Backend>
    });
    (
        start_with_draft(backend, draft, tok.clone(), m.eos_token_ids, cfg).unwrap(),
        tok,
    )
}

/// Sampling at temperature 1 with `seed`, 16 tokens: what "seeded draws are the same" compares.
pub fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        max_tokens: 16,
        ignore_eos: true,
        ..Default::default()
    }
}

pub fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Runs one request to the end; returns per choice (tokens, text, finish reason) and the usage.
pub async fn collect(
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

pub fn prompts(tok: &kvgate_model::Tokenizer, k: usize) -> Vec<Vec<u32>> {
    (0..k)
        .map(|i| {
            let mut text = String::from("A shared system prompt about the weather and the sea, repeated. ");
            text.push_str(&format!("Request number {i}: tell me about item {} please", i * 7 % 13));
            tok.encode(&text, false).unwrap()
        })
        .collect()
}

pub async fn run_all(h: &EngineHandle, ps: &[Vec<u32>], max_tokens: usize, concurrent: bool) -> Vec<Vec<u32>> {
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
                        retain: None,
                        breakpoints: vec![],
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
                    retain: None,
                    breakpoints: vec![],
                },
            )
            .await;
            out.push(c[0].0.clone());
        }
        out
    }
}

pub async fn assert_pool_clean(h: &EngineHandle) {
    for _ in 0..200 {
        let s = h.stats().await.unwrap();
        if s.active_requests == 0 && s.pool.used == s.pins {
            assert_eq!(s.pool.used, 0, "blocks still held: {s:?}");
            // a draft model's cache holds nothing for requests that ended either
            assert_eq!(
                s.draft.map_or(0, |d| d.held_blocks),
                0,
                "draft blocks still held: {s:?}"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("engine did not return to idle: {:?}", h.stats().await.unwrap());
}

/// Prompts whose text repeats, so that lookups find continuations.
pub fn repeating(tok: &kvgate_model::Tokenizer, k: usize) -> Vec<Vec<u32>> {
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
pub async fn events(h: &EngineHandle, prompt: &[u32], params: SamplingParams) -> Vec<String> {
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

pub async fn all_events(
    h: &EngineHandle,
    ps: &[Vec<u32>],
    params: &SamplingParams,
    concurrent: bool,
) -> Vec<Vec<String>> {
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

/// Requests that exercise everything a speculative step must reproduce: seeded top-p sampling, `n`
/// choices with logprobs, penalties with logprobs, stop strings, `min_tokens`.
pub fn sampling_cases() -> Vec<SamplingParams> {
    vec![
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
    ]
}
