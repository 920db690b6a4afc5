//! Engine throughput on the default model, in process (no HTTP): single-stream decode, prefill of a
//! 512-token prompt, aggregate decode at 1/4/16/64 concurrent streams, and the TTFT ratio of a
//! 2,000-token shared prefix (second request ÷ first), and what publishing KV events costs: 16 streams
//! of unsalted prompts (so every block is published) on an engine with an event sink, whose batches a
//! task encodes as the publisher does, against the same engine without one, alternated over rounds.
//! Run with `cargo bench --bench engine`; prints a table. Compare numbers within one run: the machines
//! are shared and noisy.

use std::sync::Arc;
use std::time::Instant;

use kvgate_cpu::{load, CpuBackend, CpuCache};
use kvgate_engine::{start, EngineConfig, EngineHandle, Event, GenerateRequest, KvEventSink, SamplingParams};
use kvgate_kv::KvDtype;
use kvgate_model::LoadOptions;

fn engine(prefix: bool, kv_events: Option<KvEventSink>, kv_bytes: u64) -> (EngineHandle, Arc<kvgate_model::Tokenizer>) {
    let path = kvgate_server::default_model::ensure_default_model(false).expect("default model");
    let m = load(
        &path,
        &LoadOptions {
            max_model_len: Some(4096),
            int8_activations: false,
            f32_weights: false,
            chat_template: None,
        },
    )
    .expect("load");
    let c = m.model.config().clone();
    let shape = c.cache_shape(16, KvDtype::F32).unwrap();
    let tok = Arc::new(m.tokenizer);
    let cache = CpuCache {
        num_blocks: shape.blocks_for_bytes(kv_bytes).unwrap(),
        ..Default::default()
    };
    let cfg = EngineConfig {
        kv_events,
        max_queue: 4096,
        prefix_caching: prefix,
        max_model_len: 4096,
        model_name: "bench".into(),
        ..Default::default()
    };
    let backend = Box::new(CpuBackend::with_cache(m.model, cache).unwrap());
    (start(backend, tok.clone(), m.eos_token_ids, cfg).unwrap(), tok)
}

fn params(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ignore_eos: true,
        ..Default::default()
    }
}

/// Runs a request; returns (seconds to first token, seconds total, tokens generated).
async fn run(h: &EngineHandle, prompt: Vec<u32>, max_tokens: usize, salt: Option<String>) -> (f64, f64, usize) {
    let t0 = Instant::now();
    let mut s = h
        .generate(GenerateRequest {
            prompt,
            params: params(max_tokens),
            cache_salt: salt,
            retain: None,
            breakpoints: vec![],
        })
        .unwrap();
    let mut first = None;
    let mut n = 0;
    loop {
        match s.next().await.unwrap() {
            Event::Token { .. } => {
                n += 1;
                first.get_or_insert(t0.elapsed().as_secs_f64());
            }
            Event::Done(_) => break,
            Event::Error(e) => panic!("{e}"),
            _ => {}
        }
    }
    (first.unwrap_or(0.0), t0.elapsed().as_secs_f64(), n)
}

fn prompt_of(tok: &kvgate_model::Tokenizer, len: usize, seed: usize) -> Vec<u32> {
    let text: String = (0..len * 2)
        .map(|i| format!("w{} ", (i * 7919 + seed * 104729) % 997))
        .collect();
    let mut ids = tok.encode(&text, false).unwrap();
    ids.truncate(len);
    ids
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (h, tok) = engine(true, None, 2 << 30);
        // warm-up
        run(&h, prompt_of(&tok, 32, 0), 8, Some("warm".into())).await;
        let mut rows: Vec<(String, String)> = vec![];
        // single-stream decode: 128 tokens after a short prompt, minus the prefill
        let (ttft, total, n) = run(&h, prompt_of(&tok, 16, 1), 129, Some("s1".into())).await;
        let decode = (n - 1) as f64 / (total - ttft);
        rows.push(("single-stream decode".into(), format!("{decode:.1} tok/s")));
        // prefill of 512 tokens (fresh salt: no cache hit)
        let mut best = f64::MAX;
        for i in 0..3 {
            let (ttft, _, _) = run(&h, prompt_of(&tok, 512, 10 + i), 1, Some(format!("p{i}"))).await;
            best = best.min(ttft);
        }
        rows.push((
            "prefill, 512-token prompt".into(),
            format!("{:.1} tok/s ({best:.2} s)", 512.0 / best),
        ));
        // aggregate decode at several concurrencies
        for conc in [1usize, 4, 16, 64] {
            let gen = 64;
            let t0 = Instant::now();
            let futs: Vec<_> = (0..conc)
                .map(|i| run(&h, prompt_of(&tok, 24, 100 + i), gen, Some(format!("c{conc}-{i}"))))
                .collect();
            let res = futures::future::join_all(futs).await;
            let wall = t0.elapsed().as_secs_f64();
            let toks: usize = res.iter().map(|r| r.2).sum();
            rows.push((
                format!("aggregate decode, {conc} streams"),
                format!("{:.1} tok/s", toks as f64 / wall),
            ));
        }
        // shared 2,000-token prefix, different short tails
        let prefix = prompt_of(&tok, 2000, 7);
        let mut a = prefix.clone();
        a.extend(tok.encode(" First question: why?", false).unwrap());
        let mut b = prefix;
        b.extend(tok.encode(" Second question: how?", false).unwrap());
        let (t1, _, _) = run(&h, a, 1, Some("shared".into())).await;
        let (t2, _, _) = run(&h, b, 1, Some("shared".into())).await;
        rows.push((
            "TTFT, 2,000-token shared prefix".into(),
            format!("first {t1:.2} s, second {t2:.3} s, ratio {:.3}", t2 / t1),
        ));
        // KV events: the same 16-stream decode on engines with and without a sink, alternated; the
        // prompts are unsalted and new each round, so every block they fill is published
        drop(h);
        let (plain, _) = engine(true, None, 1 << 30);
        let (sink, mut rx) = KvEventSink::channel(100_000);
        let (with, _) = engine(true, Some(sink.clone()), 1 << 30);
        let encoder = tokio::spawn(async move {
            let (mut batches, mut bytes) = (0usize, 0usize);
            while let Some(b) = rx.recv().await {
                bytes += kvgate_server::kv_events::encode(&b, 16).len();
                batches += 1;
            }
            (batches, bytes)
        });
        let (mut off, mut on) = (vec![], vec![]);
        for round in 0..6 {
            for (h, out) in [(&plain, &mut off), (&with, &mut on)] {
                let t0 = Instant::now();
                let futs: Vec<_> = (0..16)
                    .map(|i| run(h, prompt_of(&tok, 48, 1000 + round * 100 + i), 64, None))
                    .collect();
                let toks: usize = futures::future::join_all(futs).await.iter().map(|r| r.2).sum();
                out.push(toks as f64 / t0.elapsed().as_secs_f64());
            }
        }
        drop(with);
        drop(sink);
        let (batches, bytes) = encoder.await.unwrap();
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        let (m_off, m_on) = (median(&mut off), median(&mut on));
        rows.push((
            "aggregate decode, 16 streams, KV events off / on (6 rounds, medians)".into(),
            format!(
                "{m_off:.1} / {m_on:.1} tok/s ({:+.1}%); {batches} batches, {bytes} bytes encoded",
                (m_on / m_off - 1.0) * 100.0
            ),
        ));
        println!("\n| benchmark (default model, 2 threads) | result |\n|---|---|");
        for (k, v) in rows {
            println!("| {k} | {v} |");
        }
    });
}
