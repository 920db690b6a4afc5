//! System One benchmark against the real `serve` on the default model (HTTP on loopback):
//! decision latency for 1, 8 and 32 questions over a ~2,000-token state, cold and warm; and the round
//! trip a router makes — the routing question asked as a chat completion (max_tokens 5, parse the
//! answer) then the follow-up completion, versus `/v1/systemone` then the same follow-up.
//! `cargo bench --bench decisions` prints a table; `KVGATE_BENCH_QUICK=1` stops after the first section
//! (decision latency for 1, 8 and 32 questions, cold and warm); `DECISIONS_CHOICE=1` runs only the choice
//! section, and stops after it; `DECISIONS_MODEL` (a GGUF path) serves that model instead. The choice
//! section compares every read method's cost to a plain read over a warm state: rotations (`ordered`)
//! and branches (`set`, tree attention), by option name (`cloze`), with and without calibration, and
//! the served model's default read (no `x_read`), for 3, 6, 8 and 26 options
//! (`DECISIONS_OPTIONS=6,26` some of them; `DECISIONS_DEFAULT_ONLY=1` only plain and the default read).

use std::time::Instant;

mod common;

use common::{post, Serve};
use serde_json::{json, Value};

fn start() -> Serve {
    match std::env::var_os("DECISIONS_MODEL") {
        Some(m) => common::start_model(std::path::Path::new(&m), "bench", &["--kv-cache-memory", "2GiB"]),
        None => common::start(&["--kv-cache-memory", "2GiB"]),
    }
}

