//! The operator surface that needs the real `serve` process: start-up logs (CORS policy, auth mode, no
//! keys), keys from the environment, refused settings, JSON request logs, graceful shutdown, the
//! configuration files, and the flag reference (`docs/flags.md`). The HTTP surface itself (CORS, keys, limits,
//! error shapes) is tested in process in `surface.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{assert_openai_error, Server};
use serde_json::json;

#[test]
fn startup_logs_env_keys_and_refused_settings() {
    // the CORS policy and the auth mode are logged at start-up; keys never reach the logs
    let ui = "http://127.0.0.1:5173";
    let s = Server::start_env(
        &["--api-key", "first-key", "--allowed-origins", &format!("[\"{ui}\"]")],
        &[("KVGATE_API_KEY", "ignored-when-flag-given")],
    );
    let body = json!({"prompt": "hi", "max_tokens": 1});
    let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", "Bearer first-key")], &body);
    assert_eq!(st, 200);
    let (st, _, r) = s.post_with(
        "/v1/completions",
        &[("Authorization", "Bearer ignored-when-flag-given")],
        &body,
    );
    assert_openai_error(st, &r, 401);
    // the scheme is case-insensitive (RFC 9110)
    let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", "BEARER first-key")], &body);
    assert_eq!(st, 200);
    let log = s.log_text();
    assert!(log.contains(ui), "the policy is logged at start-up");
    assert!(log.contains("1 API key(s)"), "{log}");
    assert!(!log.contains("first-key"), "keys never reach the logs");
    assert!(!log.contains('\x1b'), "no ANSI colour codes in a log written to a file");
    drop(s);
    // keys from the environment (comma-separated); the default policy denies every origin
    let s = Server::start_env(&[], &[("KVGATE_API_KEY", "env-key-1,env-key-2")]);
    let (st, _, _) = s.post_with("/v1/completions", &[("Authorization", "Bearer env-key-2")], &body);
    assert_eq!(st, 200);
    let (st, _, _) = s.post_with("/v1/completions", &[], &body);
    assert_eq!(st, 401);
    assert!(
        s.log_text().contains("CORS: no origin allowed"),
        "the policy is logged at start-up"
    );
    drop(s);
    // "*" is refused together with credentials, naming the flag
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--allowed-origins", "*", "--allow-credentials"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("allow-credentials"));
    // a CUDA device this machine cannot open is refused before the model loads, with one message
    // naming the flag, what is missing and what to do (on a GPU machine the missing model file fails)
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--device", "cuda:0", "--model", "/nonexistent.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let no_driver = err.contains("--device cuda:0: the NVIDIA driver library (libcuda.so.1) cannot be loaded")
        && err.contains("install the NVIDIA driver")
        && err.contains("--device cpu");
    assert!(
        no_driver || err.contains("no usable CUDA device") || err.contains("nonexistent.gguf"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn json_request_logs_and_real_tokenizer() {
    let s = Server::start(&["--log-format", "json"]);
    // tokenize / detokenize with the real vocabulary
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
fn configs_load_and_the_flag_reference_matches_help() {
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
    let docs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/flags.md");
    let reference = std::fs::read_to_string(docs).unwrap();
    let start = reference.find("<!-- serve --help -->").expect("marker") + "<!-- serve --help -->".len();
    let end = reference.find("<!-- /serve --help -->").expect("end marker");
    let block = reference[start..end]
        .trim()
        .trim_start_matches("```text")
        .trim_end_matches("```")
        .trim();
    assert_eq!(
        block,
        help.trim(),
        "docs/flags.md is `serve --help` verbatim; regenerate it"
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
