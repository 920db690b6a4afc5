//! A replica killed mid-run, with and without a KV tier shared in Redis (`--kv-shared`), on the
//! default model (or `SHARED_MODEL`, a GGUF path), each replica `--threads 1`:
//!
//! 1. 16 agent sessions over 2 replicas (session i lives on replica i mod 2, as consistent hashing
//!    puts it; the bench routes itself, so the numbers are the tier's, not a router's), each a
//!    ~4,000-token conversation (`SHARED_TOKENS`): first turns on their replicas, then replica A is
//!    killed with SIGKILL and every session's next turn (the conversation plus the reply and a new
//!    user message, `max_tokens` 1: its latency is the time to the first token) goes to replica B.
//!    Reported per arm: the moved sessions' cached share and median time to the first token, and the
//!    same for the sessions that stayed; the moved sessions' time to the first token with the tier ÷
//!    without it (a recompute).
//! 2. The cost when no replica is lost: one replica, 4 sessions (~2,000 tokens) whose warm follow-ups
//!    decode 256 tokens, with and without the shared tier: the follow-ups' median time to the first
//!    token and decode rate.
//!
//! Needs `redis-server` (Debian's; scripts/setup-test-deps.sh installs it). Run:
//! `cargo bench --bench shared_tier` (~12 minutes on 2 cores; `SHARED_PARTS=two` only the second,
//! `SHARED_ROUNDS` its alternating rounds, default 3).

use std::time::Instant;

mod common;

use common::{post, start, start_model, Serve};
use serde_json::{json, Value};

#[path = "../tests/common/redis_server.rs"]
mod redis_server;

fn redis() -> redis_server::Redis {
    redis_server::Redis::start(None, &[]).expect("redis-server (scripts/setup-test-deps.sh installs it)")
}

fn replica(shared: Option<&str>) -> Serve {
    let mut args = vec!["--threads", "1", "--kv-cache-memory", "4GiB", "--max-model-len", "8192"];
    if let Some(url) = shared {
        args.extend(["--kv-shared", url]);
    }
    match std::env::var_os("SHARED_MODEL") {
        Some(m) => start_model(std::path::Path::new(&m), "model", &args),
        None => start(&args),
    }
}

/// About `tokens` tokens of a session's notes, unique to it from the first line.
fn conversation(id: usize, tokens: usize) -> Vec<Value> {
    let mut s = format!("Session {id}. Repository notes: ");
    let mut i = 0;
    // about 2.9 characters a token in this text (SmolLM2's tokenizer)
    while s.len() * 10 < tokens * 29 {
        s.push_str(&format!(
            "file src/mod_{}.rs defines fn handler_{}() returning {}; ",
            (i * 31 + id) % 97,
            i,
            ["Ok", "Err", "None"][i % 3]
        ));
        i += 1;
    }
    vec![
        json!({"role": "system", "content": format!("You are coding agent {id}.")}),
        json!({"role": "user", "content": format!("{s}\nWhich handler should change first?")}),
    ]
}

