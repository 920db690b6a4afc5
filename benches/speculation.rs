//! Speculative decoding side by side with llama.cpp (issue 48's table), on Qwen2.5-Coder-0.5B Q4_K_M
//! (or `SPEC_MODEL`, e.g. the 1.5B with the 0.5B as its draft), greedy, over `/v1/chat/completions`, each server with 2 compute threads:
//! - **edit**: rewrite a 308-line Python file with two small changes (as coding agents apply edits);
//! - **extract**: a JSON object of fields quoted from a ~2,000-token document;
//! - **chat**: a short story (little to copy).
//!
//! Each at 1 stream and at 8 (8 variants of the prompt at once); kvgate with and without speculation
//! in alternating rounds (`SPEC_ROUNDS`, default 3), both servers up at once. Prompts are computed first
//! (`max_tokens: 1`), so the rows are decode: every stream's tokens after its first (the usage's
//! count), over the time from the first stream's first token to the last stream's last. kvgate runs without speculation and with
//! `--speculative-config` (`SPEC_CONFIG`, default ngram k = 8, lookup 2..5, speculation on at any batch
//! so the 8-stream rows show what it costs there); llama.cpp without speculation and with each n-gram
//! `--spec-type` in `LLAMA_SPEC_TYPES` (default `ngram-simple,ngram-map-k,ngram-mod`), its best per
//! row reported. A draft model: `SPEC_CONFIG='{"method": "draft_model", "model": "<gguf>", …}'` for
//! kvgate and `LLAMA_SPEC_TYPES=draft-simple:<gguf>:<n-max>` for llama.cpp (`-md`, 2 draft threads). kvgate's outputs with and without speculation are compared token for token (greedy:
//! they must be equal). Acceptance: kvgate's `spec_decode_*` counters (accepted ÷ proposed, and the
//! mean tokens per verified step = 1 + accepted ÷ drafts); llama.cpp's `timings.draft_n` /
//! `draft_n_accepted` where it reports them.
//!
//! `SPEC_CONFIG_B` adds a second speculative config measured in the same rounds (say
//! `"token_tree_branches": 1` against the default token trees), with its tokens per verified step
//! and output beside the first's.
//!
//! `SPEC_STREAMS=1,2,4,8` adds the crossover: kvgate's rows (`SPEC_CROSS`, default `chat,edit`) at those
//! stream counts with and without speculation (where speculation stops paying is
//! `disable_by_batch_size`'s default). `SPEC_ROWS=edit:1,chat:8` measures a subset of the rows; each
//! figure is also printed to stderr as it is measured.
//! Run: `LLAMA_SERVER=… ANCHOR_MODELS=… cargo bench --bench speculation` (`MAX_TOKENS`, default 384).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use serde_json::{json, Value};

#[path = "anchor_parts/procs.rs"]
mod procs;
use procs::{free_port, healthy, sse_events, Proc};

fn kvgate(model: &Path, spec: Option<&str>) -> Proc {
    let port = free_port();
    let mut c = Command::new(env!("CARGO_BIN_EXE_serve"));
    c.args(["--model", model.to_str().unwrap(), "--port", &port.to_string()])
        .args(["--threads", "2", "--kv-cache-memory", "2GiB", "--max-model-len", "4096"]);
    if let Some(s) = spec {
        c.args(["--speculative-config", s]);
    }
    healthy(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap(), port)
}

fn llama(server: &Path, model: &Path, spec_type: Option<&str>) -> Proc {
    let port = free_port();
    let mut c = Command::new(server);
    c.args([
        "-m",
        model.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--host",
        "127.0.0.1",
    ])
    .args([
        "-t",
        "2",
        "-tb",
        "2",
        "-np",
        "8",
        "-c",
        &(4096 * 8).to_string(),
        "--no-warmup",
    ]);
    match spec_type.map(|t| t.split_once(':').unwrap_or((t, ""))) {
        // a draft model: `draft-simple:<gguf>:<n-max>`, two threads as the target
        Some((t, draft)) if !draft.is_empty() => {
            let (path, n) = draft.rsplit_once(':').unwrap_or((draft, "4"));
            c.args(["--spec-type", t, "-md", path, "--spec-draft-n-max", n])
                .args(["-td", "2", "-tbd", "2"]);
        }
        Some((t, _)) => {
            c.args(["--spec-type", t]);
        }
        None => {}
    }
    healthy(c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap(), port)
}

