//! `/v1/decisions` as agents call it, on the default model, in one run beside `/v1/systemone`:
//!
//! 1. **The runner loop.** A DecisionsToolRunner-shaped loop — a ~4,000-token task message, then a
//!    changing observation, one `next_action` choice per step, 8 steps — in 16 concurrent loops over a
//!    KV cache that holds about 4 tasks. Per API and arm (the defaults; the defaults with a second tier
//!    in host memory): the share of each step's task prefix served from the cache (steps after the
//!    first: mean and lowest), p50/p99 step latency, failed requests and the wall time. `/v1/systemone`
//!    runs the same loop with the same conversation as its state.
//! 2. **The breakpoint.** A long shared system prompt marked with a `prompt_cache_breakpoint`, decided
//!    on once; a flood of cold prompts that evicts everything else; the marked prompt again (a new user
//!    message after it): how much of the marked prefix is read from the cache — with the breakpoint,
//!    and without it (the same flood, an unmarked prompt).
//!
//! `cargo bench --bench decisions_api` prints the tables (`DECISIONS_API_LOOPS`, `_STEPS`,
//! `_TASK_CHARS` shrink part one for a quick look, `DECISIONS_API_ARMS=defaults` and
//! `DECISIONS_API_APIS=decisions` narrow it; `DECISIONS_API_PARTS=two` runs only part two).

use std::time::Instant;

mod common;

use common::post;
use serde_json::{json, Value};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A task of about `chars / 3.5` tokens, unique to `id` from its first line.
fn task(id: usize, chars: usize) -> String {
    let mut s = format!("Task {id}: keep the billing pipeline healthy. ");
    let mut i = 0;
    while s.len() < chars {
        s.push_str(&format!(
            "Rule {i}: job {} in the {} queue must finish before {} o'clock or be retried once. ",
            (i * 37 + id) % 101,
            ["north", "south", "east"][i % 3],
            i % 24
        ));
        i += 1;
    }
    s
}

const CHOICES: [(&str, &str); 3] = [
    ("retry", "Retry the failed job"),
    ("escalate", "Page the on-call engineer"),
    ("done", "The pipeline is healthy"),
];

fn decisions_body(task: &str, step: usize) -> Value {
    let choices: Vec<Value> = CHOICES
        .iter()
        .map(|(v, d)| json!({"value": v, "description": d}))
        .collect();
    json!({"model": "smollm2-135m-instruct",
           "input": [{"role": "user", "content": task}, {"role": "user", "content": format!("Observation {step}: queue depth {}.", step * 7 % 11)}],
           "questions": [{"type": "choice", "name": "next_action",
                          "instructions": "Select the supplied action that best advances the task, or done if the task is complete.",
                          "choices": choices}]})
}

fn systemone_body(task: &str, step: usize) -> Value {
    let criteria: serde_json::Map<String, Value> = CHOICES.iter().map(|(v, d)| (v.to_string(), json!(d))).collect();
    json!({"state": [{"role": "user", "content": task}, {"role": "user", "content": format!("Observation {step}: queue depth {}.", step * 7 % 11)}],
           "questions": {"next_action": {"type": "choice",
                          "instructions": "Select the supplied action that best advances the task, or done if the task is complete.",
                          "criteria": criteria}}})
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

/// Tokens of `messages` as the chat template renders them (no generation prompt).
fn prefix_tokens(port: u16, messages: Value) -> u64 {
    post(
        port,
        "/tokenize",
        &json!({"messages": messages, "add_generation_prompt": false}),
    )["count"]
        .as_u64()
        .unwrap_or(0)
}

fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * q).round() as usize]
}

/// One step's outcome: status, cached tokens, seconds.
type Step = (u16, u64, f64);

