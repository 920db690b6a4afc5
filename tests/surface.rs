//! The HTTP surface in process, over the tiny in-memory model (or a scripted engine behind the HTTP ↔
//! engine seam): CORS (deny by default, exact origins, preflights before auth, CORS headers on errors),
//! API keys, body limits and content types, 404/405, validation and error shapes, a panicking handler,
//! and the engine going away. The same router `serve` builds from the same flags; no binary, no
//! weights; tenants' prefix isolation. System One's surface is in `surface_systemone.rs`; what needs the
//! real process (start-up logs, signals, config files) is in `operator_e2e.rs`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_openai_error, InProcess};
use kvgate_engine::{
    DecideRequest, EmbedRequest, EngineError, Event, GenerateRequest, Limits, PendingDecision, PendingEmbedding,
    RequestStream,
};
use kvgate_server::infer::Inference;
use serde_json::json;

const ROUTES: [(&str, &str); 10] = [
    ("GET", "/health"),
    ("GET", "/ping"),
    ("GET", "/version"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/systemone"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
];

fn header<'a>(hs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    hs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn preflight(s: &InProcess, path: &str, method: &str, origin: &str) -> (u16, Vec<(String, String)>, String) {
    let (st, hs, b) = s
        .raw(
            "OPTIONS",
            path,
            &[
                ("Origin", origin),
                ("Access-Control-Request-Method", method),
                ("Access-Control-Request-Headers", "authorization, content-type"),
            ],
            b"",
        )
        .unwrap();
    (st, hs, String::from_utf8_lossy(&b).to_string())
}

#[test]
fn cors_is_deny_by_default() {
    let s = InProcess::tiny(&["--api-key", "sekret"]);
    for (method, path) in ROUTES {
        let (st, hs, body) = preflight(&s, path, method, "http://127.0.0.1:9999");
        assert_eq!(st, 400, "{path}");
        assert_eq!(body, "Disallowed CORS origin");
        assert!(header(&hs, "access-control-allow-origin").is_none(), "{path}");
    }
    // An actual request from another origin gets no CORS header (the browser will not expose it)...
    let (st, hs, _) = s
        .raw(
            "GET",
            "/v1/models",
            &[("Origin", "http://127.0.0.1:9999"), ("Authorization", "Bearer sekret")],
            b"",
        )
        .unwrap();
    assert_eq!(st, 200);
    assert!(header(&hs, "access-control-allow-origin").is_none());
    // ...and requests without Origin are unaffected.
    let (st, _, _) = s
        .raw("GET", "/v1/models", &[("Authorization", "Bearer sekret")], b"")
        .unwrap();
    assert_eq!(st, 200);
}

#[test]
fn cors_listed_origin_and_wildcard() {
    let ui = "http://127.0.0.1:5173";
    let s = InProcess::tiny(&["--api-key", "sekret", "--allowed-origins", &format!("[\"{ui}\"]")]);
    for (method, path) in ROUTES {
        let (st, hs, _) = preflight(&s, path, method, ui);
        assert_eq!(st, 200, "{path}: preflights never need the key");
        assert_eq!(header(&hs, "access-control-allow-origin"), Some(ui), "{path}");
        assert_eq!(header(&hs, "vary"), Some("Origin"));
        assert!(header(&hs, "access-control-allow-methods").unwrap().contains(method));
        assert!(header(&hs, "access-control-allow-headers")
            .unwrap()
            .contains("authorization"));
        assert!(header(&hs, "access-control-max-age").is_some());
        // exact match only: another port, scheme or host is refused
        for other in [
            "http://127.0.0.1:5174",
            "https://127.0.0.1:5173",
            "http://localhost:5173",
        ] {
            assert_eq!(preflight(&s, path, method, other).0, 400, "{other}");
        }
    }
    // errors to a listed origin carry the CORS headers
    let (st, hs, b) = s.raw("GET", "/v1/models", &[("Origin", ui)], b"").unwrap();
    assert_eq!(st, 401);
    assert_eq!(header(&hs, "access-control-allow-origin"), Some(ui));
    assert_openai_error(st, &common::parse(&b), 401);
    let (st, hs, _) = s
        .raw(
            "GET",
            "/nope",
            &[("Origin", ui), ("Authorization", "Bearer sekret")],
            b"",
        )
        .unwrap();
    assert_eq!(st, 404);
    assert_eq!(header(&hs, "access-control-allow-origin"), Some(ui));
    let (st, hs, _) = s
        .raw(
            "GET",
            "/v1/models",
            &[("Origin", ui), ("Authorization", "Bearer sekret")],
            b"",
        )
        .unwrap();
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "access-control-allow-origin"), Some(ui));
    drop(s);
    // "*" only when listed
    let s = InProcess::tiny(&["--allowed-origins", "*"]);
    let (st, hs, _) = preflight(&s, "/v1/completions", "POST", "https://anything.example");
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "access-control-allow-origin"), Some("*"));
}

