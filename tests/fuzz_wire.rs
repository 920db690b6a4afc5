//! A request fuzzer over the wire types (in-process, tiny model): valid bodies for every route,
//! mutated with a seeded generator — fields deleted, values replaced by JSON of every type and size,
//! unknown fields, deep nesting, truncated or random bytes, wrong content types — and sent. Every
//! answer must be a well-formed status below 500 (no panic, no internal error), and the server must
//! still serve and hold no KV blocks afterwards. `FUZZ_CASES` (default 2,000) and `FUZZ_SEED` run it
//! longer or elsewhere.

mod common;

use common::InProcess;
use serde_json::{json, Map, Value};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn seeds() -> Vec<(&'static str, Value)> {
    let msgs = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]);
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"x": {"type": "integer", "maximum": 9}}, "required": ["x"]}}}]);
    vec![
        (
            "/v1/completions",
            json!({"prompt": "hello", "max_tokens": 3, "temperature": 0.7, "seed": 1,
            "stop": ["x"], "logprobs": 2, "echo": false, "n": 2, "stream": false}),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 3], "max_tokens": 2, "stream": true,
            "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "a", "max_tokens": 4, "guided_regex": "[ab]{1,3}"}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 3, "top_p": 0.9, "top_k": 5,
            "logprobs": true, "top_logprobs": 2, "presence_penalty": 0.5}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 40, "tools": tools,
            "tool_choice": "required", "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "max_tokens": 30, "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
            "properties": {"a": {"enum": [1, 2]}}, "required": ["a"]}}}}),
        ),
        (
            "/v1/systemone",
            json!({"state": "a short state", "questions": {
            "q1": {"type": "noul", "instructions": "ok?"},
            "q2": {"type": "choice", "instructions": "which?", "options": {"a": "one", "b": "two"}},
            "q3": {"type": "score", "instructions": "how much?", "levels": 3}}}),
        ),
        (
            "/tokenize",
            json!({"prompt": "hello world", "add_special_tokens": true}),
        ),
        ("/tokenize", json!({"messages": msgs})),
        ("/detokenize", json!({"tokens": [1, 2, 3]})),
    ]
}

fn random_value(r: &mut Rng, depth: usize) -> Value {
    match r.below(if depth > 3 { 9 } else { 12 }) {
        0 => Value::Null,
        1 => json!(r.below(2) == 0),
        2 => json!(r.next() as i64),
        3 => json!(-(r.below(1000) as i64)),
        4 => json!([0.0, -1.5, 1e308, -1e308, 5e-324, 1e-39, 0.5, 2.0][r.below(8)]),
        5 => json!(["", "x", "\u{0}", "<|im_start|>", "é😀", "[", "{\"a\":1}", "-1"][r.below(8)]),
        6 => json!("z".repeat(r.below(5000))),
        7 => json!(r.below(100)),
        8 => json!(u64::MAX),
        9 => Value::Array((0..r.below(5)).map(|_| random_value(r, depth + 1)).collect()),
        10 => {
            let mut m = Map::new();
            for i in 0..r.below(4) {
                m.insert(format!("k{i}"), random_value(r, depth + 1));
            }
            Value::Object(m)
        }
        _ => {
            let mut v = json!(1);
            for _ in 0..r.below(200) {
                v = json!([v]);
            }
            v
        }
    }
}

/// Mutates a value somewhere inside `v`.
fn mutate(r: &mut Rng, v: &mut Value, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && r.below(3) != 0 => {
            let keys: Vec<String> = m.keys().cloned().collect();
            let k = keys[r.below(keys.len())].clone();
            match r.below(4) {
                0 => {
                    m.remove(&k);
                }
                1 if depth < 4 => mutate(r, m.get_mut(&k).unwrap(), depth + 1),
                2 => {
                    m.insert(format!("unknown_{}", r.below(10)), random_value(r, 0));
                }
                _ => {
                    m.insert(k, random_value(r, 0));
                }
            }
        }
        Value::Array(a) if !a.is_empty() && r.below(2) == 0 => {
            let i = r.below(a.len());
            if depth < 4 {
                mutate(r, &mut a[i], depth + 1)
            } else {
                a[i] = random_value(r, 0)
            }
        }
        _ => *v = random_value(r, 0),
    }
}

#[test]
fn mutated_requests_never_get_a_5xx() {
    let cases: usize = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5eed_1234);
    let s = InProcess::tiny(&[]);
    let seeds = seeds();
    let mut r = Rng(seed | 1);
    let mut statuses = std::collections::BTreeMap::new();
    for case in 0..cases {
        let (path, base) = &seeds[r.below(seeds.len())];
        let mut body = base.clone();
        for _ in 0..1 + r.below(3) {
            mutate(&mut r, &mut body, 0);
        }
        let mut bytes = body.to_string().into_bytes();
        let mut ctype = "application/json";
        match r.below(20) {
            0 => bytes.truncate(r.below(bytes.len())),
            1 => bytes = (0..r.below(300)).map(|_| r.next() as u8).collect(),
            2 => ctype = "text/plain",
            _ => {}
        }
        let (st, _, reply) = s
            .raw("POST", path, &[("Content-Type", ctype)], &bytes)
            .unwrap_or_else(|e| panic!("case {case} ({path}): no answer: {e}"));
        *statuses.entry(st).or_insert(0) += 1;
        assert!(
            (200..500).contains(&st),
            "case {case} {path}: {st} for {}: {}",
            String::from_utf8_lossy(&bytes).chars().take(400).collect::<String>(),
            String::from_utf8_lossy(&reply).chars().take(400).collect::<String>()
        );
    }
    eprintln!("fuzz statuses over {cases} cases: {statuses:?}");
    let (st, _) = s.get("/health").unwrap();
    assert_eq!(st, 200);
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "still fine", "max_tokens": 2}));
    assert_eq!(st, 200, "{r}");
}
