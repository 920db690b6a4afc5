//! The KV-cache dtype report on the default model, through the real `serve` (HTTP on loopback), one
//! server per dtype with the same `--kv-cache-memory` (scaled dtypes calibrated from the first prefill):
//! KV bytes per token, blocks that fit, the max |Δ| of decision probabilities over a fixed set of 50
//! decision questions against the float32 cache, and the perplexity on a fixed text (this repo's
//! LICENSE: 1,975 tokens, capped at 2,000). `cargo bench --bench kv_report` prints a table.

mod common;

use common::{post, Serve};
use serde_json::{json, Value};

fn start(dtype: &str) -> Serve {
    let mut args = vec![
        "--kv-cache-memory",
        "1GiB",
        "--kv-cache-dtype",
        dtype,
        "--max-num-batched-tokens",
        "512",
        // the reads' own drift, not sharpened by the choice temperature
        "--decision-temperature",
        "1",
    ];
    if !matches!(dtype, "float32" | "bfloat16" | "float16") {
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

fn main() {
    let license = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/LICENSE")).unwrap();
    let mut rows = vec![];
    let mut reference: Option<Vec<f64>> = None;
    let mut ref_ppl = 0.0;
    for dtype in ["float32", "bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4"] {
        let s = start(dtype);
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
        let delta = match &reference {
            None => {
                reference = Some(probs.clone());
                ref_ppl = ppl;
                0.0
            }
            Some(r) => r.iter().zip(&probs).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max),
        };
        rows.push(format!(
            "| {dtype} | {:.0} | {blocks} | {delta:.4} | {ppl:.3} | {:+.3} |",
            bpb as f64 / 16.0,
            ppl - ref_ppl
        ));
        eprintln!("{}", rows.last().unwrap());
    }
    println!("\n| KV dtype | KV bytes/token (30 layers, K+V) | blocks in 1 GiB | max |Δp| over 50 decision questions vs float32 | perplexity (LICENSE, 1,975 tokens) | Δ perplexity |");
    println!("|---|---|---|---|---|---|");
    for r in rows {
        println!("{r}");
    }
}