#[test]
fn api_keys() {
    let s = InProcess::tiny(&["--api-key", "first-key", "--api-key", "second-key"]);
    let body = json!({"prompt": "hi", "max_tokens": 1});
    let (st, _, r) = s.post_with("/v1/completions", &[], &body);
    assert_openai_error(st, &r, 401);
    let (st, _, r) = s.post_with("/v1/completions", &[("Authorization", "Bearer wrong")], &body);
    assert_openai_error(st, &r, 401);
    for key in ["first-key", "second-key"] {
        let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", &format!("Bearer {key}"))], &body);
        assert_eq!(st, 200);
    }
    for open in ["/health", "/ping", "/version", "/metrics"] {
        assert_eq!(s.get(open).unwrap().0, 200, "{open} is open");
    }
}

#[test]
fn limits_and_failure_modes() {
    let s = InProcess::tiny(&["--max-request-body", "2KiB"]);
    let big = json!({"prompt": "x".repeat(5000)});
    let (st, r) = s.post("/v1/completions", &big);
    assert_openai_error(st, &r, 413);
    assert!(
        r["error"]["message"].as_str().unwrap().contains("2048"),
        "the limit is named: {r}"
    );
    let (st, r) = s.post("/v1/systemone", &json!({"state": "x".repeat(5000), "questions": {}}));
    common::assert_jev_error(st, &r, 413, "request_too_large");
    let (st, _, b) = s
        .raw(
            "POST",
            "/v1/completions",
            &[("Content-Type", "text/plain")],
            b"{\"prompt\": \"x\"}",
        )
        .unwrap();
    assert_openai_error(st, &common::parse(&b), 415);
    let (st, _, b) = s
        .raw("POST", "/v1/nothing", &[("Content-Type", "application/json")], b"{}")
        .unwrap();
    assert_openai_error(st, &common::parse(&b), 404);
    let (st, _, b) = s.raw("GET", "/v1/completions", &[], b"").unwrap();
    assert_openai_error(st, &common::parse(&b), 405);
    // tokenize / detokenize round trip
    let (st, t) = s.post("/tokenize", &json!({"prompt": "Hello world"}));
    assert_eq!(st, 200);
    assert_eq!(t["count"], t["tokens"].as_array().unwrap().len());
    assert!(t["max_model_len"].as_u64().unwrap() > 0);
    let (st, d) = s.post("/detokenize", &json!({"tokens": t["tokens"]}));
    assert_eq!(st, 200);
    assert_eq!(d["prompt"], "Hello world");
    // a panicking handler is a 500 for that request; the server keeps serving
    let (st, _, b) = s.raw("POST", "/debug/panic", &[], b"").unwrap();
    assert_openai_error(st, &common::parse(&b), 500);
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "still here", "max_tokens": 2}));
    assert_eq!(st, 200);
    // the engine goes away: /health says 503, requests get 503
    let (st, _, _) = s.raw("POST", "/debug/stop-engine", &[], b"").unwrap();
    assert_eq!(st, 204);
    let t0 = Instant::now();
    while s.get("/health").unwrap().0 != 503 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 1}));
    assert_openai_error(st, &r, 503);
}

