//! kvgate and llama.cpp side by side, in one run, on the same GGUFs and the same machine (issue 11's
//! table): decode at 1 and 16 (or 8, or 4) streams, prefill of a ~670- and a ~2,550-token prompt, for
//! SmolLM2-135M Q4_1, Qwen2.5-Coder-0.5B Q4_K_M and Qwen2.5-Coder-1.5B Q4_K_M (the size people run). Both servers are driven the same way over HTTP
//! (`/v1/completions`, greedy, `ignore_eos`), each with 2 compute threads:
//! - decode tok/s = (N₂ − N₁) / (t₂ − t₁) for one request of N₂ and one of N₁ output tokens (prefill
//!   cancels out);
//! - aggregate decode at k streams = k · N / wall time of k concurrent requests of N tokens;
//! - prefill tok/s = prompt tokens / time of a request with `max_tokens: 1` (every prompt starts with a
//!   number no other request used, so neither server's prefix cache helps).
//!
//! Both servers run at once and are measured in alternating rounds (`ANCHOR_ROUNDS`, default 3: kvgate's
//! whole set, then llama.cpp's, and again), each figure the median over the rounds, with the per-round
//! ratios printed beside it: on a shared 2-core machine a slow minute then hits both sides alike.
//!
//! The anchor comes from `../shared/anchors/llama-cpp.sh` (`--env` prints `LLAMA_SERVER` and
//! `ANCHOR_MODELS`); without it, kvgate's column is printed alone with a line saying why. `KVGATE_SERVE`
//! measures another build of `serve` (before/after), `KVGATE_ARGS` adds `serve` flags, `ANCHOR_CASES=1.5b` one model only. Run with
//! `eval "$(../shared/anchors/llama-cpp.sh --env)"; LLAMA_SERVER=$LLAMA_SERVER ANCHOR_MODELS=$ANCHOR_MODELS
//! cargo bench --bench anchor`. `ANCHOR_LONG=WORDS,…` adds long prompts (prefill to the first streamed
//! token, decode after it), `ANCHOR_CTX` the context both servers get (default 4096),
//! `ANCHOR_LONG_STREAMS=K` adds K streams decoding at once after prompts of each long length,
//! `ANCHOR_DECIDE=WORDS` decisions over a warm state of about WORDS words (kvgate alone). After the table:
//! every decode row as a fraction of the bandwidth bound (bytes per step: weights plus the streams' KV,
//! over the copy bandwidth measured in the same run, and over the read bandwidth: what two threads can
//! read, which is what a decode step does), for both servers; and each server's time from start to
//! answering `/health` and its resident memory once loaded.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[path = "anchor_parts/bound.rs"]
mod bound;
#[path = "anchor_parts/procs.rs"]
mod procs;
use bound::{bytes_per_step, copy_bandwidth, cpu_flags, read_bandwidth};
use procs::{free_port, healthy, sse_events, Proc};

/// The context both servers serve per sequence (`ANCHOR_CTX`, default 4096; long prompts need more).
fn ctx() -> usize {
    std::env::var("ANCHOR_CTX")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096)
}

fn kvgate(model: &Path) -> Proc {
    let port = free_port();
    // KVGATE_SERVE: another build of `serve` (e.g. an older commit's) to measure instead of this one.
    let serve = std::env::var_os("KVGATE_SERVE").unwrap_or_else(|| env!("CARGO_BIN_EXE_serve").into());
    let child = Command::new(serve)
        .args(["--model", model.to_str().unwrap(), "--port", &port.to_string()])
        .args([
            "--threads",
            "2",
            "--kv-cache-memory",
            "2GiB",
            "--max-model-len",
            &ctx().to_string(),
        ])
        // KVGATE_ARGS: extra `serve` flags (e.g. "--activations f32").
        .args(std::env::var("KVGATE_ARGS").unwrap_or_default().split_whitespace())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    healthy(child, port)
}

