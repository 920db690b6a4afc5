//! An agent loop over the Responses API, as the WebSocket mode is meant for: 20 tool-call turns, each
//! continuing the last by `previous_response_id` with only the tool's output as new input — over one
//! WebSocket (`GET /v1/responses`, `store: false`, the chain kept on the connection) against plain HTTP
//! (`POST /v1/responses`, `store: true`, a new connection per turn as a client without keep-alive
//! makes; and with keep-alive). The default model on `serve`; every turn is forced to call the tool
//! (`tool_choice`), greedy, 48 output tokens at most; the tool's output is ~170 tokens of file text (the conversation grows to ~4,500 tokens).
//! Per arm: the loop's wall time, per-turn latency (p50, p90), and the share of each turn's prompt
//! found cached. Arms alternate over `SOCKET_ROUNDS` rounds (default 2) to spread the host's noise.
//!
//! `cargo bench --bench responses_socket` prints the table (~1–2 minutes on 2 cores).

use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;

use serde_json::{json, Value};
use tungstenite::{Message, WebSocket};

const TURNS: usize = 20;

fn tools() -> Value {
    json!([{"type": "function", "name": "read_file", "description": "Read a file of the repository",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}])
}

/// The tool's answer on turn `t`: a file's text (~170 tokens), different each turn.
fn file_text(t: usize) -> String {
    (0..5)
        .map(|i| {
            format!(
                "fn step_{t}_{i}(x: u32) -> u32 {{ x.wrapping_mul({}) + {i} }}\n",
                31 + t
            )
        })
        .collect()
}

fn first_body() -> Value {
    json!({"instructions": "You are a coding agent. Read the files you need with read_file, one call at a time.",
           "input": "Find where the overflow in the step functions comes from.",
           "tools": tools(), "tool_choice": {"type": "function", "name": "read_file"},
           "max_output_tokens": 48, "temperature": 0})
}

fn next_body(prev: &Value, t: usize) -> Value {
    let call = prev["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("turn {t}: no call in {prev}"));
    json!({"previous_response_id": prev["id"], "tools": tools(),
           "tool_choice": {"type": "function", "name": "read_file"},
           "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": file_text(t)}],
           "max_output_tokens": 48, "temperature": 0})
}

/// One turn's latency and its prompt's cached share.
struct Turn {
    ms: f64,
    cached: f64,
}

fn cached_share(r: &Value) -> f64 {
    let u = &r["usage"];
    let input = u["input_tokens"].as_f64().unwrap_or(0.0);
    u["input_tokens_details"]["cached_tokens"].as_f64().unwrap_or(0.0) / input.max(1.0)
}

fn http_loop(port: u16, agent: &ureq::Agent) -> Vec<Turn> {
    let url = format!("http://127.0.0.1:{port}/v1/responses");
    let mut out = vec![];
    let mut body = first_body();
    for t in 0..TURNS {
        let start = Instant::now();
        let mut resp = agent
            .post(&url)
            .send_json(&body)
            .unwrap_or_else(|e| panic!("turn {t}: {e}"));
        let r: Value = resp.body_mut().read_json().unwrap();
        assert_eq!(resp.status(), 200, "turn {t}: {r}");
        out.push(Turn {
            ms: start.elapsed().as_secs_f64() * 1e3,
            cached: cached_share(&r),
        });
        body = next_body(&r, t + 1);
    }
    out
}

fn socket_loop(port: u16) -> Vec<Turn> {
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (mut ws, _): (WebSocket<TcpStream>, _) =
        tungstenite::client(format!("ws://127.0.0.1:{port}/v1/responses"), stream).expect("upgrade");
    let mut out = vec![];
    let mut body = first_body();
    for t in 0..TURNS {
        body["type"] = json!("response.create");
        body["store"] = json!(false);
        let start = Instant::now();
        ws.send(Message::Text(body.to_string().into())).unwrap();
        let r = loop {
            let Message::Text(m) = ws.read().unwrap() else { continue };
            let e: Value = serde_json::from_str(m.as_str()).unwrap();
            match e["type"].as_str() {
                Some("response.completed" | "response.incomplete") => break e["response"].clone(),
                Some("error" | "response.failed") => panic!("turn {t}: {e}"),
                _ => {}
            }
        };
        out.push(Turn {
            ms: start.elapsed().as_secs_f64() * 1e3,
            cached: cached_share(&r),
        });
        body = next_body(&r, t + 1);
    }
    let _ = ws.close(None);
    out
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let rounds: usize = std::env::var("SOCKET_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let s = common::start(&[]);
    let fresh = || {
        ureq::Agent::config_builder()
            .max_idle_connections(0)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(120)))
            .build()
            .new_agent()
    };
    let kept = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(120)))
        .build()
        .new_agent();
    let arms = ["websocket", "http, keep-alive", "http, a connection per turn"];
    let mut results: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = vec![(vec![], vec![], vec![]); arms.len()];
    // one warm-up loop: the instructions and tools' prefix is then cached for every arm alike
    let _ = http_loop(s.1, &kept);
    for _ in 0..rounds {
        for (a, name) in arms.iter().enumerate() {
            let start = Instant::now();
            let turns = match a {
                0 => socket_loop(s.1),
                1 => http_loop(s.1, &kept),
                _ => http_loop(s.1, &fresh()),
            };
            let wall = start.elapsed().as_secs_f64();
            eprintln!("{name}: {wall:.2} s");
            results[a].0.push(wall);
            results[a].1.extend(turns.iter().map(|t| t.ms));
            results[a].2.extend(turns.iter().skip(1).map(|t| t.cached));
        }
    }
    println!("\n{TURNS}-turn tool-call loop, default model, {rounds} alternating rounds (median wall time)\n");
    println!("| transport | loop s | turn p50 ms | turn p90 ms | follow-up turns' prompt cached |");
    println!("|---|---|---|---|---|");
    for (a, name) in arms.iter().enumerate() {
        let (walls, ms, cached) = &results[a];
        let mean_cached = cached.iter().sum::<f64>() / cached.len().max(1) as f64;
        println!(
            "| {name} | {:.2} | {:.0} | {:.0} | {:.1}% |",
            pct(walls.clone(), 0.5),
            pct(ms.clone(), 0.5),
            pct(ms.clone(), 0.9),
            mean_cached * 100.0
        );
    }
}
