//! The KV-cache dtype report on the default model, through the real `serve` (HTTP on loopback), one
//! server per (dtype, method) with the same `--kv-cache-memory` (scaled dtypes calibrated from the
//! first prefill): KV bytes per token (scales included), blocks that fit, the max and mean |Δ| of
//! decision probabilities over a fixed set of 50 decision questions against the float32 cache, the
//! perplexity on a fixed text (this repo's LICENSE: 1,975 tokens, capped at 2,000), and the CPU
//! attention throughput of the (dtype, method) in process (16 decode rows over 4,096 tokens, the
//! default model's 9 query / 3 KV heads of 64; the best of five interleaved rounds per case, after every
//! server has exited; `KV_REPORT_ONLY=attention` measures only that column). `cargo bench --bench kv_report` prints a table;
//! `KV_REPORT_ONLY=fp8_e4m3` (a dtype name, or `dtype/method`) narrows the rows.

mod common;

use std::time::Instant;

use common::{post, Serve};
use kvgate_kv::{
    AttentionBackend, AttnParams, AttnQuery, AttnRow, CacheShape, CpuAttention, KvCache, KvDtype, KvQuant,
};
use serde_json::{json, Value};

fn start(dtype: &str, method: &str) -> Serve {
    let mut args = vec![
        "--kv-cache-memory",
        "1GiB",
        "--kv-cache-dtype",
        dtype,
        "--kv-cache-method",
        method,
        "--max-num-batched-tokens",
        "512",
        // the reads' own drift, not sharpened by the choice temperature
        "--decision-temperature",
        "1",
    ];
    if !matches!(dtype, "float32" | "bfloat16" | "float16" | "int8") {
        args.push("--calculate-kv-scales");
    }
    common::start(&args)
}

/// 10 states × 5 questions = 50 fixed decision questions (noul, choice and score mixed).
fn decisions() -> Vec<Value> {
    let states = [
        "Help! My payouts have been failing for 3 days and customers are complaining.",
        "Hi team, just a heads-up that the invoice PDF shows the old company address.",
        "The app crashes every time I open the settings page on Android 14. Please fix.",
        "I would like to upgrade to the enterprise plan for 40 seats. Who can I talk to?",
        "You charged my card twice this month. This is unacceptable, I want a refund now!",
        "Thanks for the quick reply yesterday, everything works perfectly now.",
        "Our API calls return 502 errors intermittently since this morning's deploy.",
        "Can you send me a quote for annual billing? We are comparing vendors.",
        "I forgot my password and the reset email never arrives. I have tried five times.",
        "The dashboard numbers don't match our export; revenue is off by about 3 percent.",
    ];
    states
        .iter()
        .map(|s| {
            json!({"state": s, "questions": {
                "urgent": {"type": "noul", "instructions": "Does this message convey urgency?"},
                "positive": {"type": "noul", "instructions": "Is the customer happy?"},
                "team": {"type": "choice", "instructions": "Which team should handle this?",
                         "criteria": {"billing": "Payments, invoices, refunds", "technical": "Bugs, outages, errors", "sales": "Plans and quotes", "support": null}},
                "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                                "criteria": ["Calm", "Slightly annoyed", "Frustrated", "Very angry"]},
                "priority": {"type": "score", "instructions": "What priority should this ticket get?",
                             "criteria": ["Low", "Normal", "High"]}
            }})
        })
        .collect()
}

fn probabilities(r: &Value) -> Vec<f64> {
    let mut out = vec![];
    for (_, a) in r["answers"].as_object().unwrap() {
        match a["type"].as_str().unwrap() {
            "noul" => out.push(a["noul"].as_f64().unwrap()),
            _ => out.extend(
                a["probabilities"]
                    .as_object()
                    .unwrap()
                    .values()
                    .map(|v| v.as_f64().unwrap()),
            ),
        }
    }
    out
}

/// One (dtype, method)'s CPU attention case: a one-layer cache of 4,096 tokens written with the method
/// and 16 decode rows at position 4,095 (9 query / 3 KV heads of 64).
struct AttnCase {
    cache: KvCache,
    tables: Vec<Vec<u32>>,
    rows: Vec<AttnRow>,
    q: Vec<f32>,
    out: Vec<f32>,
}