fn llama(server: &Path, model: &Path, slots: usize) -> Proc {
    let port = free_port();
    let child = Command::new(server)
        .args([
            "-m",
            model.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--host",
            "127.0.0.1",
        ])
        .args(["-t", "2", "-tb", "2", "-np", &slots.to_string()])
        .args(["-c", &(ctx() * slots).to_string(), "--no-warmup"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("llama-server starts");
    healthy(child, port)
}

/// One completion; returns (seconds, prompt tokens, completion tokens).
fn complete(port: u16, prompt: &str, max_tokens: usize) -> (f64, usize, usize) {
    let body = json!({
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true,
    });
    let t0 = Instant::now();
    let mut r = ureq::post(&format!("http://127.0.0.1:{port}/v1/completions"))
        .send_json(&body)
        .unwrap_or_else(|e| panic!("completion on port {port}: {e}"));
    let v: Value = r.body_mut().read_json().unwrap();
    let dt = t0.elapsed().as_secs_f64();
    let u = &v["usage"];
    (
        dt,
        u["prompt_tokens"].as_u64().unwrap_or(0) as usize,
        u["completion_tokens"].as_u64().unwrap_or(0) as usize,
    )
}

/// A prompt of about `words` words that no earlier request shares a prefix with.
fn fresh_prompt(words: usize, salt: usize) -> String {
    let mut s = format!("{salt} ");
    for i in 0..words {
        s.push_str(
            [
                "report",
                "the",
                "north",
                "warehouse",
                "shipped",
                "order",
                "late",
                "today",
            ][(i * 7 + salt) % 8],
        );
        s.push(' ');
    }
    s
}

/// The streams and each stream's mean context (tokens) of a decode row, by its name: a single stream
/// decodes ~80 tokens after a ~16-token prompt; `k` streams 64 after ~16 (`decode_k`); after a long
/// prompt, the prompt plus ~24.
fn decode_shape(name: &str, streams: usize) -> (f64, f64) {
    let long = name
        .split('~')
        .nth(1)
        .and_then(|x| x.split('-').next())
        .and_then(|x| x.parse::<f64>().ok());
    let k = if name.starts_with("decode, 1 stream") || name.starts_with("decode after a ") {
        1.0
    } else {
        name.split_whitespace()
            .find_map(|w| w.parse::<f64>().ok())
            .unwrap_or(streams as f64)
    };
    match long {
        Some(n) => (k, n + 24.0),
        None if k == 1.0 => (1.0, 96.0),
        None => (k, 48.0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Single-stream decode tok/s.
fn decode_1(port: u16, salt: &mut usize) -> f64 {
    *salt += 1;
    let p = fresh_prompt(16, *salt);
    let (t1, _, n1) = complete(port, &p, 16);
    *salt += 1;
    let p = fresh_prompt(16, *salt);
    let (t2, _, n2) = complete(port, &p, 144);
    (n2 - n1) as f64 / (t2 - t1)
}

/// Aggregate tok/s of `k` concurrent streams of `n` tokens.
fn decode_k(port: u16, k: usize, n: usize, salt: &mut usize) -> f64 {
    let prompts: Vec<String> = (0..k)
        .map(|i| {
            *salt += 1;
            fresh_prompt(16, *salt * 31 + i)
        })
        .collect();
    let t0 = Instant::now();
    let tokens: usize = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || complete(port, p, n).2))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    tokens as f64 / t0.elapsed().as_secs_f64()
}

/// Prefill tok/s of a prompt of about `words` words; returns (tok/s, prompt tokens).
fn prefill(port: u16, words: usize, salt: &mut usize) -> (f64, usize) {
    *salt += 1;
    let (t, p, _) = complete(port, &fresh_prompt(words, *salt), 1);
    (p as f64 / t, p)
}

struct Row {
    name: String,
    ours: f64,
    theirs: Option<f64>,
    /// kvgate ÷ llama.cpp in each round.
    ratios: Vec<f64>,
    /// (kvgate, llama.cpp) in each round.
    rounds: Vec<(f64, f64)>,
}

fn measure(port: u16, streams: usize, salt: &mut usize) -> Vec<(String, f64)> {
    // warm up (first-request costs: page faults, thread pools)
    complete(port, "warm up", 4);
    let mut rows = vec![
        ("decode, 1 stream (tok/s)".to_string(), decode_1(port, salt)),
        (
            format!("decode, {streams} streams (aggregate tok/s)"),
            decode_k(port, streams, 64, salt),
        ),
    ];
    for words in [670, 2550] {
        let (rate, toks) = prefill(port, words, salt);
        rows.push((format!("prefill, ~{toks}-token prompt (tok/s)"), rate));
    }
    // ANCHOR_LONG: long prompts (words, comma-separated, e.g. "3300,6600"): prefill, then decode after it
    for words in std::env::var("ANCHOR_LONG")
        .unwrap_or_default()
        .split(',')
        .filter_map(|w| w.trim().parse::<usize>().ok())
    {
        *salt += 1;
        let (ttft, decode, toks) = streamed(port, &fresh_prompt(words, *salt), 48);
        rows.push((format!("prefill, ~{toks}-token prompt (tok/s)"), toks as f64 / ttft));
        rows.push((format!("decode after a ~{toks}-token prompt (tok/s)"), decode));
        // ANCHOR_LONG_STREAMS=K: K streams decoding at once after prompts of this length.
        if let Some(k) = std::env::var("ANCHOR_LONG_STREAMS")
            .ok()
            .and_then(|k| k.trim().parse::<usize>().ok())
        {
            let rate = decode_after_k(port, k, words, 48, salt).unwrap_or(f64::NAN);
            rows.push((
                format!("decode after ~{toks}-token prompts, {k} streams (aggregate tok/s)"),
                rate,
            ));
        }
    }
    rows
}

/// Decisions over one warm state of about `words` words (kvgate only; llama.cpp has no decision API):
/// seconds for 1 and 8 choice questions of 4 options, read `plain` and by default
/// (`ordered+calibrated`, each question new, so its tokens and its content-free prior are computed),
/// the median of 3. Returns the state's token count with the rows.
fn decisions(port: u16, words: usize) -> (usize, Vec<(String, f64)>) {
    let state = fresh_prompt(words, 424_242);
    let ask = |k: usize, read: &str, rep: usize| {
        let qs: serde_json::Map<String, Value> = (0..k)
            .map(|i| {
                let q = json!({"type": "choice",
                    "instructions": format!("Which team should take report {rep}-{i} ({read})?"),
                    "criteria": {"billing": "payments and invoices", "shipping": "orders in transit",
                                 "returns": "refunds", "security": "accounts and access"}});
                (format!("q{i}"), q)
            })
            .collect();
        let body = json!({"state": state, "questions": qs, "x_read": read});
        let t0 = Instant::now();
        let mut r = ureq::post(&format!("http://127.0.0.1:{port}/v1/systemone"))
            .config()
            .timeout_global(Some(Duration::from_secs(3600)))
            .build()
            .send_json(&body)
            .unwrap_or_else(|e| panic!("decision on port {port}: {e}"));
        let v: Value = r.body_mut().read_json().unwrap();
        // Jev usage: tokens computed = input tokens less the cached ones.
        let usage = &v["usage"];
        let input = usage["input_tokens"].as_u64().unwrap_or(0);
        let cached = usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        (t0.elapsed().as_secs_f64(), input.saturating_sub(cached) as usize)
    };
    let (cold, state_tokens) = ask(1, "plain", 0);
    let mut rows = vec![(
        format!("cold: the state computed, 1 question, plain ({state_tokens} tokens computed)"),
        cold,
    )];
    for k in [1usize, 8] {
        for read in ["plain", "ordered+calibrated"] {
            let mut computed = 0;
            let times: Vec<f64> = (1..=3)
                .map(|rep| {
                    let (t, n) = ask(k, read, rep + 10 * k);
                    computed = n;
                    t
                })
                .collect();
            rows.push((
                format!("warm: {k} question(s), {read} ({computed} tokens computed)"),
                median(times),
            ));
        }
    }
    (state_tokens, rows)
}

/// One streamed completion of `n` tokens: (seconds to the first token, decode tok/s between the first
/// and the last token, prompt tokens from the final usage chunk).
fn streamed(port: u16, prompt: &str, n: usize) -> (f64, f64, usize) {
    let (times, prompt_tokens) = token_times(port, prompt, n, Instant::now());
    let (first, last) = (
        times.first().copied().unwrap_or(0.0),
        times.last().copied().unwrap_or(0.0),
    );
    (
        first,
        (times.len().max(2) - 1) as f64 / (last - first).max(1e-9),
        prompt_tokens,
    )
}

/// Aggregate decode tok/s of `k` streams after prompts of about `words` words each (`ANCHOR_LONG_STREAMS`):
/// each prompt is computed first (`max_tokens: 1`, so both servers hold it in their prompt caches),
/// then all `k` stream `n` tokens at once, and the rate counts the tokens emitted while every stream
/// was decoding (between the last first token and the first last token). `None` when that window is
/// empty.
fn decode_after_k(port: u16, k: usize, words: usize, n: usize, salt: &mut usize) -> Option<f64> {
    let prompts: Vec<String> = (0..k)
        .map(|_| {
            *salt += 1;
            fresh_prompt(words, *salt)
        })
        .collect();
    for p in &prompts {
        complete(port, p, 1);
    }
    let t0 = Instant::now();
    let times: Vec<Vec<f64>> = std::thread::scope(|s| {
        let hs: Vec<_> = prompts
            .iter()
            .map(|p| s.spawn(move || token_times(port, p, n, t0).0))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = times.iter().filter_map(|t| t.first()).fold(0f64, |a, &b| a.max(b));
    let end = times
        .iter()
        .filter_map(|t| t.last())
        .fold(f64::INFINITY, |a, &b| a.min(b));
    let count: usize = times
        .iter()
        .map(|t| t.iter().filter(|&&x| x > start && x <= end).count())
        .sum();
    (end > start && count > 0).then(|| count as f64 / (end - start))
}

/// The arrival times (seconds since `t0`) of a streamed completion's `n` tokens, and its prompt tokens.
fn token_times(port: u16, prompt: &str, n: usize, t0: Instant) -> (Vec<f64>, usize) {
    let body = json!({
        "prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let (mut times, mut prompt_tokens) = (vec![], 0usize);
    for v in sse_events(port, "/v1/completions", &body) {
        if v["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty()) {
            times.push(t0.elapsed().as_secs_f64());
        }
        if let Some(p) = v["usage"]["prompt_tokens"].as_u64() {
            prompt_tokens = p as usize;
        }
    }
    (times, prompt_tokens)
}

fn main() {
    let anchor = std::env::var_os("LLAMA_SERVER")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    let models = std::env::var_os("ANCHOR_MODELS").map(PathBuf::from);
    println!(
        "CPU: {} ({} cores)",
        cpu_flags(),
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if anchor.is_none() {
        println!(
            "llama.cpp anchor: not found (set LLAMA_SERVER from ../shared/anchors/llama-cpp.sh --env); kvgate only"
        );
    }
    let default = kvgate_server::default_model::ensure_default_model(false).expect("the default model");
    let cases: Vec<(&str, Option<PathBuf>, usize)> = vec![
        (
            "SmolLM2-135M Q4_1",
            models
                .as_ref()
                .map(|m| m.join("smollm2-135m-instruct-q4_1.gguf"))
                .filter(|p| p.is_file())
                .or(Some(default)),
            16,
        ),
        (
            "Qwen2.5-Coder-0.5B Q4_K_M",
            models
                .as_ref()
                .map(|m| m.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
                .filter(|p| p.is_file()),
            8,
        ),
        (
            "Qwen2.5-Coder-1.5B Q4_K_M",
            models
                .as_ref()
                .map(|m| m.join("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
                .filter(|p| p.is_file()),
            4,
        ),
    ];
    // ANCHOR_CASES: a comma-separated filter on the model names (e.g. "qwen").
    let filter = std::env::var("ANCHOR_CASES").unwrap_or_default().to_lowercase();
    for (name, path, streams) in cases {
        if !filter.is_empty() && !filter.split(',').any(|f| name.to_lowercase().contains(f.trim())) {
            continue;
        }
        let Some(path) = path else {
            println!("\n{name}: GGUF not found under ANCHOR_MODELS; skipped");
            continue;
        };
        let mut salt = 0;
        let rounds: usize = std::env::var("ANCHOR_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3)
            .max(1);
        let k = kvgate(&path);
        let k_start = (k.ready_secs, k.rss());
        let l = anchor.as_ref().map(|a| llama(a, &path, streams));
        let l_start = l.as_ref().map(|l| (l.ready_secs, l.rss()));
        let (mut ours, mut theirs) = (vec![], vec![]);
        for _ in 0..rounds {
            ours.push(measure(k.port, streams, &mut salt));
            if let Some(l) = &l {
                theirs.push(measure(l.port, streams, &mut salt));
            }
        }
        // ANCHOR_DECIDE=WORDS: decisions over a warm state of about WORDS words, on kvgate alone.
        let decide_rows = std::env::var("ANCHOR_DECIDE")
            .ok()
            .and_then(|w| w.trim().parse::<usize>().ok())
            .map(|w| decisions(k.port, w));
        drop((k, l));
        let rows: Vec<Row> = (0..ours[0].len())
            .map(|i| Row {
                name: ours[0][i].0.clone(),
                ours: median(ours.iter().map(|r| r[i].1).collect()),
                theirs: (!theirs.is_empty()).then(|| median(theirs.iter().map(|r| r[i].1).collect())),
                ratios: ours.iter().zip(&theirs).map(|(o, t)| o[i].1 / t[i].1).collect(),
                rounds: ours.iter().zip(&theirs).map(|(o, t)| (o[i].1, t[i].1)).collect(),
            })
            .collect();
        println!("\n{name} ({})\n", path.display());
        println!("| workload | kvgate | llama.cpp | ratio | per round |\n|---|---|---|---|---|");
        let decode_rows: Vec<(String, f64, Option<f64>)> = rows
            .iter()
            .filter(|r| r.name.starts_with("decode"))
            .map(|r| (r.name.clone(), r.ours, r.theirs))
            .collect();
        for r in rows {
            match r.theirs {
                Some(t) => {
                    // each round's ratio, with both sides' figures (a round one side lost shows which)
                    let per: Vec<String> = r
                        .ratios
                        .iter()
                        .zip(&r.rounds)
                        .map(|(x, (o, t))| format!("{x:.2} ({o:.0}/{t:.0})"))
                        .collect();
                    println!(
                        "| {} | {:.1} | {:.1} | {:.2}× | {} |",
                        r.name,
                        r.ours,
                        t,
                        r.ours / t,
                        per.join(" ")
                    );
                }
                None => println!("| {} | {:.1} | — | — | — |", r.name, r.ours),
            }
        }
        // What bounds single-stream decode: the bytes one step reads (every weight once, the stream's
        // whole KV) at the copy bandwidth measured now. decode_1's context is ~16 prompt + ~80 generated
        // tokens on average; after a long prompt, the prompt plus ~24.
        if let Some(b) = bytes_per_step(&path) {
            let bw = copy_bandwidth();
            let rb = read_bandwidth();
            let file = std::fs::metadata(&path).map_or(0.0, |m| m.len() as f64);
            println!(
                "\nsingle-stream decode against the bandwidth bound (copy bandwidth {bw:.1} GB/s and read bandwidth {rb:.1} GB/s, 2 threads, measured now; \
                 kvgate reads {:.1} MB of weights per token and {:.0} KB of KV per context token ({}); llama.cpp its \
                 {:.1} MB GGUF and {:.0} KB of f16 KV)\n",
                b.weights / 1e6,
                b.kv_per_token / 1e3,
                b.kv_dtype,
                file / 1e6,
                b.kv_per_token_f16 / 1e3
            );
            println!("| decode row | streams × context | kvgate MB/step | kvgate bound tok/s | kvgate % of bound | llama.cpp % of its bound | kvgate % of the read bound | llama.cpp % of the read bound |\n|---|---|---|---|---|---|---|---|");
            for (name, ours, theirs) in &decode_rows {
                let (streams, ctx) = decode_shape(name, streams);
                let mine = b.weights + streams * ctx * b.kv_per_token;
                let their_bytes = file + streams * ctx * b.kv_per_token_f16;
                // tokens per second over the streams: steps per second times the streams
                let limit = streams * bw * 1e9 / mine;
                let theirs_pct = theirs.map_or("—".to_string(), |t| {
                    format!("{:.0}%", 100.0 * t / (streams * bw * 1e9 / their_bytes))
                });
                let theirs_read = theirs.map_or("—".to_string(), |t| {
                    format!("{:.0}%", 100.0 * t / streams * their_bytes / (rb * 1e9))
                });
                println!(
                    "| {name} | {streams:.0} × {ctx:.0} | {:.1} | {limit:.0} | {:.0}% | {theirs_pct} | {:.0}% | {theirs_read} |",
                    mine / 1e6,
                    100.0 * ours / limit,
                    100.0 * ours / streams * mine / (rb * 1e9)
                );
            }
        }
        println!(
            "\nstart-up: seconds from the process's start to its first answered /health, and resident memory then\n"
        );
        println!("| server | ready (s) | RSS once loaded (MB) |\n|---|---|---|");
        println!("| kvgate | {:.2} | {:.0} |", k_start.0, k_start.1 as f64 / 1e6);
        if let Some((t, rss)) = l_start {
            println!("| llama.cpp | {t:.2} | {:.0} |", rss as f64 / 1e6);
        }
        if let Some((tokens, rows)) = decide_rows {
            println!("\ndecisions over a warm state (kvgate; ~{tokens} tokens computed cold)\n");
            println!("| decision | seconds |\n|---|---|");
            for (name, t) in rows {
                println!("| {name} | {t:.3} |");
            }
        }
    }
}
