//! The pain `/v1/systemone` removes, measured on an agent turn as people run one today: a routing call
//! to a separate router (a second `serve` with its own cache, the question as a chat completion with
//! max_tokens 5, the reply parsed), then the follow-up completion on the main server; versus
//! `/v1/systemone` and the same follow-up on one server. Both servers run the default model.
//!
//! 1. A cold ~2,000-token conversation, 1 and 8 routing questions (the router's 8 chat completions sent
//!    concurrently, as an agent framework's `gather` does): time to the routing answers, time to the
//!    end of the follow-up (max_tokens 16), and the follow-up's cached-token share.
//! 2. 32 concurrent conversations (~1,000-token states) over a cache that holds only 8 of them:
//!    each routes then follows up as soon as its answer arrives. Reported per arm — router + main;
//!    systemone under today's policy (arrival order, nothing retained) without and with `keep_alive`
//!    60 s; systemone on the defaults (session retention, cache-aware admission) — the follow-ups'
//!    cached-token share, failed requests (with their status) and the wall time.
//!
//! 3. Staggered, multi-turn sessions: 8/16/32/64 conversations (~500-token states) arriving 250 ms
//!    apart over a cache that holds 4 of them, each running two turns (decision, then follow-up; the
//!    second turn's state is the first's plus the reply and a new user message). Per arm — today's
//!    policy, the defaults, the defaults with a second tier in host memory (`--kv-offload-memory 4GiB`)
//!    — the follow-ups' cached share, the per-session hit rate (lowest and median), p50/p99 decision
//!    and follow-up latency, failed requests and the wall time.
//!
//! `cargo bench --bench agent_turn` prints the tables (~40 minutes on 2 cores; `AGENT_TURN_PARTS=two`
//! runs only the second, `AGENT_TURN_ARMS=defaults` only the arms whose name holds the word,
//! `AGENT_TURN_SIZES=8,32` only those session counts of part three).

use std::time::Instant;

mod common;

use common::{post, Serve};
use serde_json::{json, Value};

/// About `chars / 3.5` tokens of order log, unique to `id` from its first line (so nothing is cached).
fn state_text(id: usize, chars: usize) -> String {
    let mut s = format!("Support ticket {id}. ");
    let mut i = 0;
    while s.len() < chars {
        s.push_str(&format!(
            "Entry {i}: order {} shipped from the {} warehouse, status {}. ",
            (i * 37 + id) % 101,
            ["north", "south", "east"][i % 3],
            ["ok", "late", "lost"][i % 3]
        ));
        i += 1;
    }
    s
}

fn conversation(id: usize, chars: usize) -> Value {
    json!([
        {"role": "system", "content": format!("You are a support agent (conversation {id}).")},
        {"role": "user", "content": format!("{} My payouts are failing. What should I do?", state_text(id, chars))}
    ])
}

/// The routing questions of a turn: which team, then whether entry i is late.
fn chat_questions(k: usize) -> Vec<String> {
    (0..k)
        .map(|i| match i {
            0 => "Which team should handle this: billing or technical? Answer with one word.".to_string(),
            _ => format!("Is entry {i} late? Answer yes or no."),
        })
        .collect()
}