#[test]
fn bad_input_gets_openai_shaped_4xx() {
    let s = InProcess::tiny(&[]);
    let cases: Vec<(&str, &[u8], u16, Option<&str>)> = vec![
        ("/v1/completions", b"{\"prompt\": \"x\",", 400, None),
        ("/v1/completions", b"[1, 2]", 400, None),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": -5}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "max_tokens": "ten"}"#,
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "temperature": "hot"}"#,
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "top_p": 1.5}"#,
            400,
            Some("top_p"),
        ),
        ("/v1/completions", br#"{"prompt": "x", "n": 0}"#, 400, Some("n")),
        ("/v1/completions", br#"{"prompt": 5}"#, 400, Some("prompt")),
        ("/v1/completions", br#"{}"#, 400, Some("prompt")),
        (
            "/v1/completions",
            br#"{"prompt": "x", "logprobs": 50}"#,
            400,
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "frobnicate": 1}"#,
            400,
            Some("frobnicate"),
        ),
        (
            "/v1/completions",
            br#"{"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}"#,
            400,
            Some("response_format"),
        ),
        ("/v1/completions", br#"{"prompt": "x", "model": "gpt-4o"}"#, 404, None),
        ("/v1/completions", br#"{"prompt": [99999999]}"#, 400, Some("prompt")),
        ("/v1/chat/completions", br#"{"messages": "hi"}"#, 400, Some("messages")),
        ("/v1/chat/completions", br#"{"messages": []}"#, 400, Some("messages")),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "wizard", "content": "x"}]}"#,
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user"}]}"#,
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#,
            400,
            Some("top_logprobs"),
        ),
        (
            "/v1/chat/completions",
            br#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#,
            400,
            Some("tools"),
        ),
    ];
    for (path, body, want, param) in cases {
        let (st, _, b) = s
            .raw("POST", path, &[("Content-Type", "application/json")], body)
            .unwrap();
        let v = common::parse(&b);
        assert_openai_error(st, &v, want);
        if let Some(p) = param {
            assert_eq!(v["error"]["param"], p, "{}", String::from_utf8_lossy(body));
            assert!(
                v["error"]["message"].as_str().unwrap().contains(p),
                "the message names {p}: {v}"
            );
        }
    }
    // a prompt longer than the context
    let long = "hello ".repeat(9000);
    let (st, r) = s.post("/v1/completions", &json!({"prompt": long, "max_tokens": 1}));
    assert_openai_error(st, &r, 400);
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is"),
        "{r}"
    );
    // nothing panicked (every case got its own status): the server still answers
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "ok", "max_tokens": 1}));
    assert_eq!(st, 200);
}

/// An engine that refuses or fails every request the way it is told to.
struct Scripted {
    limits: Limits,
    refuse: Option<EngineError>,
    fail_with: Option<EngineError>,
}

impl Inference for Scripted {
    fn limits(&self) -> Limits {
        self.limits
    }

    fn is_alive(&self) -> bool {
        true
    }

    fn generate(&self, _: GenerateRequest) -> Result<RequestStream, EngineError> {
        self.stream()
    }

    fn decide(&self, _: DecideRequest) -> Result<PendingDecision, EngineError> {
        if let Some(e) = &self.refuse {
            return Err(e.clone());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(e) = &self.fail_with {
            let _ = tx.send(Err(e.clone()));
        }
        Ok(PendingDecision::from(rx))
    }

    fn embed(&self, _: EmbedRequest) -> Result<PendingEmbedding, EngineError> {
        if let Some(e) = &self.refuse {
            return Err(e.clone());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(e) = &self.fail_with {
            let _ = tx.send(Err(e.clone()));
        }
        Ok(PendingEmbedding::from(rx))
    }

    fn shutdown(&self) {}
}

impl Scripted {
    fn stream(&self) -> Result<RequestStream, EngineError> {
        if let Some(e) = &self.refuse {
            return Err(e.clone());
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        if let Some(e) = &self.fail_with {
            let _ = tx.send(Event::Error(e.clone()));
        }
        Ok(RequestStream::detached(1, rx))
    }
}

fn scripted(refuse: Option<EngineError>, fail_with: Option<EngineError>) -> InProcess {
    let limits = Limits {
        max_model_len: 256,
        max_queue: 4,
        num_blocks: 64,
        block_size: 16,
        vocab_size: 300,
        hidden_size: 8,
        window_blocks: None,
        tree_attention: false,
    };
    InProcess::with_engine(
        &[],
        Arc::new(Scripted {
            limits,
            refuse,
            fail_with,
        }),
    )
}

#[test]
fn a_stream_the_engine_drops_ends_with_an_error_event() {
    // the engine went away mid-request (its channel closed without a terminal event): the SSE stream
    // says so before [DONE] instead of ending silently
    let s = scripted(None, None);
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 1, "stream": true}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "stream": true}),
        ),
    ] {
        let events = s.stream(path, &body);
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert!(last["error"]["message"].as_str().is_some(), "{path}: {events:?}");
    }
}