/// The 308-line source file of the edit workload; `variant` changes one comment line.
fn source(variant: usize) -> String {
    let mut l: Vec<String> = [
        "import argparse",
        "import json",
        "import os",
        "import sys",
        "",
        "",
        "def parse_args(argv=None):",
        "    p = argparse.ArgumentParser(description='a small inventory service')",
        "    p.add_argument('--port', type=int, default=8080)",
        "    p.add_argument('--data', default='inventory.json')",
        "    return p.parse_args(argv)",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    l.insert(0, format!("# inventory service, revision {variant}"));
    for i in 0..24 {
        l.extend([
            String::new(),
            format!("class Item{i}:"),
            format!("    \"\"\"An inventory record of kind {i}.\"\"\""),
            String::new(),
            format!("    def __init__(self, name, count=0, price={i}.5):"),
            "        self.name = name".into(),
            "        self.count = count".into(),
            "        self.price = price".into(),
            String::new(),
            "    def total(self):".into(),
            "        return self.count * self.price".into(),
            String::new(),
        ]);
    }
    l.extend(
        [
            "",
            "def main():",
            "    args = parse_args()",
            "    print('serving on', args.port)",
            "",
            "",
            "if __name__ == '__main__':",
            "    main()",
        ]
        .map(String::from),
    );
    l.join("\n") + "\n"
}

/// A ~2,000-token document of staff records; `variant` changes its heading.
fn document(variant: usize) -> String {
    let names = [
        "Ada Park", "Bo Chen", "Cy Diaz", "Di Evans", "Ed Fox", "Flo Gray", "Gus Hale", "Ivy Kim",
    ];
    let teams = ["billing", "search", "storage", "payments", "identity", "ingest"];
    let mut d = format!("Staff register, edition {variant}\n\n");
    for i in 0..60 {
        d.push_str(&format!(
            "Record {i}: {} works on the {} team in building {}, room {}; employee id EMP-{:05}; \
             started on 2019-{:02}-{:02}; manager {}.\n",
            names[i % names.len()],
            teams[i % teams.len()],
            (i * 7) % 11 + 1,
            100 + i * 3,
            10_000 + i * 137,
            i % 12 + 1,
            i % 28 + 1,
            names[(i + 3) % names.len()],
        ));
    }
    d
}

/// The workload's chat messages for stream `v`.
fn messages(workload: &str, v: usize) -> Value {
    let content = match workload {
        "edit" => format!(
            "Here is a file:\n```python\n{}```\nRewrite the whole file, unchanged except: rename the function \
             `parse_args` to `read_args` everywhere, and change the default port from 8080 to 9090. Output only \
             the file in one code block.",
            source(v)
        ),
        "extract" => format!(
            "{}\nReturn a JSON array with one object per record from Record 20 to Record 39, with the keys \
             \"name\", \"team\", \"employee_id\" and \"manager\", values quoted exactly from the register. \
             Output only the JSON.",
            document(v)
        ),
        _ => format!("Write a short story (about 300 words) about lighthouse keeper number {v} and a storm."),
    };
    json!([{"role": "user", "content": content}])
}

/// One streamed chat completion.
struct Streamed {
    /// Arrival time (from the row's start) of each content chunk.
    times: Vec<f64>,
    text: String,
    /// Completion tokens (the usage's; chunks when a server reports none).
    tokens: usize,
    /// Tokens proposed and accepted, where llama.cpp's timings report them.
    drafts: Option<(f64, f64)>,
}

fn stream(port: u16, msgs: &Value, max_tokens: usize, t0: Instant) -> Streamed {
    let body = json!({
        "messages": msgs, "max_tokens": max_tokens, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    });
    let (mut times, mut text, mut drafts, mut tokens) = (vec![], String::new(), None, None);
    for v in sse_events(port, "/v1/chat/completions", &body) {
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            if !t.is_empty() {
                times.push(t0.elapsed().as_secs_f64());
                text.push_str(t);
            }
        }
        if let (Some(n), Some(a)) = (
            v["timings"]["draft_n"].as_f64(),
            v["timings"]["draft_n_accepted"].as_f64(),
        ) {
            drafts = Some((n, a));
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n as usize);
        }
    }
    let tokens = tokens.unwrap_or(times.len());
    Streamed {
        times,
        text,
        tokens,
        drafts,
    }
}