fn decision_questions(k: usize) -> Value {
    (0..k)
        .map(|i| {
            let q = match i {
                0 => json!({"type": "choice", "instructions": "Which team should handle this?",
                            "criteria": {"billing": null, "technical": null}}),
                _ => json!({"type": "noul", "instructions": format!("Is entry {i} late?")}),
            };
            (format!("q{i}"), q)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// POSTs JSON; the status and the JSON reply (Null when it is not JSON).
fn post_status(port: u16, path: &str, body: &Value) -> (u16, Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    match agent.post(&format!("http://127.0.0.1:{port}{path}")).send_json(body) {
        Ok(mut r) => (
            r.status().as_u16(),
            r.body_mut().read_json::<Value>().unwrap_or(Value::Null),
        ),
        Err(_) => (0, Value::Null),
    }
}

/// The router's turn: `k` chat completions on `router` (concurrently), each reply parsed.
fn route_by_chat(router: u16, msgs: &Value, k: usize) -> Vec<(u16, Value)> {
    std::thread::scope(|sc| {
        let hs: Vec<_> = chat_questions(k)
            .into_iter()
            .map(|q| {
                let mut m = msgs.as_array().unwrap().clone();
                m.push(json!({"role": "user", "content": q}));
                sc.spawn(move || {
                    post_status(
                        router,
                        "/v1/chat/completions",
                        &json!({"messages": m, "max_tokens": 5, "temperature": 0}),
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn follow_up(port: u16, msgs: &Value) -> (u16, Value) {
    post_status(
        port,
        "/v1/chat/completions",
        &json!({"messages": msgs, "max_tokens": 16, "temperature": 0}),
    )
}

/// (cached, prompt) tokens of a chat reply.
fn cached(r: &Value) -> (u64, u64) {
    let u = &r["usage"];
    (
        u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        u["prompt_tokens"].as_u64().unwrap_or(0),
    )
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn part_one(rows: &mut Vec<String>) {
    let router = common::start(&["--kv-cache-memory", "1GiB"]);
    let main = common::start(&["--kv-cache-memory", "1GiB"]);
    for s in [&router, &main] {
        post(s.1, "/v1/completions", &json!({"prompt": "warm up", "max_tokens": 2}));
    }
    let mut id = 0;
    for k in [1usize, 8] {
        // (route s, total s, cached share) per rep, per arm
        let mut arms: [Vec<(f64, f64, f64)>; 2] = [vec![], vec![]];
        for _rep in 0..2 {
            id += 1;
            let msgs = conversation(id, 7100);
            let t0 = Instant::now();
            let answers = route_by_chat(router.1, &msgs, k);
            assert!(answers.iter().all(|a| a.0 == 200), "router failed");
            let route = t0.elapsed().as_secs_f64();
            let (st, r) = follow_up(main.1, &msgs);
            assert_eq!(st, 200);
            let (c, p) = cached(&r);
            arms[0].push((route, t0.elapsed().as_secs_f64(), c as f64 / p as f64));

            id += 1;
            let msgs = conversation(id, 7100);
            let t0 = Instant::now();
            let (st, _) = post_status(
                main.1,
                "/v1/systemone",
                &json!({"state": msgs, "questions": decision_questions(k)}),
            );
            assert_eq!(st, 200);
            let route = t0.elapsed().as_secs_f64();
            let (st, r) = follow_up(main.1, &msgs);
            assert_eq!(st, 200);
            let (c, p) = cached(&r);
            arms[1].push((route, t0.elapsed().as_secs_f64(), c as f64 / p as f64));
        }
        let summary = |a: &[(f64, f64, f64)]| {
            (
                mean(&a.iter().map(|x| x.0).collect::<Vec<_>>()),
                mean(&a.iter().map(|x| x.1).collect::<Vec<_>>()),
                mean(&a.iter().map(|x| x.2).collect::<Vec<_>>()),
            )
        };
        let (a, b) = (summary(&arms[0]), summary(&arms[1]));
        rows.push(format!(
            "| {k} question(s) | router (chat, max_tokens 5) + main | {:.2} s | {:.2} s | {:.1}% |",
            a.0,
            a.1,
            100.0 * a.2
        ));
        rows.push(format!(
            "| {k} question(s) | /v1/systemone + follow-up, one server | {:.2} s ({:.1}x) | {:.2} s ({:.1}x) | {:.1}% |",
            b.0,
            a.0 / b.0,
            b.1,
            a.1 / b.1,
            100.0 * b.2
        ));
    }
}

/// 32 conversations at once; `route` runs one conversation's routing (returns its status).
fn crowd(main: u16, first_id: usize, route: &(dyn Fn(&Value) -> u16 + Sync)) -> String {
    let t0 = Instant::now();
    let results: Vec<(u16, u16, u64, u64)> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..32)
            .map(|i| {
                sc.spawn(move || {
                    let msgs = conversation(first_id + i, 3550);
                    let routed = route(&msgs);
                    let (st, r) = follow_up(main, &msgs);
                    let (c, p) = cached(&r);
                    (routed, st, c, p)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let (c, p): (u64, u64) = results
        .iter()
        .filter(|r| r.1 == 200)
        .fold((0, 0), |a, r| (a.0 + r.2, a.1 + r.3));
    let mut failed: Vec<String> = results
        .iter()
        .flat_map(|r| [("route", r.0), ("follow-up", r.1)])
        .filter(|(_, s)| *s != 200)
        .map(|(what, s)| format!("{what} {s}"))
        .collect();
    failed.sort();
    failed.dedup_by(|a, b| a == b);
    let n_failed = results.iter().filter(|r| r.0 != 200 || r.1 != 200).count();
    format!(
        "{:.1}% ({c} of {p}) | {n_failed} of 32{} | {wall:.1} s |",
        100.0 * c as f64 / p.max(1) as f64,
        if failed.is_empty() {
            String::new()
        } else {
            format!(" ({})", failed.join(", "))
        }
    )
}

fn part_two(rows: &mut Vec<String>) {
    // ~1,000-token states plus question and follow-up: 72 blocks of 16 each; room for 8
    let blocks = (8 * 72).to_string();
    let args = ["--num-kv-blocks", blocks.as_str()];
    // AGENT_TURN_ARMS=word runs only the arms whose name holds it
    let only = std::env::var("AGENT_TURN_ARMS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|w| name.contains(w));
    if wanted("router") {
        let router = common::start(&args);
        let main = common::start(&args);
        let r = crowd(main.1, 1000, &|m| route_by_chat(router.1, m, 1)[0].0);
        rows.push(format!("| router (chat, max_tokens 5) + main | {r}"));
    }
    // today's policy (arrival order, nothing retained), with and without keep_alive pins, then the
    // defaults: session retention and cache-aware admission
    let today = ["--session-window", "0", "--admission", "fifo", "--decode-floor", "0"];
    let arms: [(&str, &[&str], Option<f64>, usize); 3] = [
        ("arrival order, no retention", &today, None, 2000),
        ("arrival order, keep_alive 60 s", &today, Some(60.0), 3000),
        ("defaults: session retention + cache-aware admission", &[], None, 4000),
    ];
    for (name, extra, keep, first) in arms {
        if !wanted(name) {
            continue;
        }
        let mut a: Vec<&str> = args.to_vec();
        a.extend_from_slice(extra);
        let main: Serve = common::start(&a);
        let r = crowd(main.1, first, &|m| {
            let mut body = json!({"state": m, "questions": decision_questions(1)});
            if let Some(k) = keep {
                body["keep_alive"] = json!(k);
            }
            post_status(main.1, "/v1/systemone", &body).0
        });
        rows.push(format!("| /v1/systemone + follow-up, {name} | {r}"));
    }
}

/// One session's record: per turn (decision s, follow-up s, cached, prompt, statuses ok).
type Turns = Vec<(f64, f64, u64, u64, bool)>;

/// A session of `turns` turns starting after `delay`: decision over the state, follow-up over the same
/// state, then the reply and a new user message extend the state.
fn session(port: u16, id: usize, chars: usize, turns: usize, delay: std::time::Duration) -> Turns {
    std::thread::sleep(delay);
    let mut msgs = conversation(id, chars);
    let mut out = vec![];
    for t in 0..turns {
        let t0 = Instant::now();
        let (st, _) = post_status(
            port,
            "/v1/systemone",
            &json!({"state": msgs, "questions": decision_questions(1)}),
        );
        let decided = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let (st2, r) = follow_up(port, &msgs);
        let (c, p) = cached(&r);
        out.push((decided, t1.elapsed().as_secs_f64(), c, p, st == 200 && st2 == 200));
        let reply = r["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
        let m = msgs.as_array_mut().unwrap();
        m.push(json!({"role": "assistant", "content": reply}));
        m.push(json!({"role": "user", "content": format!("Thanks. Next question {t}: what about entry {}?", t + 3)}));
    }
    out
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

fn part_three(rows: &mut Vec<String>) {
    // ~500-token states, two turns: ~40 blocks of 16 a session at its second turn; room for 4
    let (chars, turns, states) = (1800, 2, 4);
    let blocks = (states * 40).to_string();
    let only = std::env::var("AGENT_TURN_ARMS").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|w| name.contains(w));
    let sizes: Vec<usize> = std::env::var("AGENT_TURN_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 16, 32, 64]);
    let today = ["--session-window", "0", "--admission", "fifo", "--decode-floor", "0"];
    let tier = ["--kv-offload-memory", "4GiB"];
    let arms: [(&str, &[&str]); 3] = [
        ("today: arrival order, no retention", &today),
        ("defaults: retention + cache-aware admission", &[]),
        ("defaults + second tier (4 GiB host memory)", &tier),
    ];
    let mut id = 10_000;
    for &n in &sizes {
        for (name, extra) in arms {
            if !wanted(name) {
                continue;
            }
            let mut a = vec!["--num-kv-blocks", blocks.as_str()];
            a.extend_from_slice(extra);
            let main = common::start(&a);
            post(
                main.1,
                "/v1/completions",
                &json!({"prompt": "warm up", "max_tokens": 2}),
            );
            id += 1000;
            let t0 = Instant::now();
            let all: Vec<Turns> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..n)
                    .map(|i| {
                        let port = main.1;
                        sc.spawn(move || {
                            session(
                                port,
                                id + i,
                                chars,
                                turns,
                                std::time::Duration::from_millis(250 * i as u64),
                            )
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let wall = t0.elapsed().as_secs_f64();
            let flat: Vec<_> = all.iter().flatten().collect();
            let (c, p) = flat.iter().fold((0, 0), |a, x| (a.0 + x.2, a.1 + x.3));
            let failed = flat.iter().filter(|x| !x.4).count();
            let mut per: Vec<f64> = all
                .iter()
                .map(|s| {
                    let (c, p) = s.iter().fold((0, 0), |a, x| (a.0 + x.2, a.1 + x.3));
                    c as f64 / p.max(1) as f64
                })
                .collect();
            let (lo, med) = (percentile(&mut per, 0.0), percentile(&mut per, 0.5));
            let mut dec: Vec<f64> = flat.iter().map(|x| x.0).collect();
            let mut fol: Vec<f64> = flat.iter().map(|x| x.1).collect();
            let restored = common::metric(main.1, "kvgate:kv_tier_restored_blocks_total");
            let secs = common::metric(main.1, "kvgate:kv_tier_restore_seconds_total");
            let rate = common::metric(main.1, "kvgate:kv_tier_restore_bytes_total") / secs.max(1e-9);
            if restored > 0.0 {
                // restore against re-prefill, per 1,000 tokens: a cold ~1,000-token prompt's time to
                // its one token on the same server, now
                let t = Instant::now();
                let r = post(
                    main.1,
                    "/v1/completions",
                    &json!({"prompt": state_text(id + 999, 3550), "max_tokens": 1}),
                );
                let prefill = t.elapsed().as_secs_f64() / r["usage"]["prompt_tokens"].as_f64().unwrap_or(1.0) * 1000.0;
                let restore = secs / (restored * 16.0) * 1000.0;
                println!(
                    "restore {:.2} ms per 1,000 tokens against re-prefill {:.0} ms ({:.3}%)",
                    restore * 1e3,
                    prefill * 1e3,
                    100.0 * restore / prefill
                );
            }
            rows.push(format!(
                "| {n} ({:.0}x) | {name} | {:.1}% | {:.0}% / {:.0}% | {:.1} / {:.1} s | {:.1} / {:.1} s | {failed} of {} | {wall:.0} s | {} |",
                n as f64 / states as f64,
                100.0 * c as f64 / p.max(1) as f64,
                100.0 * lo,
                100.0 * med,
                percentile(&mut dec, 0.5),
                percentile(&mut dec, 0.99),
                percentile(&mut fol, 0.5),
                percentile(&mut fol, 0.99),
                2 * n * turns,
                if restored > 0.0 {
                    format!("{restored:.0} blocks at {:.1} GB/s", rate / 1e9)
                } else {
                    "-".into()
                }
            ));
            println!("{}", rows.last().unwrap());
        }
    }
}

fn main() {
    // AGENT_TURN_PARTS=two runs only the 32-conversation table
    let parts = std::env::var("AGENT_TURN_PARTS").unwrap_or_else(|_| "one,two,three".into());
    if parts.contains("three") {
        let mut three = vec![];
        println!(
            "\nstaggered sessions (250 ms apart), 2 turns each, ~500-token states, cache of 4 states (160 blocks)\n"
        );
        println!("| sessions (x cache) | arm | follow-ups' cached share | per-session hit rate (lowest / median) | decision p50 / p99 | follow-up p50 / p99 | requests failed | wall | restored |\n|---|---|---|---|---|---|---|---|---|");
        part_three(&mut three);
        println!("\n(table above, rows as they finished)");
    }
    if parts.contains("one") {
        let mut one = vec![];
        part_one(&mut one);
        println!(
            "\n| questions | turn | routing answered | follow-up done | follow-up cached |\n|---|---|---|---|---|"
        );
        for r in one {
            println!("{r}");
        }
    }
    if !parts.contains("two") {
        return;
    }
    // (part three, when asked, ran first: its rows are printed as they finish)
    let mut two = vec![];
    part_two(&mut two);
    println!(
        "\n32 concurrent conversations (~1,000-token states), cache of {} blocks (8 states)\n",
        8 * 72
    );
    println!("| turn | follow-ups' cached share | conversations failed | wall |\n|---|---|---|---|");
    for r in two {
        println!("{r}");
    }
}
