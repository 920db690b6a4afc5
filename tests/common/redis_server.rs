//! A `redis-server` (Debian's, installed by scripts/setup-test-deps.sh) on a loopback port for the
//! shared KV tier's tests and bench, killed when dropped. Included by path where it is used
//! (`tests/shared_tier_replicas.rs`, `crates/kvgate-engine/tests/shared_tier.rs`,
//! `benches/shared_tier.rs`).

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server` and its port.
pub struct Redis {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

impl Redis {
    /// Starts one on `port` (or a free one) with `extra` arguments, without persistence, and waits until
    /// it accepts connections. `None` when there is no redis-server here and `KVGATE_REQUIRE_REDIS`
    /// (scripts/test.sh sets it) is unset; with it set, a missing server fails the test.
    pub fn start(port: Option<u16>, extra: &[&str]) -> Option<Redis> {
        let port = port.unwrap_or_else(|| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        });
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) if std::env::var_os("KVGATE_REQUIRE_REDIS").is_none() => {
                eprintln!("redis-server not found ({e}); skipping (scripts/setup-test-deps.sh installs it)");
                return None;
            }
            Err(e) => panic!("redis-server is required (scripts/setup-test-deps.sh installs it): {e}"),
        };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Redis { child, port })
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