#[test]
fn engine_errors_map_to_one_http_shape_each() {
    let completion = json!({"prompt": "hi", "max_tokens": 1});
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
    // a full queue: 429 with Retry-After on every generating route
    let s = scripted(Some(EngineError::QueueFull { max_queue: 4 }), None);
    for (path, body) in [("/v1/completions", &completion), ("/v1/chat/completions", &chat)] {
        let (st, hs, r) = s.post_with(path, &[], body);
        assert_openai_error(st, &r, 429);
        assert!(
            r["error"]["message"].as_str().unwrap().contains('4'),
            "the limit is named: {r}"
        );
        assert_eq!(header(&hs, "retry-after"), Some("1"));
    }
    drop(s);
    // a request that can never fit: 400 naming both numbers
    let s = scripted(
        Some(EngineError::DoesNotFit {
            needed: 90,
            available: 64,
        }),
        None,
    );
    let (st, r) = s.post("/v1/completions", &completion);
    assert_openai_error(st, &r, 400);
    let m = r["error"]["message"].as_str().unwrap();
    assert!(m.contains("90") && m.contains("64"), "{m}");
    drop(s);
    // the engine is gone: 503
    let s = scripted(Some(EngineError::EngineDead), None);
    let (st, r) = s.post("/v1/chat/completions", &chat);
    assert_openai_error(st, &r, 503);
    drop(s);
    // a step failed after admission: 500, and the body says why
    let s = scripted(None, Some(EngineError::Panic("boom".into())));
    let (st, r) = s.post("/v1/completions", &completion);
    assert_openai_error(st, &r, 500);
    assert!(r["error"]["message"].as_str().unwrap().contains("boom"), "{r}");
}

#[test]
fn tenants_with_different_keys_do_not_share_prefixes_unless_told_to() {
    let body = json!({"prompt": "A long shared system prompt that one tenant sends. ".repeat(8), "max_tokens": 1});
    let cached_for = |s: &InProcess, key: &str, extra: &[(&str, &str)], body: &serde_json::Value| -> u64 {
        let auth = format!("Bearer {key}");
        let mut h = vec![("Authorization", auth.as_str())];
        h.extend_from_slice(extra);
        let (st, _, r) = s.post_with("/v1/completions", &h, body);
        assert_eq!(st, 200, "{r}");
        r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    let cached = |s: &InProcess, key: &str, extra: &[(&str, &str)]| cached_for(s, key, extra, &body);
    let s = InProcess::tiny(&["--api-key", "key-a", "--api-key", "key-b"]);
    assert_eq!(cached(&s, "key-a", &[]), 0);
    assert!(cached(&s, "key-a", &[]) > 0, "a tenant hits its own prefix");
    assert_eq!(cached(&s, "key-b", &[]), 0, "another tenant does not see it");
    // a client cannot claim another tenant through the internal header
    let other = json!({"prompt": "Another long prompt only the first tenant has sent. ".repeat(8), "max_tokens": 1});
    assert_eq!(cached_for(&s, "key-a", &[], &other), 0);
    assert_eq!(cached_for(&s, "key-b", &[("x-kvgate-tenant", "0")], &other), 0);
    let s = InProcess::tiny(&[
        "--api-key",
        "key-a",
        "--api-key",
        "key-b",
        "--share-prefix-cache-across-keys",
    ]);
    assert_eq!(cached(&s, "key-a", &[]), 0);
    assert!(cached(&s, "key-b", &[]) > 0, "shared when told to");
}
