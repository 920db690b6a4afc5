//! Two `serve` replicas sharing a KV tier in a real `redis-server` (`--kv-shared`) behind the real
//! vllm-router 0.1.17 (consistent_hash): a session's replica is killed with SIGKILL, the router moves
//! the session, and the other replica serves its next turn from the shared tier — ≥ 80% of the prompt
//! cached, the same greedy text as the warm replica gave (tests/shared_tier_check.py). Needs
//! `KVGATE_CI_PYTHON` (the venv with vllm-router) and redis-server (both installed by
//! scripts/setup-test-deps.sh; scripts/test.sh requires them).

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{run_python_check, Server};

struct Redis(Child);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let redis = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let _redis = match redis {
        Ok(c) => Redis(c),
        Err(e) if std::env::var_os("KVGATE_REQUIRE_REDIS").is_none() => {
            eprintln!("redis-server not found ({e}): the shared-tier replica check not run");
            return;
        }
        Err(e) => panic!("redis-server is required (scripts/setup-test-deps.sh installs it): {e}"),
    };
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("redis://127.0.0.1:{port}");
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