/// A row: decode tok/s from the first token to the last (every stream's tokens after its first, over
/// the time from the first stream's first token to the last stream's last), the texts, llama.cpp's
/// drafts.
struct Measured {
    rate: f64,
    texts: Vec<String>,
    drafts: Option<(f64, f64)>,
    /// Seconds to the first token of the first stream's prompt (computed cold: prefill and, with a
    /// draft model, the draft's share of it).
    ttft: f64,
}

fn measure(port: u16, workload: &str, streams: usize, max_tokens: usize) -> Measured {
    let all: Vec<Value> = (0..streams).map(|v| messages(workload, v)).collect();
    let mut ttft = 0.0;
    for (i, m) in all.iter().enumerate() {
        // the prompt computed first: the row is decode
        let t = Instant::now();
        let _ = ureq::post(&format!("http://127.0.0.1:{port}/v1/chat/completions"))
            .send_json(json!({"messages": m, "max_tokens": 1, "temperature": 0}));
        if i == 0 {
            ttft = t.elapsed().as_secs_f64();
        }
    }
    let t0 = Instant::now();
    let runs: Vec<Streamed> = std::thread::scope(|s| {
        let hs: Vec<_> = all
            .iter()
            .map(|m| s.spawn(move || stream(port, m, max_tokens, t0)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let start = runs
        .iter()
        .filter_map(|r| r.times.first())
        .fold(f64::INFINITY, |a, &b| a.min(b));
    let end = runs.iter().filter_map(|r| r.times.last()).fold(0f64, |a, &b| a.max(b));
    let tokens: usize = runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    let drafts = runs
        .iter()
        .filter_map(|r| r.drafts)
        .fold(None, |acc: Option<(f64, f64)>, (n, a)| {
            let (n0, a0) = acc.unwrap_or((0.0, 0.0));
            Some((n0 + n, a0 + a))
        });
    Measured {
        rate: tokens as f64 / (end - start).max(1e-9),
        texts: runs.into_iter().map(|r| r.text).collect(),
        drafts,
        ttft,
    }
}

/// Rounds of one row as one: the median rate, the first round's texts, drafts and time to the first
/// token (later rounds find the prompt in the prefix cache).
fn median_of(mut ms: Vec<Measured>) -> Measured {
    let mut rates: Vec<f64> = ms.iter().map(|m| m.rate).collect();
    rates.sort_by(f64::total_cmp);
    let mut first = ms.swap_remove(0);
    first.rate = rates[rates.len() / 2];
    first
}

/// llama.cpp's best speculative row: tok/s, the `--spec-type`, its drafts (proposed, accepted).
type Best = (f64, String, Option<(f64, f64)>);

fn counter(port: u16, name: &str) -> f64 {
    let text = ureq::get(&format!("http://127.0.0.1:{port}/metrics"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with(&format!("{name}_")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn spec_counters(port: u16) -> (f64, f64, f64) {
    (
        counter(port, "kvgate:spec_decode_num_drafts_total"),
        counter(port, "kvgate:spec_decode_num_draft_tokens_total"),
        counter(port, "kvgate:spec_decode_num_accepted_tokens_total"),
    )
}

fn main() {
    let models = std::env::var_os("ANCHOR_MODELS").map(PathBuf::from);
    // SPEC_MODEL: the target's file under ANCHOR_MODELS (default the 0.5B; the 1.5B is the real pair's
    // target, `qwen2.5-coder-1.5b-instruct-q4_k_m.gguf`, with the 0.5B as its draft)
    let file = std::env::var("SPEC_MODEL").unwrap_or_else(|_| "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf".into());
    let Some(model) = models.map(|m| m.join(&file)).filter(|p| p.is_file()) else {
        println!("{file} not found under ANCHOR_MODELS; nothing to measure");
        return;
    };
    let llama_server = std::env::var_os("LLAMA_SERVER")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    let max_tokens: usize = std::env::var("MAX_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(384);
    let spec = std::env::var("SPEC_CONFIG").unwrap_or_else(|_| {
        r#"{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5, "disable_by_batch_size": 64}"#
            .into()
    });
    let workloads = ["edit", "extract", "chat"];
    // SPEC_ROWS=edit:1,chat:8,…: a subset of the rows
    let only: Vec<String> = std::env::var("SPEC_ROWS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let rows: Vec<(&str, usize)> = workloads
        .iter()
        .flat_map(|w| [(*w, 1), (*w, 8)])
        .filter(|(w, n)| only.is_empty() || only.contains(&format!("{w}:{n}")))
        .collect();
    println!("kvgate speculation: {spec}; max_tokens {max_tokens}; greedy\n");

    // kvgate without and with speculation, both servers up at once and measured in alternating
    // rounds (`SPEC_ROUNDS`, default 3; the median's rate, the first round's texts and time to the
    // first token — later rounds find the prompt cached): on a shared machine a slow minute then
    // hits both sides alike
    let rounds: usize = std::env::var("SPEC_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    // SPEC_CONFIG_B: a second speculative config measured in the same rounds (token trees against a
    // single path, say), its own table after the main one
    let spec_b = std::env::var("SPEC_CONFIG_B").ok();
    let mut plain = BTreeMap::new();
    let mut spec_rows = BTreeMap::new();
    let mut b_rows = BTreeMap::new();
    {
        let (kp, ks) = (kvgate(&model, None), kvgate(&model, Some(&spec)));
        let kb = spec_b.as_deref().map(|b| kvgate(&model, Some(b)));
        for &(w, n) in &rows {
            let (mut ps, mut ss, mut counts) = (vec![], vec![], (0.0, 0.0, 0.0));
            let (mut bs, mut b_counts) = (vec![], (0.0, 0.0, 0.0));
            for _ in 0..rounds {
                if let Some(kb) = &kb {
                    let before = spec_counters(kb.port);
                    let m = measure(kb.port, w, n, max_tokens);
                    let after = spec_counters(kb.port);
                    eprintln!("kvgate + spec B {w} {n}: {:.1} tok/s", m.rate);
                    b_counts = (
                        b_counts.0 + after.0 - before.0,
                        b_counts.1 + after.1 - before.1,
                        b_counts.2 + after.2 - before.2,
                    );
                    bs.push(m);
                }
                let m = measure(kp.port, w, n, max_tokens);
                eprintln!("kvgate {w} {n}: {:.1} tok/s", m.rate);
                ps.push(m);
                let before = spec_counters(ks.port);
                let m = measure(ks.port, w, n, max_tokens);
                let after = spec_counters(ks.port);
                eprintln!(
                    "kvgate + spec {w} {n}: {:.1} tok/s, counters {before:?} → {after:?}",
                    m.rate
                );
                counts = (
                    counts.0 + after.0 - before.0,
                    counts.1 + after.1 - before.1,
                    counts.2 + after.2 - before.2,
                );
                ss.push(m);
            }
            plain.insert((w, n), median_of(ps));
            spec_rows.insert((w, n), (median_of(ss), counts));
            if !bs.is_empty() {
                b_rows.insert((w, n), (median_of(bs), b_counts));
            }
        }
    }
    // llama.cpp: no speculation, then each n-gram type
    let types: Vec<String> = std::env::var("LLAMA_SPEC_TYPES")
        .unwrap_or_else(|_| "ngram-simple,ngram-map-k,ngram-mod".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    let mut theirs: BTreeMap<(&str, usize), f64> = BTreeMap::new();
    let mut theirs_best: BTreeMap<(&str, usize), Best> = BTreeMap::new();
    if let Some(server) = &llama_server {
        {
            let l = llama(server, &model, None);
            for &(w, n) in &rows {
                let r = measure(l.port, w, n, max_tokens).rate;
                eprintln!("llama.cpp {w} {n}: {r:.1} tok/s");
                theirs.insert((w, n), r);
            }
        }
        for t in &types {
            let l = llama(server, &model, Some(t));
            for &(w, n) in &rows {
                let m = measure(l.port, w, n, max_tokens);
                eprintln!("llama.cpp {t} {w} {n}: {:.1} tok/s, drafts {:?}", m.rate, m.drafts);
                let best = theirs_best.entry((w, n)).or_insert((0.0, String::new(), None));
                if m.rate > best.0 {
                    *best = (m.rate, t.clone(), m.drafts);
                }
            }
        }
    } else {
        println!("llama.cpp anchor: not found (LLAMA_SERVER); kvgate only\n");
    }

    println!("| workload | streams | kvgate | kvgate + spec | × own | accepted | tokens/step | same output | first token s (spec / plain) | llama.cpp | llama.cpp best spec (type) | × llama.cpp best |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for &(w, n) in &rows {
        let p = &plain[&(w, n)];
        let (s, (drafts, proposed, kept)) = &spec_rows[&(w, n)];
        let same = p.texts == s.texts;
        let acc = if *proposed > 0.0 {
            format!("{:.0}%", 100.0 * kept / proposed)
        } else {
            "—".into()
        };
        let per_step = if *drafts > 0.0 {
            format!("{:.2}", 1.0 + kept / drafts)
        } else {
            "—".into()
        };
        let (l, best) = (theirs.get(&(w, n)), theirs_best.get(&(w, n)));
        println!(
            "| {w} | {n} | {:.1} | {:.1} | {:.2}× | {acc} | {per_step} | {} | {:.2} / {:.2} ({:.2}×) | {} | {} | {} |",
            p.rate,
            s.rate,
            s.rate / p.rate,
            if same { "yes" } else { "**no**" },
            s.ttft,
            p.ttft,
            s.ttft / p.ttft,
            l.map_or("—".into(), |l| format!("{l:.1}")),
            best.map_or("—".into(), |(r, t, d)| {
                let acc = d
                    .filter(|d| d.0 > 0.0)
                    .map_or(String::new(), |(nd, na)| format!(", {:.0}% accepted", 100.0 * na / nd));
                format!("{r:.1} ({t}{acc})")
            }),
            best.map_or("—".into(), |(r, _, _)| format!("{:.2}×", s.rate / r)),
        );
    }

    if let Some(b) = &spec_b {
        println!("\nB: {b} (same rounds)\n");
        println!("| workload | streams | spec | spec B | B ÷ spec | tokens/step (spec / B) | B same output |");
        println!("|---|---|---|---|---|---|---|");
        let per_step = |c: &(f64, f64, f64)| if c.0 > 0.0 { 1.0 + c.2 / c.0 } else { 1.0 };
        for &(w, n) in &rows {
            let (Some((s, sc)), Some((bm, bc))) = (spec_rows.get(&(w, n)), b_rows.get(&(w, n))) else {
                continue;
            };
            println!(
                "| {w} | {n} | {:.1} | {:.1} | {:.2}× | {:.2} / {:.2} ({:+.0}%) | {} |",
                s.rate,
                bm.rate,
                bm.rate / s.rate,
                per_step(sc),
                per_step(bc),
                100.0 * (per_step(bc) / per_step(sc) - 1.0),
                if bm.texts == plain[&(w, n)].texts {
                    "yes"
                } else {
                    "**no**"
                },
            );
        }
    }

    // the crossover: where speculation stops paying as streams are added
    let counts: Vec<usize> = std::env::var("SPEC_STREAMS")
        .unwrap_or_default()
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    if !counts.is_empty() {
        println!("\ncrossover (kvgate, tok/s without → with speculation at any batch)\n");
        println!(
            "| workload | {} |",
            counts
                .iter()
                .map(|c| format!("{c} streams"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        println!("|---|{}", "---|".repeat(counts.len()));
        let k0 = kvgate(&model, None);
        let k1 = kvgate(&model, Some(&spec));
        let cross = std::env::var("SPEC_CROSS").unwrap_or_else(|_| "chat,edit".into());
        for w in workloads.iter().filter(|w| cross.split(',').any(|c| c.trim() == **w)) {
            let cells: Vec<String> = counts
                .iter()
                .map(|&n| {
                    let a = measure(k0.port, w, n, max_tokens / 2).rate;
                    let b = measure(k1.port, w, n, max_tokens / 2).rate;
                    format!("{a:.1} → {b:.1} ({:.2}×)", b / a)
                })
                .collect();
            println!("| {w} | {} |", cells.join(" | "));
        }
    }
}
