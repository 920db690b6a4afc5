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

/// Waits until `child` answers /health on `port` (up to two minutes; a process that exits fails
/// at once).
pub(crate) fn healthy(child: Child, port: u16) -> Proc {
    let mut p = Proc { child, port };
    for _ in 0..1200 {
        if let Ok(r) = ureq::get(&format!("http://127.0.0.1:{port}/health")).call() {
            if r.status() == 200 {
                return p;
            }
        }
        if let Ok(Some(s)) = p.child.try_wait() {
            panic!("server on port {port} exited: {s}");
        }
        std::thread::sleep(Duration::from_millis(100));
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
