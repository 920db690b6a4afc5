//! A bounded soak of `serve` on the default model over a small cache (`--num-kv-blocks 96`) with a
//! second tier (256 MiB of host memory, a 1 GiB spill file) and session retention (5 s windows): mixed
//! clients for `SOAK_SECS` seconds (default 600) — streamed completions dropped part-way, chat
//! completions (some constrained to a JSON schema), System One decisions (half with `keep_alive` 5 s),
//! two-turn sessions with a `prompt_cache_key`, a flood of unique prompts, tokenize calls and oversized
//! prompts — then the report: status counts per kind, latency percentiles, RSS over time (flat within
//! ±10% after the first tenth), the KV blocks still in use once the clients stopped and the windows
//! expired (every block must come back: 0%), and the second tier within its bounds.
//!
//! `cargo bench --bench soak` (`SOAK_SECS`, `SOAK_CLIENTS`, default 64).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

use common::metric;

use serde_json::{json, Value};

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<(String, u16), usize>,
    latencies: BTreeMap<String, Vec<f64>>,
}

fn request(port: u16, path: &str, body: &Value, drop_after: Option<usize>) -> (u16, f64) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let b = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        b.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(b.as_bytes()).unwrap();
    let mut out = vec![];
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if drop_after.is_some_and(|k| out.len() > k) {
                    break; // the client goes away mid-stream
                }
            }
        }
    }
    let status = std::str::from_utf8(&out[..out.len().min(12)])
        .ok()
        .and_then(|h| h.get(9..12))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, t.elapsed().as_secs_f64())
}

fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(0.0, |k| k / 1024.0)
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn main() {
    let secs: u64 = std::env::var("SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    let clients: usize = std::env::var("SOAK_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let dir = std::env::temp_dir().join(format!("kvgate-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let s = common::start(&[
        "--num-kv-blocks",
        "96",
        "--max-num-seqs",
        "16",
        "--session-window",
        "5",
        "--kv-offload-memory",
        "256MiB",
        "--kv-offload-dir",
        dir.to_str().unwrap(),
        "--kv-offload-disk",
        "1GiB",
    ]);
    let port = s.1;
    let pid = s.pid();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Instant::now() + Duration::from_secs(secs);
    let giant = "a ".repeat(600_000);
    let handles: Vec<_> = (0..clients)
        .map(|c| {
            let tally = tally.clone();
            let giant = giant.clone();
            std::thread::spawn(move || {
                let mut i = 0usize;
                while Instant::now() < stop {
                    i += 1;
                    let state = format!("Ticket {c}-{}: the customer's payouts fail since Monday. ", i % 5).repeat(12);
                    if (c + i) % 8 == 6 {
                        // a two-turn session: the second turn extends the first
                        let key = format!("session-{c}-{i}");
                        let first = format!("{state} Session {c}-{i}: what happened?");
                        for (turn, prompt) in [first.clone(), format!("{first} It shipped late. And now?")].iter().enumerate() {
                            let body = json!({"prompt": prompt, "max_tokens": 8, "prompt_cache_key": key});
                            let (st, t) = request(port, "/v1/completions", &body, None);
                            let mut g = tally.lock().unwrap();
                            let kind = format!("session turn {}", turn + 1);
                            *g.statuses.entry((kind.clone(), st)).or_insert(0) += 1;
                            g.latencies.entry(kind).or_default().push(t);
                        }
                        continue;
                    }
                    let (kind, path, body, drop) = match (c + i) % 8 {
                        7 => ("flood", "/v1/completions",
                              json!({"prompt": format!("Unique prompt {c}-{i}: {}", "the warehouse ships parcels north and south. ".repeat(30)), "max_tokens": 1}),
                              None),
                        0 => ("stream-dropped", "/v1/completions",
                              json!({"prompt": format!("{state} Summary:"), "max_tokens": 64, "stream": true, "ignore_eos": true}),
                              Some(600)),
                        1 => ("chat", "/v1/chat/completions",
                              json!({"messages": [{"role": "user", "content": format!("{state} What now?")}], "max_tokens": 24}), None),
                        2 => ("chat-json", "/v1/chat/completions",
                              json!({"messages": [{"role": "user", "content": "Classify: payouts fail."}], "max_tokens": 40,
                                     "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema":
                                     {"type": "object", "properties": {"team": {"enum": ["billing", "tech"]}}, "required": ["team"]}}}}), None),
                        3 => ("decision", "/v1/systemone",
                              {
                                  let mut d = json!({"state": state, "questions": {
                                      "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "Billing", "tech": null}},
                                      "urgent": {"type": "noul", "instructions": "Is it urgent?"}}});
                                  if i.is_multiple_of(2) {
                                      d["keep_alive"] = json!(5);
                                  }
                                  d
                              }, None),
                        4 => ("tokenize", "/tokenize", json!({"prompt": state}), None),
                        _ => ("oversized", "/v1/completions", json!({"prompt": giant, "max_tokens": 1}), None),
                    };
                    let (st, t) = request(port, path, &body, drop);
                    let mut g = tally.lock().unwrap();
                    *g.statuses.entry((kind.to_string(), st)).or_insert(0) += 1;
                    g.latencies.entry(kind.to_string()).or_default().push(t);
                }
            })
        })
        .collect();
    let mut rss = vec![];
    let t0 = Instant::now();
    while Instant::now() < stop {
        rss.push((t0.elapsed().as_secs(), rss_mb(pid)));
        std::thread::sleep(Duration::from_secs((secs / 20).max(1)));
    }
    for h in handles {
        h.join().unwrap();
    }
    // keep_alive pins and session windows last 5 s: after 7 s every block must be free or cached
    std::thread::sleep(Duration::from_secs(7));
    let usage = metric(port, "kvgate:kv_cache_usage_perc");
    let retained = metric(port, "kvgate:kv_cache_retained_blocks");
    let tier_memory = metric(
        port,
        "kvgate:kv_tier_bytes{model_name=\"smollm2-135m-instruct\",tier=\"memory\"}",
    );
    let tier_disk = metric(
        port,
        "kvgate:kv_tier_bytes{model_name=\"smollm2-135m-instruct\",tier=\"disk\"}",
    );
    let stored = metric(port, "kvgate:kv_tier_stored_blocks_total");
    let restored = metric(port, "kvgate:kv_tier_restored_blocks_total");
    let rejected = metric(port, "kvgate:kv_tier_rejected_records_total");
    let (sc, sp) = (
        metric(port, "kvgate:session_cached_tokens_total"),
        metric(port, "kvgate:session_prompt_tokens_total"),
    );
    rss.push((t0.elapsed().as_secs(), rss_mb(pid)));
    let g = tally.lock().unwrap();
    println!("## Soak: {secs} s, {clients} clients, 96 KV blocks, tier 256 MiB memory + 1 GiB disk\n");
    println!("| kind | status | count |\n|---|---|---|");
    for ((k, st), n) in &g.statuses {
        println!("| {k} | {st} | {n} |");
    }
    println!("\n| kind | p50 s | p95 s | p99 s |\n|---|---|---|---|");
    for (k, v) in &g.latencies {
        let mut v = v.clone();
        println!(
            "| {k} | {:.3} | {:.3} | {:.3} |",
            pct(&mut v, 0.5),
            pct(&mut v, 0.95),
            pct(&mut v, 0.99)
        );
    }
    println!(
        "\nRSS MB over time: {}",
        rss.iter()
            .map(|(t, m)| format!("{t}s {m:.0}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "KV cache blocks in use 7 s after the clients stopped (pins and windows expired): {:.1}%, retained blocks {retained}",
        usage * 100.0
    );
    println!(
        "second tier: memory {:.0} MiB (bound 256), spill file {:.0} MiB (bound 1024); {stored} blocks stored, {restored} restored, {rejected} rejected; sessions' cached share {:.1}%",
        tier_memory / (1 << 20) as f64,
        tier_disk / (1 << 20) as f64,
        100.0 * sc / sp.max(1.0)
    );
    // RSS after the first tenth (warm-up: the tier fills) against its end
    let after: Vec<f64> = rss.iter().filter(|(t, _)| *t >= secs / 10).map(|x| x.1).collect();
    if let (Some(first), Some(max), Some(min)) = (
        after.first(),
        after.iter().copied().reduce(f64::max),
        after.iter().copied().reduce(f64::min),
    ) {
        println!(
            "RSS after warm-up: {min:.0}–{max:.0} MiB, {:+.1}% / {:+.1}% of {first:.0} MiB",
            100.0 * (min / first - 1.0),
            100.0 * (max / first - 1.0)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let fives: usize = g
        .statuses
        .iter()
        .filter(|((_, st), _)| *st >= 500 || *st == 0)
        .map(|(_, n)| n)
        .sum();
    println!("5xx or no answer: {fives}");
}
