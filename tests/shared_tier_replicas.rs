//! Two `serve` replicas sharing a KV tier in a real `redis-server` (`--kv-shared`) behind the real
//! vllm-router 0.1.17 (consistent_hash): a session's replica is killed with SIGKILL, the router moves
//! the session, and the other replica serves its next turn from the shared tier — ≥ 80% of the prompt
//! cached, the same greedy text as the warm replica gave (tests/shared_tier_check.py). Needs
//! `KVGATE_CI_PYTHON` (the venv with vllm-router) and redis-server (both installed by
//! scripts/setup-test-deps.sh; scripts/test.sh requires them).

mod common;

use common::{run_python_check, Server};

#[path = "common/redis_server.rs"]
mod redis_server;

#[test]
fn a_killed_replicas_session_is_served_warm_by_another() {
    let Some(python) = std::env::var_os("KVGATE_CI_PYTHON") else {
        eprintln!("KVGATE_CI_PYTHON is not set (scripts/test.sh sets it): the shared-tier replica check not run");
        return;
    };
    let router = std::path::Path::new(&python).with_file_name("vllm-router");
    assert!(
        router.is_file(),
        "{router:?}: scripts/setup-test-deps.sh installs vllm-router"
    );
    let Some(redis) = redis_server::Redis::start(None, &[]) else {
        eprintln!("the shared-tier replica check not run");
        return;
    };
    let url = redis.url();
    let args = ["--threads", "1", "--kv-shared", &url];
    let (a, b) = (Server::start(&args), Server::start(&args));
    run_python_check(
        &python,
        "shared_tier_check.py",
        &[
            router.to_str().unwrap(),
            &a.url(""),
            &a.child.id().to_string(),
            &b.url(""),
            &b.child.id().to_string(),
        ],
    );
}
