//! The server processes the side-by-side benches start (kvgate's `serve`, `llama-server`): a free
//! loopback port, a process killed on drop, the wait for its `/health`, and a streamed request's
//! events.

use std::io::BufRead;
use std::process::Child;
use std::time::Duration;

use serde_json::Value;

/// A server process on a loopback port, killed on drop.
pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) port: u16,
    /// Seconds from the process's start to its first answered `/health`.
    pub(crate) ready_secs: f64,
}

impl Proc {
    /// The process's resident memory now (bytes; 0 where /proc does not tell).
    #[allow(dead_code)] // the anchor bench reads it, the speculation bench does not
    pub(crate) fn rss(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map_or(0, |kb| kb * 1024)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on now.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until `child` (started just now) answers /health on `port` (up to two minutes; a process
/// that exits fails at once), timing it to within 20 ms.
pub(crate) fn healthy(child: Child, port: u16) -> Proc {
    let t0 = std::time::Instant::now();
    let mut p = Proc {
        child,
        port,
        ready_secs: 0.0,
    };
    for _ in 0..6000 {
        if let Ok(r) = ureq::get(&format!("http://127.0.0.1:{port}/health")).call() {
            if r.status() == 200 {
                p.ready_secs = t0.elapsed().as_secs_f64();
                return p;
            }
        }
        if let Ok(Some(s)) = p.child.try_wait() {
            panic!("server on port {port} exited: {s}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server on port {port} did not become healthy");
}

/// POSTs `body` to `path` on `port` and yields the JSON of each server-sent `data:` event as it
/// arrives (lines that are not JSON events are skipped; an hour's limit).
pub(crate) fn sse_events(port: u16, path: &str, body: &Value) -> impl Iterator<Item = Value> {
    let r = ureq::post(&format!("http://127.0.0.1:{port}{path}"))
        .config()
        .timeout_global(Some(Duration::from_secs(3600)))
        .build()
        .send_json(body)
        .unwrap_or_else(|e| panic!("{path} on port {port}: {e}"));
    std::io::BufReader::new(r.into_body().into_reader())
        .lines()
        .map_while(Result::ok)
        .filter_map(|line| serde_json::from_str::<Value>(line.strip_prefix("data: ")?).ok())
}
