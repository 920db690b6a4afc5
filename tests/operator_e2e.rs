//! The operator surface of the real `serve`: CORS (deny by default, exact origins, preflights before
//! auth, CORS headers on errors), API keys, limits and error shapes, /health when the engine is gone, a
//! panicking handler, graceful shutdown, request logs, the configuration files, and the README's flag
//! reference.

mod common;

use std::time::{Duration, Instant};

use common::{assert_openai_error, Server};
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

fn preflight(s: &Server, path: &str, method: &str, origin: &str) -> (u16, Vec<(String, String)>, String) {
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
    let s = Server::start(&["--api-key", "sekret"]);
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
    assert!(
        s.log_text().contains("CORS: no origin allowed"),
        "the policy is logged at start-up"
    );
}

#[test]
fn cors_listed_origin_and_wildcard() {
    let ui = "http://127.0.0.1:5173";
    let s = Server::start(&["--api-key", "sekret", "--allowed-origins", &format!("[\"{ui}\"]")]);
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
    assert!(s.log_text().contains(ui));
    drop(s);
    // "*" only when listed; refused together with credentials
    let s = Server::start(&["--allowed-origins", "*"]);
    let (st, hs, _) = preflight(&s, "/v1/completions", "POST", "https://anything.example");
    assert_eq!(st, 200);
    assert_eq!(header(&hs, "access-control-allow-origin"), Some("*"));
    drop(s);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--allowed-origins", "*", "--allow-credentials"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("allow-credentials"));
}

#[test]
fn api_keys() {
    let s = Server::start_env(
        &["--api-key", "first-key"],
        &[("KVGATE_API_KEY", "ignored-when-flag-given")],
    );
    let body = json!({"prompt": "hi", "max_tokens": 1});
    let (st, _, r) = s.post_with("/v1/completions", &[], &body);
    assert_openai_error(st, &r, 401);
    let (st, _, r) = s.post_with("/v1/completions", &[("Authorization", "Bearer wrong")], &body);
    assert_openai_error(st, &r, 401);
    let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", "Bearer first-key")], &body);
    assert_eq!(st, 200);
    for open in ["/health", "/ping", "/version", "/metrics"] {
        assert_eq!(s.get(open).unwrap().0, 200, "{open} is open");
    }
    assert!(!s.log_text().contains("first-key"), "keys never reach the logs");
    drop(s);
    let s = Server::start_env(&[], &[("KVGATE_API_KEY", "env-key-1,env-key-2")]);
    let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", "Bearer env-key-2")], &body);
    assert_eq!(st, 200);
    let (st, _, _) = s.post_with("/v1/completions", &[], &body);
    assert_eq!(st, 401);
}

#[test]
fn limits_and_failure_modes() {
    let s = Server::start_env(
        &["--max-request-body", "2KiB", "--log-format", "json"],
        &[("KVGATE_TEST_HOOKS", "1")],
    );
    let big = json!({"prompt": "x".repeat(5000)});
    let (st, r) = s.post("/v1/completions", &big);
    assert_openai_error(st, &r, 413);
    let (st, r) = s.post("/v1/systemone", &json!({"state": "x".repeat(5000), "questions": {}}));
    assert_openai_error(st, &r, 413);
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
    // tokenize / detokenize
    let (st, t) = s.post("/tokenize", &json!({"prompt": "Hello world"}));
    assert_eq!(st, 200);
    assert_eq!(t["tokens"], json!([19556, 905]));
    assert_eq!(t["count"], 2);
    assert!(t["max_model_len"].as_u64().unwrap() > 0);
    let (st, t) = s.post("/tokenize", &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(st, 200);
    assert!(t["count"].as_u64().unwrap() > 5);
    let (st, d) = s.post("/detokenize", &json!({"tokens": [19556, 905]}));
    assert_eq!(st, 200);
    assert_eq!(d["prompt"], "Hello world");
    // a panicking handler is a 500 for that request; the server keeps serving
    let (st, _, b) = s.raw("POST", "/debug/panic", &[], b"").unwrap();
    assert_openai_error(st, &common::parse(&b), 500);
    let secret_prompt = "my very private prompt text";
    let (st, _) = s.post("/v1/completions", &json!({"prompt": secret_prompt, "max_tokens": 2}));
    assert_eq!(st, 200);
    // structured request logs: id, route, status, latency; no prompt text
    let log = s.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("\"route\":\"/v1/completions\"") && l.contains("\"status\":200"))
        .unwrap_or_else(|| panic!("no JSON access log line: {log}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert!(v["request_id"].is_string() && v["latency_ms"].is_number(), "{v}");
    assert!(
        !log.contains(secret_prompt),
        "prompt text is not logged without --log-requests"
    );
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
fn log_requests_includes_bodies() {
    let s = Server::start(&["--log-requests"]);
    s.post(
        "/v1/completions",
        &json!({"prompt": "visible prompt text", "max_tokens": 1}),
    );
    assert!(s.log_text().contains("visible prompt text"));
}

#[test]
fn sigterm_lets_a_stream_finish_then_exits_zero() {
    let mut s = Server::start(&["--shutdown-timeout", "60"]);
    let port = s.port;
    let reader = std::thread::spawn(move || {
        common::stream_at(
            port,
            "/v1/completions",
            &json!({"prompt": "Count slowly:", "max_tokens": 150, "ignore_eos": true, "stream": true}),
        )
    });
    std::thread::sleep(Duration::from_millis(800));
    let pid = s.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let events = reader.join().unwrap();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "the in-flight stream finished"
    );
    assert!(events.len() > 100, "all tokens arrived: {}", events.len());
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "serve did not exit");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    // no new connections after the signal
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

#[test]
fn configs_load_and_readme_flags_match_help() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
    let mut n = 0;
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let a = kvgate_server::config::load(["serve", "--config", p.to_str().unwrap()])
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert!(a.port > 0);
            n += 1;
        }
    }
    assert!(n >= 3);
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_serve"))
        .arg("--help")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let start = readme.find("<!-- serve --help -->").expect("marker") + "<!-- serve --help -->".len();
    let end = readme.find("<!-- /serve --help -->").expect("end marker");
    let block = readme[start..end]
        .trim()
        .trim_start_matches("```text")
        .trim_end_matches("```")
        .trim();
    assert_eq!(
        block,
        help.trim(),
        "README's flag reference is `serve --help` verbatim; regenerate it"
    );
}

#[test]
fn missing_pip_is_a_clear_error_naming_model() {
    let cache = std::env::temp_dir().join(format!("kvgate-nopip-{}", std::process::id()));
    std::fs::create_dir_all(&cache).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--port", "0"])
        .env_clear()
        .env("XDG_CACHE_HOME", &cache)
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&cache);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no pip found") && err.contains("--model"), "{err}");
}
