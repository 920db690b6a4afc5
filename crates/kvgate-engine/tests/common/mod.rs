//! What the engine's end-to-end tests share: an engine over the tiny model with the options a test
//! changes, greedy sampling, a runtime, running requests to the end, prompts, the pool-is-clean check.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use kvgate_cpu::tiny::{tiny_model, TinySpec};
use kvgate_cpu::{CpuBackend, CpuCache, CpuSettings};
use kvgate_engine::{start, EngineConfig, EngineHandle, Event, FinishReason, GenerateRequest, SamplingParams};

pub struct Opts {
    pub blocks: usize,
    pub budget: usize,
    pub prefix: bool,
    pub max_queue: usize,
    pub quantized: bool,
    pub int8: bool,
    pub window: Option<usize>,
    pub spec: Option<kvgate_engine::SpecConfig>,
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
    (start(backend, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok)
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
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("engine did not return to idle: {:?}", h.stats().await.unwrap());
}
