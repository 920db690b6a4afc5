//! Wire goldens: the exact bytes every route answers to a fixed set of requests, over the tiny
//! in-memory model (seeded, greedy), compared with `tests/fixtures/wire-goldens.txt`. Only the values
//! that must differ between runs (`id`s, `created`, tool-call ids) are masked; everything else — key
//! order, number formatting, SSE framing — must stay byte for byte as it was. Refactors of the request
//! pipeline are checked against it. `KVGATE_BLESS_GOLDENS=1` rewrites the file (only on purpose).

mod common;

use common::InProcess;
use serde_json::{json, Value};

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wire-goldens.txt");

/// Masks the values that change between runs: `"id":"…"`, `"created":N`, `"created_at":N`, and the
/// Jev model list's `"release_date":"…"` (the server's start date).
fn mask(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let mut rest = body;
    loop {
        let next = ["\"id\":\"", "\"created\":", "\"created_at\":", "\"release_date\":\""]
            .iter()
            .filter_map(|k| rest.find(k).map(|i| (i, *k)))
            .min();
        let Some((i, key)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..i + key.len()]);
        rest = &rest[i + key.len()..];
        if key.ends_with('"') {
            let end = rest.find('"').unwrap_or(rest.len());
            out.push_str("MASKED");
            rest = &rest[end..];
        } else {
            let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            out.push('0');
            rest = &rest[end..];
        }
    }
}

fn cases() -> Vec<(&'static str, &'static str, &'static str, Value)> {
    let questions = json!({
        "urgent": {"type": "noul", "instructions": "Is this urgent?", "criteria": {"true": "it is", "false": {"why": "calm"}}},
        "team": {"type": "choice", "instructions": "Which team?",
                 "criteria": {"billing": "Payments", "technical": null, "sales": {"k": 1}}},
        "mood": {"type": "score", "instructions": "How angry?",
                 "criteria": ["Calm", {"label": "Annoyed"}, "Furious"]}
    });
    let many: serde_json::Map<String, Value> = (0..30).map(|i| (format!("opt{i}"), Value::Null)).collect();
    vec![
        ("GET", "/v1/models", "models", Value::Null),
        ("POST", "/tokenize", "tokenize", json!({"prompt": "Hello world"})),
        (
            "POST",
            "/tokenize",
            "tokenize chat",
            json!({"messages": [{"role": "user", "content": "Hi"}]}),
        ),
        ("POST", "/detokenize", "detokenize", json!({"tokens": [5, 6, 7, 8]})),
        ("GET", "/tokenizer_info", "tokenizer_info", Value::Null),
        (
            "POST",
            "/v1/systemone",
            "systemone text",
            json!({"state": "Help! My payouts fail.", "questions": questions, "diagnostics": true}),
        ),
        (
            "POST",
            "/v1/systemone",
            "systemone conversation",
            json!({"state": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}],
                   "instructions": "Be brief.", "keep_alive": 30,
                   "questions": {"q": {"type": "noul", "instructions": "Friendly?"},
                                 "big": {"type": "choice", "instructions": "Pick", "criteria": many}},
                   "diagnostics": true}),
        ),
        (
            "POST",
            "/v1/systemone",
            "systemone plain read",
            json!({"state": {"ticket": 42}, "x_read": "plain",
                   "questions": {"team": {"type": "choice", "instructions": "Which?",
                                          "criteria": {"a": null, "b": null, "c": null}}},
                   "diagnostics": true}),
        ),
        (
            "POST",
            "/v1/systemone",
            "systemone extra field",
            json!({"state": "x", "questions": {"u": {"type": "noul", "instructions": "?", "yes": "it is"}}}),
        ),
        (
            "POST",
            "/v1/systemone",
            "systemone invalid",
            json!({"state": "", "questions": {"a": {"type": "choice"}, "b": {"type": "nope", "x": 1}}}),
        ),
        (
            "POST",
            "/v1/completions",
            "completion",
            json!({"prompt": "Once upon", "max_tokens": 5, "temperature": 0, "logprobs": 2, "echo": true}),
        ),
        (
            "POST",
            "/v1/completions",
            "completion stream",
            json!({"prompt": "a b", "max_tokens": 3, "temperature": 0, "stream": true,
                   "stream_options": {"include_usage": true}, "logprobs": 1}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            "chat",
            json!({"messages": [{"role": "system", "content": "Be kind"}, {"role": "user", "content": "Hi"}],
                   "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 2, "n": 2}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            "chat stream",
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi there"}]}],
                   "max_tokens": 4, "temperature": 0, "stream": true,
                   "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            "chat tool named",
            json!({"messages": [{"role": "user", "content": "Weather?"}], "max_tokens": 40, "temperature": 0,
                   "tools": [{"type": "function", "function": {"name": "get_weather",
                              "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                                             "required": ["city"], "additionalProperties": false}}}],
                   "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            "chat json schema",
            json!({"messages": [{"role": "user", "content": "A color"}], "max_tokens": 30, "temperature": 0,
                   "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema":
                       {"type": "object", "properties": {"c": {"type": "string", "enum": ["red", "blue"]}},
                        "required": ["c"], "additionalProperties": false}}}}),
        ),
        (
            "POST",
            "/v1/chat/completions",
            "chat invalid",
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": -1, "bogus": 1}),
        ),
    ]
}

#[test]
fn every_route_answers_the_golden_bytes() {
    let s = InProcess::tiny(&[]);
    let mut got = String::new();
    for (method, path, name, body) in cases() {
        let bytes = if body.is_null() {
            vec![]
        } else {
            body.to_string().into_bytes()
        };
        let (st, _, b) = s
            .raw(method, path, &[("Content-Type", "application/json")], &bytes)
            .expect("request");
        got.push_str(&format!(
            "### {name}\n{st}\n{}\n",
            mask(String::from_utf8_lossy(&b).trim_end())
        ));
    }
    if std::env::var_os("KVGATE_BLESS_GOLDENS").is_some() {
        std::fs::write(FILE, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(FILE).expect("the goldens file (KVGATE_BLESS_GOLDENS=1 writes it)");
    for (g, w) in got.split("### ").zip(want.split("### ")) {
        assert_eq!(g, w, "a golden response changed");
    }
    assert_eq!(got, want);
}
