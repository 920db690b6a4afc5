//! The server processes the side-by-side benches start (kvgate's `serve`, `llama-server`): a free
//! loopback port, a process killed on drop, and the wait for its `/health`.

use std::process::Child;
use std::time::Duration;

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