const CTX: usize = 4096;

impl AttnCase {
    fn new(dtype: KvDtype, quant: KvQuant) -> AttnCase {
        let shape = CacheShape::new(1, 3, 64, 16, dtype).unwrap().with_quant(quant).unwrap();
        let mut cache = KvCache::new(shape, CTX / 16);
        let _ = cache.set_scales(0, 0.05, 0.05);
        let (kv, slots) = Self::tokens();
        cache.write(0, &slots, &kv, &kv);
        let table: Vec<u32> = (0..(CTX / 16) as u32).collect();
        AttnCase {
            cache,
            tables: vec![table; 16],
            rows: (0..16)
                .map(|i| AttnRow {
                    table: i,
                    pos: (CTX - 1) as u32,
                })
                .collect(),
            q: (0..16 * 9 * 64).map(|i| ((i % 11) as f32 - 5.0) / 5.0).collect(),
            out: vec![0f32; 16 * 9 * 64],
        }
    }

    /// The K (= V) rows of the 4,096 tokens and their slots.
    fn tokens() -> (Vec<f32>, Vec<usize>) {
        let kv = (0..CTX * 3 * 64)
            .map(|i| ((((i % 192) * 7 + (i / 192) * 13) % 29) as f32 - 14.0) / 4.0)
            .collect();
        (kv, (0..CTX).collect())
    }

    /// Tokens stored per second (K and V, 3 heads of 64: quantize-on-store with the method).
    fn stores_per_sec(&mut self, secs: f64) -> f64 {
        let (kv, slots) = Self::tokens();
        let (t0, mut n) = (Instant::now(), 0);
        while t0.elapsed().as_secs_f64() < secs {
            self.cache.write(0, &slots, &kv, &kv);
            n += 1;
        }
        (n * CTX) as f64 / t0.elapsed().as_secs_f64()
    }

    /// Attention reads per second (K/V positions × query rows) over `secs` seconds.
    fn reads_per_sec(&mut self, secs: f64) -> f64 {
        let p = AttnParams {
            num_heads: 9,
            num_kv_heads: 3,
            head_dim: 64,
            scale: 0.125,
            window: None,
            softcap: None,
        };
        let tables: Vec<&[u32]> = self.tables.iter().map(|t| t.as_slice()).collect();
        let query = AttnQuery {
            q: &self.q,
            rows: &self.rows,
            tables: &tables,
            masks: &[],
        };
        let (t0, mut n) = (Instant::now(), 0);
        while t0.elapsed().as_secs_f64() < secs {
            CpuAttention.attend(&self.cache, 0, &query, &p, &mut self.out);
            n += 1;
        }
        (n * 16 * CTX) as f64 / t0.elapsed().as_secs_f64()
    }
}

/// Every case's best rate over five interleaved rounds of half a second (interleaving spreads this
/// shared 2-core machine's drift over all cases alike).
fn attention_rates(cases: &[(KvDtype, KvQuant)]) -> Vec<(f64, f64)> {
    let mut benches: Vec<AttnCase> = cases.iter().map(|&(d, q)| AttnCase::new(d, q)).collect();
    let mut best = vec![(0f64, 0f64); cases.len()];
    for _ in 0..5 {
        for (b, r) in benches.iter_mut().zip(best.iter_mut()) {
            r.0 = r.0.max(b.reads_per_sec(0.5));
        }
    }
    for _ in 0..3 {
        for (b, r) in benches.iter_mut().zip(best.iter_mut()) {
            r.1 = r.1.max(b.stores_per_sec(0.2));
        }
    }
    best
}