fn run_loops(
    port: u16,
    path: &str,
    loops: usize,
    steps: usize,
    chars: usize,
    first_id: usize,
) -> (Vec<Vec<Step>>, Vec<u64>, f64) {
    let task_tokens: Vec<u64> = (0..loops)
        .map(|l| prefix_tokens(port, json!([{"role": "user", "content": task(first_id + l, chars)}])))
        .collect();
    let start = Instant::now();
    let results = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..loops)
            .map(|l| {
                sc.spawn(move || {
                    let t = task(first_id + l, chars);
                    (0..steps)
                        .map(|step| {
                            let body = if path == "/v1/decisions" {
                                decisions_body(&t, step)
                            } else {
                                systemone_body(&t, step)
                            };
                            let t0 = Instant::now();
                            let (st, r) = post_status(port, path, &body);
                            let cached = r["usage"]["input_tokens_details"]["cached_tokens"]
                                .as_u64()
                                .unwrap_or(0);
                            (st, cached, t0.elapsed().as_secs_f64())
                        })
                        .collect::<Vec<Step>>()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    (results, task_tokens, start.elapsed().as_secs_f64())
}

fn part_one(rows: &mut Vec<String>) {
    let loops = env_or("DECISIONS_API_LOOPS", 16);
    let steps = env_or("DECISIONS_API_STEPS", 8);
    let chars = env_or("DECISIONS_API_TASK_CHARS", 14_000);
    // a ~4,000-token task is ~250 blocks of 16: room for about 4 of them
    let blocks = (chars / 3 / 16 * 4).max(64).to_string();
    let tier = ["--kv-offload-memory", "4GiB"];
    let arms: [(&str, &[&str]); 2] = [("defaults", &[]), ("defaults + second tier (4 GiB)", &tier)];
    rows.push(format!(
        "part 1: {loops} loops x {steps} steps, ~{chars}-char task, --num-kv-blocks {blocks}"
    ));
    rows.push(
        "| API | arm | task cached, steps 2+ (mean / lowest) | p50 step s | p99 step s | failed | wall s | pins released early / preemptions |".into(),
    );
    rows.push("|---|---|---|---|---|---|---|---|".into());
    let arm_filter = std::env::var("DECISIONS_API_ARMS").unwrap_or_default();
    let api_filter = std::env::var("DECISIONS_API_APIS").unwrap_or_default();
    let mut id = 1000;
    for (name, extra) in arms {
        if !name.starts_with(arm_filter.as_str()) {
            continue;
        }
        for path in ["/v1/decisions", "/v1/systemone"] {
            if !path.ends_with(api_filter.as_str()) {
                continue;
            }
            let mut a = vec!["--num-kv-blocks", blocks.as_str()];
            a.extend_from_slice(extra);
            let s = common::start(&a);
            id += 100;
            let (results, task_tokens, wall) = run_loops(s.1, path, loops, steps, chars, id);
            let mut shares = vec![];
            let mut lat = vec![];
            let mut failed = 0;
            for (l, steps) in results.iter().enumerate() {
                for (k, &(st, cached, secs)) in steps.iter().enumerate() {
                    if st != 200 {
                        failed += 1;
                        continue;
                    }
                    lat.push(secs);
                    if k > 0 {
                        shares.push((cached as f64 / task_tokens[l].max(1) as f64).min(1.0));
                    }
                }
            }
            let mean = shares.iter().sum::<f64>() / shares.len().max(1) as f64;
            let lowest = shares.iter().cloned().fold(1.0, f64::min);
            rows.push(format!(
                "| {path} | {name} | {:.1}% / {:.1}% | {:.2} | {:.2} | {failed} | {wall:.1} | {} / {} |",
                mean * 100.0,
                lowest * 100.0,
                percentile(&mut lat.clone(), 0.5),
                percentile(&mut lat, 0.99),
                common::metric(s.1, "kvgate:pins_released_early_total") as u64,
                common::metric(s.1, "kvgate:num_preemptions_total") as u64,
            ));
            eprintln!("{}", rows.last().unwrap());
        }
    }
}

fn part_two(rows: &mut Vec<String>) {
    let s = common::start(&["--num-kv-blocks", "512", "--session-window", "0"]);
    let system = |tag: &str| format!("{tag} {}", task(7, 6000));
    let body = |sys: &str, user: &str, marked: bool| {
        let mut part = json!({"type": "input_text", "text": sys});
        if marked {
            part["prompt_cache_breakpoint"] = json!({"mode": "explicit"});
        }
        json!({"model": "smollm2-135m-instruct",
               "input": [{"role": "system", "content": [part]}, {"role": "user", "content": user}],
               "questions": [{"type": "predicate", "name": "urgent", "instructions": "Is this urgent?"}]})
    };
    rows.push("part 2: a ~1,700-token system prompt, a flood of 40 cold ~1,000-token prompts (--num-kv-blocks 512, no session retention: only a breakpoint keeps anything)".into());
    rows.push("| prompt | written | marked prefix cached after the flood |".into());
    rows.push("|---|---|---|".into());
    for (i, marked) in [true, false].into_iter().enumerate() {
        let sys = system(if marked { "Marked rules." } else { "Unmarked rules." });
        let prefix = prefix_tokens(s.1, json!([{"role": "system", "content": sys}]));
        let r = post(s.1, "/v1/decisions", &body(&sys, "My payout failed.", marked));
        let written = r["usage"]["input_tokens_details"]["cache_write_tokens"]
            .as_u64()
            .unwrap_or(0);
        for j in 0..40 {
            let cold = json!({"prompt": task(50_000 + i * 100 + j, 3500), "max_tokens": 1});
            post(s.1, "/v1/completions", &cold);
        }
        let r = post(s.1, "/v1/decisions", &body(&sys, "Invoices are wrong.", marked));
        let cached = r["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        rows.push(format!(
            "| {} | {written} | {cached} of {prefix} ({:.1}%) |",
            if marked { "with a breakpoint" } else { "without" },
            (cached as f64 / prefix.max(1) as f64).min(1.0) * 100.0
        ));
        eprintln!("{}", rows.last().unwrap());
    }
}

fn main() {
    let parts = std::env::var("DECISIONS_API_PARTS").unwrap_or_else(|_| "one,two".into());
    let mut rows = vec![];
    if parts.contains("one") {
        part_one(&mut rows);
    }
    if parts.contains("two") {
        part_two(&mut rows);
    }
    println!("{}", rows.join("\n"));
}