/// One chat turn: (reply, prompt tokens, cached tokens, seconds).
fn turn(port: u16, msgs: &[Value], max_tokens: usize) -> (String, f64, f64, f64) {
    let t0 = Instant::now();
    let r = post(
        port,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true}),
    );
    let secs = t0.elapsed().as_secs_f64();
    let u = &r["usage"];
    (
        r["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string(),
        u["prompt_tokens"].as_f64().unwrap_or(0.0),
        u["prompt_tokens_details"]["cached_tokens"].as_f64().unwrap_or(0.0),
        secs,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Part 1, one arm: (moved: cached share, median s; stayed: cached share, median s).
fn killed(shared: bool, sessions: usize, tokens: usize) -> ((f64, f64), (f64, f64)) {
    let store = shared.then(redis);
    let url = store.as_ref().map(|r| r.url());
    let mut reps = [Some(replica(url.as_deref())), Some(replica(url.as_deref()))];
    let ports: Vec<u16> = reps.iter().map(|r| r.as_ref().unwrap().1).collect();
    let mut convs: Vec<Vec<Value>> = (0..sessions).map(|i| conversation(i, tokens)).collect();
    for (i, c) in convs.iter_mut().enumerate() {
        let (reply, ..) = turn(ports[i % 2], c, 16);
        c.push(json!({"role": "assistant", "content": reply}));
        c.push(json!({"role": "user", "content": "Now write the change."}));
    }
    // replica A dies (SIGKILL) with its sessions' state
    drop(reps[0].take());
    let (mut moved, mut stayed) = ((0.0, 0.0, vec![]), (0.0, 0.0, vec![]));
    for (i, c) in convs.iter().enumerate() {
        let (_, prompt, cached, secs) = turn(ports[1], c, 1);
        let side = if i % 2 == 0 { &mut moved } else { &mut stayed };
        side.0 += prompt;
        side.1 += cached;
        side.2.push(secs);
        eprintln!(
            "shared {shared}: session {i} ({}) {cached}/{prompt} cached, {secs:.2} s",
            if i % 2 == 0 { "moved" } else { "stayed" }
        );
    }
    (
        (moved.1 / moved.0, median(moved.2)),
        (stayed.1 / stayed.0, median(stayed.2)),
    )
}

/// Part 2, one arm: (median time to the first token of warm follow-ups, decode tokens/s).
fn no_loss(shared: bool) -> (f64, f64) {
    let store = shared.then(redis);
    let url = store.as_ref().map(|r| r.url());
    let rep = replica(url.as_deref());
    let (mut ttft, mut rates) = (vec![], vec![]);
    for i in 0..4 {
        let mut c = conversation(100 + i, 2000);
        let (reply, ..) = turn(rep.1, &c, 16);
        c.push(json!({"role": "assistant", "content": reply}));
        c.push(json!({"role": "user", "content": "Go on."}));
        let (.., first) = turn(rep.1, &c, 1);
        // the same follow-up again, decoding 256 tokens: its rate past the first token
        let (.., all) = turn(rep.1, &c, 257);
        ttft.push(first);
        rates.push(256.0 / (all - first).max(1e-6));
    }
    (median(ttft), median(rates))
}

fn main() {
    let only_two = std::env::var("SHARED_PARTS").is_ok_and(|p| p == "two");
    let sessions = 16;
    let tokens: usize = std::env::var("SHARED_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    if !only_two {
        part_one(sessions, tokens);
    }
    // alternating arms, `SHARED_ROUNDS` (default 3) each; medians of the rounds
    let rounds: usize = std::env::var("SHARED_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let (mut off, mut on) = ((vec![], vec![]), (vec![], vec![]));
    for _ in 0..rounds {
        let (a, b) = no_loss(false);
        off.0.push(a);
        off.1.push(b);
        let (a, b) = no_loss(true);
        on.0.push(a);
        on.1.push(b);
    }
    let (off, on) = ((median(off.0), median(off.1)), (median(on.0), median(on.1)));
    println!("no replica lost, 4 warm follow-ups (~2,000 tokens), one replica, {rounds} rounds:\n");
    println!("| arm | follow-up first token s | decode tok/s |");
    println!("|---|---|---|");
    println!("| without | {:.3} | {:.1} |", off.0, off.1);
    println!("| --kv-shared | {:.3} | {:.1} |", on.0, on.1);
    println!(
        "\nwith ÷ without: first token {:.2}×, decode {:.2}×",
        on.0 / off.0,
        on.1 / off.1
    );
}

fn part_one(sessions: usize, tokens: usize) {
    println!("16 sessions of ~{tokens} tokens over 2 replicas, replica A killed after the first turns\n");
    let (without, with) = (killed(false, sessions, tokens), killed(true, sessions, tokens));
    println!("| arm | moved: cached | moved: first token s | stayed: cached | stayed: first token s |");
    println!("|---|---|---|---|---|");
    for (name, ((mc, ms), (sc, ss))) in [("without a shared tier", without), ("--kv-shared (Redis)", with)] {
        println!(
            "| {name} | {:.1}% | {ms:.2} | {:.1}% | {ss:.2} |",
            100.0 * mc,
            100.0 * sc
        );
    }
    println!(
        "\nmoved sessions' first token with the shared tier ÷ a recompute: {:.2}×\n",
        with.0 .1 / without.0 .1
    );
}