fn main() {
    let license = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/LICENSE")).unwrap();
    let only = std::env::var("KV_REPORT_ONLY").ok();
    let mut rows = vec![];
    let mut reference: Option<Vec<f64>> = None;
    let mut ref_ppl = 0.0;
    let mut cases: Vec<(KvDtype, KvQuant)> = KvDtype::ALL
        .into_iter()
        .flat_map(|d| KvQuant::methods_for(d).iter().map(move |&m| (d, m)))
        .collect();
    cases.retain(|&(dtype, quant)| {
        let (name, method) = (dtype.name(), quant.name());
        only.as_deref()
            .is_none_or(|o| o == "attention" || dtype == KvDtype::F32 || o == name || o == format!("{name}/{method}"))
    });
    for &(dtype, quant) in &cases {
        let (name, method) = (dtype.name(), quant.name());
        if only.as_deref() == Some("attention") {
            rows.push(format!("| {name} | {method} | | | | | | |"));
            continue;
        }
        let s = start(name, method);
        // Perplexity first (it is also the calibrating prefill for the scaled dtypes).
        let toks = post(s.1, "/tokenize", &json!({"prompt": license}));
        let all = toks["tokens"].as_array().unwrap();
        let ids: Vec<Value> = all[..all.len().min(2000)].to_vec();
        let n = ids.len();
        let r = post(
            s.1,
            "/v1/completions",
            &json!({"prompt": ids, "max_tokens": 1, "echo": true, "logprobs": 0, "temperature": 0}),
        );
        let lps: Vec<f64> = r["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap()[1..n]
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let ppl = (-lps.iter().sum::<f64>() / lps.len() as f64).exp();
        let mut probs = vec![];
        for d in decisions() {
            probs.extend(probabilities(&post(s.1, "/v1/systemone", &d)));
        }
        let (_, _, metrics) = {
            let mut r = ureq::get(&format!("http://127.0.0.1:{}/metrics", s.1)).call().unwrap();
            ((), (), r.body_mut().read_to_string().unwrap())
        };
        let line = metrics
            .lines()
            .find(|l| l.starts_with("kvgate:cache_config_info"))
            .unwrap_or("")
            .to_string();
        let label = |k: &str| -> String {
            line.split(&format!("{k}=\""))
                .nth(1)
                .and_then(|x| x.split('"').next())
                .unwrap_or("?")
                .to_string()
        };
        let blocks: usize = label("num_gpu_blocks").parse().unwrap_or(0);
        let bpb: usize = label("bytes_per_block").parse().unwrap_or(0);
        drop(s);
        let (max_d, mean_d) = match &reference {
            None => {
                reference = Some(probs.clone());
                ref_ppl = ppl;
                (0.0, 0.0)
            }
            Some(r) => {
                let d: Vec<f64> = r.iter().zip(&probs).map(|(a, b)| (a - b).abs()).collect();
                (
                    d.iter().cloned().fold(0.0, f64::max),
                    d.iter().sum::<f64>() / d.len() as f64,
                )
            }
        };
        rows.push(format!(
            "| {name} | {method} | {:.0} | {blocks} | {max_d:.4} | {mean_d:.4} | {ppl:.3} | {:+.3} |",
            bpb as f64 / 16.0,
            ppl - ref_ppl,
        ));
        eprintln!("{}", rows.last().unwrap());
    }
    let rates = attention_rates(&cases);
    let plain = |d: KvDtype| cases.iter().position(|&c| c == (d, KvQuant::PLAIN)).map(|i| rates[i]);
    for ((r, &(dtype, _)), &(reads, stores)) in rows.iter_mut().zip(&cases).zip(&rates) {
        let (pr, ps) = plain(dtype).unwrap_or((reads, stores));
        r.push_str(&format!(
            " {:.1} M ({:+.0}%) | {:.0} k ({:+.0}%) |",
            reads / 1e6,
            100.0 * (reads / pr - 1.0),
            stores / 1e3,
            100.0 * (stores / ps - 1.0)
        ));
    }
    println!("\n| KV dtype | method | KV bytes/token (30 layers, K+V, scales incl.) | blocks in 1 GiB | max |Δp| (50 decision questions vs float32) | mean |Δp| | perplexity (LICENSE, 1,975 tokens) | Δ perplexity | CPU attention reads/s (vs plain) | CPU stores, tokens/s (vs plain) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