fn state_text() -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 7100 {
        s.push_str(&format!(
            "Entry {i}: order {} shipped from the {} warehouse, status {}. ",
            i * 37 % 101,
            ["north", "south", "east"][i % 3],
            ["ok", "late", "lost"][i % 3]
        ));
        i += 1;
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Team names for the choice section (26, distinct words).
const TEAMS: [&str; 26] = [
    "accounts",
    "billing",
    "compliance",
    "data",
    "engineering",
    "finance",
    "growth",
    "hardware",
    "infra",
    "journeys",
    "kiosk",
    "legal",
    "mobile",
    "network",
    "operations",
    "payments",
    "quality",
    "research",
    "sales",
    "security",
    "support",
    "tax",
    "usability",
    "vendors",
    "web",
    "warehouse",
];

fn main() {
    let s = start();
    let port = s.1;
    let state = state_text();
    post(port, "/v1/completions", &json!({"prompt": "warm up", "max_tokens": 4}));
    let mut rows: Vec<(String, String)> = vec![];
    // DECISIONS_CHOICE=1: only the choice section (plain versus ordered and calibrated reads)
    let sizes: &[usize] = if std::env::var_os("DECISIONS_CHOICE").is_some() {
        &[]
    } else {
        &[1, 8, 32]
    };
    for &k in sizes {
        let qs: serde_json::Map<String, Value> = (0..k)
            .map(|i| {
                (
                    format!("q{i}"),
                    json!({"type": "noul", "instructions": format!("Is entry {i} late?")}),
                )
            })
            .collect();
        let mut cold = vec![];
        let mut warm = vec![];
        let mut tokens = (0, 0);
        for rep in 0..3 {
            let salt = format!("k{k}-r{rep}");
            let req = json!({"state": state, "questions": qs, "cache_salt": salt});
            let t0 = Instant::now();
            let r = post(port, "/v1/systemone", &req);
            cold.push(t0.elapsed().as_secs_f64());
            let input = r["usage"]["input_tokens"].as_u64().unwrap();
            tokens.0 = input - r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
            let t0 = Instant::now();
            let r = post(port, "/v1/systemone", &req);
            warm.push(t0.elapsed().as_secs_f64());
            tokens.1 = input - r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
        }
        rows.push((
            format!("decision, {k} question(s), ~2,000-token state"),
            format!(
                "cold {:.2} s ({} tokens computed), warm {:.3} s ({} tokens computed)",
                median(cold),
                tokens.0,
                median(warm),
                tokens.1
            ),
        ));
    }
    if std::env::var_os("KVGATE_BENCH_QUICK").is_some() {
        return print_table(rows);
    }
    let choice_only = std::env::var_os("DECISIONS_CHOICE").is_some();
    // A choice read plain (one read, as listed) versus ordered (a canonical order and more orders of it,
    // each one more forked read of the question), on a warm state: what order-invariance costs. And
    // calibrated on top: its content-free prior read alongside (a question shape never seen), or taken
    // from the prior cache (the question asked before over another state, as an agent loop does).
    // DECISIONS_OPTIONS=6,26: only those option counts; DECISIONS_DEFAULT_ONLY=1: only plain and the
    // default read (new shape, asked before), for a model whose all-rotation reads take long
    let counts: Vec<usize> = std::env::var("DECISIONS_OPTIONS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![3, 6, 8, 26]);
    let default_only = std::env::var_os("DECISIONS_DEFAULT_ONLY").is_some();
    for n in counts {
        // teams named as people name them (distinct words, so a cloze read tells them apart by name)
        let criteria: serde_json::Map<String, Value> = TEAMS[..n]
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), json!(format!("handles region {i}"))))
            .collect();
        let mut cost = vec![];
        // (row, x_read — None: left out, the served model's default read —, x_orders — 0: left out, the
        // served model's default —, the question asked before over another state)
        let methods: [(&str, Option<&str>, usize, bool); 14] = [
            ("plain", Some("plain"), 1, false),
            ("ordered, all orders", Some("ordered"), 8, false),
            ("ordered, 2 orders", Some("ordered"), 2, false),
            (
                "ordered+calibrated, all orders, new question shape",
                Some("ordered+calibrated"),
                8,
                false,
            ),
            (
                "ordered+calibrated, 2 orders, new question shape",
                Some("ordered+calibrated"),
                2,
                false,
            ),
            (
                "ordered+calibrated, 2 orders, question asked before",
                Some("ordered+calibrated"),
                2,
                true,
            ),
            ("the model's default read, new question shape", None, 0, false),
            ("the model's default read, question asked before", None, 0, true),
            ("set (the options as branches of one read)", Some("set"), 0, false),
            ("set+calibrated, new question shape", Some("set+calibrated"), 0, false),
            ("set+calibrated, question asked before", Some("set+calibrated"), 0, true),
            ("cloze (by option name, one read)", Some("cloze"), 0, false),
            (
                "cloze+calibrated, new question shape",
                Some("cloze+calibrated"),
                0,
                false,
            ),
            (
                "cloze+calibrated, question asked before",
                Some("cloze+calibrated"),
                0,
                true,
            ),
        ];
        for (mi, (row, read, orders, prior_known)) in methods.iter().enumerate() {
            // plain (the first) always runs
            if default_only && mi > 0 && read.is_some() {
                continue;
            }
            // a new question each time over the same (warm) state: the question's tokens are computed
            let req = |rep: usize, state: &str| {
                let mut r = json!({"state": state, "cache_salt": format!("choice{n}"),
                       "questions": {"q": {"type": "choice", "criteria": criteria,
                                           "instructions": format!("Which team handles the late orders of batch {mi}-{rep}?")}}});
                if let Some(read) = read {
                    r["x_read"] = json!(read);
                }
                if *orders > 0 {
                    r["x_orders"] = json!(orders);
                }
                r
            };
            post(port, "/v1/systemone", &req(0, &state)); // warms the state
            let mut warm = vec![];
            for rep in 1..=5 {
                if *prior_known {
                    post(port, "/v1/systemone", &req(rep, "Another short state."));
                }
                let t0 = Instant::now();
                post(port, "/v1/systemone", &req(rep, &state));
                warm.push(t0.elapsed().as_secs_f64());
            }
            cost.push((row, median(warm)));
        }
        let plain = cost[0].1;
        for (name, c) in &cost {
            rows.push((
                format!("choice of {n}, warm ~2,000-token state: {name}"),
                format!("{c:.3} s ({:.2}x plain)", c / plain),
            ));
        }
    }
    if choice_only {
        return print_table(rows);
    }
    // The router's round trip.
    let conversation = |salt: usize| {
        json!([
            {"role": "system", "content": format!("You are a support agent (session {salt}).")},
            {"role": "user", "content": format!("{state} My payouts are failing. What should I do?")}
        ])
    };
    let mut via_chat = vec![];
    let mut via_s1 = vec![];
    for rep in 0..3 {
        let msgs = conversation(2 * rep);
        let t0 = Instant::now();
        let mut route_msgs = msgs.as_array().unwrap().clone();
        route_msgs.push(json!({"role": "user", "content": "Which team should handle this: billing or technical? Answer with one word."}));
        let r = post(
            port,
            "/v1/chat/completions",
            &json!({"messages": route_msgs, "max_tokens": 5, "temperature": 0}),
        );
        let answer = r["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_lowercase();
        let _team = if answer.contains("tech") {
            "technical"
        } else {
            "billing"
        };
        post(
            port,
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_tokens": 16, "temperature": 0}),
        );
        via_chat.push(t0.elapsed().as_secs_f64());

        let msgs = conversation(2 * rep + 1);
        let t0 = Instant::now();
        let r = post(
            port,
            "/v1/systemone",
            &json!({"state": msgs, "questions": {"team": {"type": "choice", "instructions": "Which team should handle this?",
                     "criteria": {"billing": null, "technical": null}}}}),
        );
        let _team = r["answers"]["team"]["choice"].clone();
        post(
            port,
            "/v1/chat/completions",
            &json!({"messages": msgs, "max_tokens": 16, "temperature": 0}),
        );
        via_s1.push(t0.elapsed().as_secs_f64());
    }
    let (a, b) = (median(via_chat), median(via_s1));
    rows.push(("route as chat (max_tokens 5) + follow-up".into(), format!("{a:.2} s")));
    rows.push((
        "route via /v1/systemone + follow-up".into(),
        format!("{b:.2} s ({:.2}x faster)", a / b),
    ));
    // Eight routing questions at once over a cold state: eight concurrent chat completions (each pays
    // the state: nothing is cached yet when they arrive together) versus one decision.
    let questions: Vec<String> = (0..8)
        .map(|i| format!("Is entry {i} late? Answer yes or no."))
        .collect();
    let msgs = conversation(100);
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for q in &questions {
            let mut m = msgs.as_array().unwrap().clone();
            m.push(json!({"role": "user", "content": q}));
            sc.spawn(move || {
                post(
                    port,
                    "/v1/chat/completions",
                    &json!({"messages": m, "max_tokens": 5, "temperature": 0}),
                )
            });
        }
    });
    let chat8 = t0.elapsed().as_secs_f64();
    let msgs = conversation(101);
    let qs: serde_json::Map<String, Value> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| (format!("q{i}"), json!({"type": "noul", "instructions": q})))
        .collect();
    let t0 = Instant::now();
    post(port, "/v1/systemone", &json!({"state": msgs, "questions": qs}));
    let s1_8 = t0.elapsed().as_secs_f64();
    rows.push((
        "8 questions, cold state: 8 concurrent chat completions (max_tokens 5)".into(),
        format!("{chat8:.2} s"),
    ));
    rows.push((
        "8 questions, cold state: one /v1/systemone".into(),
        format!("{s1_8:.2} s ({:.2}x faster)", chat8 / s1_8),
    ));
    print_table(rows);
}

fn print_table(rows: Vec<(String, String)>) {
    println!("\n| benchmark (default model, 2 threads, HTTP) | result |\n|---|---|");
    for (k, v) in rows {
        println!("| {k} | {v} |");
    }
}
