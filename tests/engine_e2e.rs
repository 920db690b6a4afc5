//! The engine behind the real server: a burst of mixed requests with dropped streams leaves the pool
//! all free or cached; the queue limit answers 429 with Retry-After; prompts beyond --max-model-len get
//! 400; prefix-cache hits show in `cached_tokens` and the metrics.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{assert_openai_error, Server};
use serde_json::json;

fn idle(s: &Server) -> bool {
    s.metric("kvgate:kv_cache_usage_perc") == 0.0
        && s.metric("kvgate:num_requests_running") == 0.0
        && s.metric("kvgate:num_requests_waiting") == 0.0
}

#[test]
fn burst_with_dropped_streams_returns_every_block() {
    let s = Server::start(&["--max-num-batched-tokens", "256"]);
    std::thread::scope(|sc| {
        for i in 0..64 {
            let s = &s;
            sc.spawn(move || {
                let stream = i % 2 == 0;
                let body = json!({"prompt": format!("Story {i}: once upon a time there was"), "max_tokens": 40 + i % 7,
                                  "temperature": 0.8, "seed": i, "stream": stream, "ignore_eos": true});
                if i % 4 == 0 {
                    // open a stream, read a little, hang up
                    let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
                    let b = body.to_string();
                    write!(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{b}", b.len()).unwrap();
                    let mut buf = [0u8; 600];
                    let _ = c.read(&mut buf);
                    drop(c);
                } else if stream {
                    let ev = s.stream("/v1/completions", &body);
                    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"));
                } else {
                    let (st, r) = s.post("/v1/completions", &body);
                    assert_eq!(st, 200, "{r}");
                }
            });
        }
    });
    let t0 = Instant::now();
    while !idle(&s) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "blocks still held after the burst"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(s.metric("kvgate:request_success_total") >= 48.0);
}

#[test]
fn queue_full_is_429_with_retry_after_and_long_prompts_are_400() {
    let s = Server::start(&["--max-queue", "1", "--max-num-seqs", "1", "--max-model-len", "256"]);
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "hello ".repeat(300), "max_tokens": 1}),
    );
    assert_openai_error(st, &r, 400);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 256"),
        "{r}"
    );
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 300}));
    assert_openai_error(st, &r, 400);
    let results: Vec<(u16, Vec<(String, String)>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6)
            .map(|i| {
                let s = &s;
                sc.spawn(move || {
                    let (st, hs, _) = s.post_with(
                        "/v1/completions",
                        &[],
                        &json!({"prompt": format!("count {i}"), "max_tokens": 200, "ignore_eos": true, "temperature": 0}),
                    );
                    (st, hs)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let limited: Vec<_> = results.iter().filter(|(st, _)| *st == 429).collect();
    assert!(
        !limited.is_empty(),
        "some requests were refused: {:?}",
        results.iter().map(|r| r.0).collect::<Vec<_>>()
    );
    for (_, hs) in limited {
        assert!(
            hs.iter().any(|(k, v)| k == "retry-after" && v.parse::<u64>().is_ok()),
            "{hs:?}"
        );
    }
    assert!(results.iter().any(|(st, _)| *st == 200));
}

#[test]
fn prefix_cache_hits_are_reported() {
    let s = Server::start(&[]);
    let system = "You are a meticulous assistant. ".repeat(20);
    let ask = |q: &str| {
        s.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 4, "temperature": 0}),
        )
    };
    let (_, a) = ask("What is 2+2?");
    let (_, b) = ask("Name a color.");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 128 && cached % 16 == 0, "{b}");
    assert!(s.metric("kvgate:prefix_cache_hits_total") >= cached as f64);
    let off = Server::start(&["--no-enable-prefix-caching"]);
    let ask = |q: &str| {
        off.post(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "max_tokens": 4, "temperature": 0}),
        )
    };
    ask("What is 2+2?");
    let (_, b2) = ask("Name a color.");
    assert_eq!(b2["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        b2["choices"][0]["message"], b["choices"][0]["message"],
        "same answer with and without the cache"
    );
}

/// The second tier on the default model: a ~300-token state pushed out of a 48-block cache by four
/// other prompts is restored from host memory (its next turn counts the restored tokens as cached; the
/// metrics count restores, bytes and hits by tier); at a graceful stop the hot cache goes to the spill
/// file, and the next server over the same directory, without any memory tier, restores the state
/// from disk on its first request.
#[test]
fn evicted_state_is_restored_and_survives_a_restart_through_the_spill_file() {
    let dir = std::env::temp_dir().join(format!("kvgate-e2e-spill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let base = ["--num-kv-blocks", "48", "--session-window", "0", "--kv-offload-dir", d];
    let state = |i: usize| {
        let mut s = format!("Ticket {i}. ");
        for j in 0..14 {
            s.push_str(&format!(
                "Line {j}: the parcel for order {} is late and the customer asks why. ",
                i * 100 + j
            ));
        }
        s
    };
    let ask = |s: &Server, i: usize, tail: &str| -> (u64, u64) {
        let body = json!({"prompt": format!("{}{tail}", state(i)), "max_tokens": 1, "temperature": 0});
        let (st, r) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{r}");
        let u = &r["usage"];
        (
            u["prompt_tokens"].as_u64().unwrap(),
            u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        )
    };
    let mut args = base.to_vec();
    args.extend(["--kv-offload-memory", "64MiB"]);
    let mut s = Server::start(&args);
    let (prompt, _) = ask(&s, 0, " Summary:");
    assert!(prompt >= 250, "the state is {prompt} tokens");
    for i in 1..5 {
        ask(&s, i, " Summary:");
    }
    let (_, cached) = ask(&s, 0, " Reply:");
    assert!(cached >= prompt - 32, "restored: {cached} of {prompt}");
    // the engine records its metrics after the step that answered: wait for them
    let settled = |s: &Server, name: &str, at_least: f64| {
        let t0 = Instant::now();
        while s.metric(name) < at_least && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        s.metric(name)
    };
    let restored = settled(&s, "kvgate:kv_tier_restored_blocks_total", (prompt / 16 - 2) as f64);
    assert!(restored >= (prompt / 16 - 2) as f64, "restored blocks: {restored}");
    assert!(s.metric("kvgate:kv_tier_restore_bytes_total") > 0.0);
    assert!(
        s.metric("kvgate:prefix_cache_hits_by_tier_total{model_name=\"smollm2-135m-instruct\",tier=\"memory\"}")
            >= 200.0
    );
    assert!(s.metric("kvgate:kv_cache_evictions_total") > 0.0);
    assert!(s.metric("kvgate:kv_tier_blocks") > 0.0);
    // a graceful stop writes the hot cache out
    let pid = s.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    while s.child.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        s.log_text().contains("hot cache written to the spill file"),
        "{}",
        s.log_text()
    );
    drop(s);
    let s = Server::start(&base);
    let (_, cached) = ask(&s, 0, " Again:");
    assert!(
        cached >= prompt - 32,
        "restored from the spill file after a restart: {cached} of {prompt}"
    );
    assert!(
        settled(
            &s,
            "kvgate:prefix_cache_hits_by_tier_total{model_name=\"smollm2-135m-instruct\",tier=\"disk\"}",
            200.0
        ) >= 200.0
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
