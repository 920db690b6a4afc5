//! kvgate replicas behind the routers people run: two `serve` replicas (`--threads 1` each, the default
//! model) behind the real vllm-router 0.1.17 (PyPI, installed into .ci/venv by
//! scripts/setup-test-deps.sh), driven by tests/replicas_check.py — `consistent_hash` with a session
//! header (decision → follow-up → next turn on one replica, both replicas used, follow-ups ≥ 90%
//! cached, the `vllm:` metrics llm-d scrapes) and `kv_aware` fed by kvgate's KV events (a new session
//! goes to the replica holding its system prompt); and the KV event stream decoded by an independent
//! consumer (pyzmq + msgpack) that checks it as llm-d's indexer would. `KVGATE_CI_PYTHON` names the
//! venv's Python (scripts/test.sh sets it); without it the tests say so and check nothing.

mod common;

use std::net::TcpListener;

use common::{run_python_check, Server};

fn python() -> Option<std::ffi::OsString> {
    let p = std::env::var_os("KVGATE_CI_PYTHON");
    if p.is_none() {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the replica checks not run");
    }
    p
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A replica publishing KV events: (server, events endpoint, replay endpoint).
fn replica(extra: &[&str]) -> (Server, String, String) {
    let (ev, rp) = (free_port(), free_port());
    let cfg = format!(
        r#"{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{ev}", "replay_endpoint": "tcp://*:{rp}"}}"#
    );
    let mut args = vec!["--threads", "1", "--kv-events-config", &cfg];
    args.extend_from_slice(extra);
    let s = Server::start(&args);
    (s, format!("tcp://127.0.0.1:{ev}"), format!("tcp://127.0.0.1:{rp}"))
}

#[test]
fn sessions_stay_warm_behind_vllm_router() {
    let Some(python) = python() else { return };
    let router = std::path::Path::new(&python).with_file_name("vllm-router");
    assert!(
        router.is_file(),
        "{router:?}: scripts/setup-test-deps.sh installs vllm-router"
    );
    let (a, ea, ra) = replica(&[]);
    let (b, eb, rb) = replica(&[]);
    run_python_check(
        &python,
        "replicas_check.py",
        &[
            "router",
            router.to_str().unwrap(),
            &a.url(""),
            &b.url(""),
            &ea,
            &eb,
            &ra,
            &rb,
        ],
    );
}

#[test]
fn kv_events_decode_and_chain_as_an_indexer_reads_them() {
    let Some(python) = python() else { return };
    // a small cache, so that the prompts evict each other's blocks
    let (s, ev, rp) = replica(&["--num-kv-blocks", "96"]);
    run_python_check(&python, "replicas_check.py", &["events", &s.url(""), &ev, &rp]);
}
