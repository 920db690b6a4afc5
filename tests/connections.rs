//! Connection hygiene of the real `serve`: silent connections, half-sent headers, idle keep-alive
//! connections and stalled bodies are closed after their timeouts; past `--max-connections` new
//! connections are closed at once and the refusal is logged; and shutdown does not wait for
//! connections that never sent a full request.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::Server;
use serde_json::json;

/// Reads until the server closes the connection (or `limit` passes); returns what it sent.
fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let t0 = Instant::now();
    let mut out = vec![];
    let mut buf = [0u8; 4096];
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Some(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(out),
        }
    }
    None
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).unwrap()
}

#[test]
fn slow_and_silent_connections_are_closed_and_the_cap_is_kept() {
    let s = Server::start(&[
        "--header-read-timeout",
        "1",
        "--body-read-timeout",
        "1",
        "--max-connections",
        "6",
        "--shutdown-timeout",
        "60",
    ]);
    let port = s.port;
    let limit = Duration::from_secs(8);
    // silent
    let mut silent = connect(port);
    assert!(
        read_until_closed(&mut silent, limit).is_some(),
        "a silent connection is closed"
    );
    // half-sent header
    let mut half = connect(port);
    half.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        .unwrap();
    assert!(
        read_until_closed(&mut half, limit).is_some(),
        "a half-sent header is closed"
    );
    // a body that stalls
    let mut short = connect(port);
    short
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
        .unwrap();
    let reply = read_until_closed(&mut short, limit).expect("a stalled body ends");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 4"), "{text}");
    // idle keep-alive after a request
    let mut idle = connect(port);
    idle.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let reply = read_until_closed(&mut idle, limit).expect("an idle keep-alive connection is closed");
    assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 200"));
    // the cap: 6 open connections, the 7th is closed at once and the refusal logged
    let mut held: Vec<TcpStream> = (0..6).map(|_| connect(port)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = connect(port);
    let r = read_until_closed(&mut extra, Duration::from_millis(900));
    assert!(
        r.is_some_and(|b| b.is_empty()),
        "past the cap a connection is closed at once"
    );
    // the log writer may lag the close by a moment
    let t0 = Instant::now();
    while !s.log_text().contains("connection refused") && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(s.log_text().contains("connection refused"), "{}", s.log_text());
    // once the held ones time out, the server serves again
    for h in &mut held {
        assert!(read_until_closed(h, limit).is_some());
    }
    let (st, _) = s.post("/v1/completions", &json!({"prompt": "hi", "max_tokens": 1}));
    assert_eq!(st, 200);
}

#[test]
fn shutdown_does_not_wait_for_a_connection_that_never_sent_a_full_request() {
    // timeouts far longer than the test allows: only a shutdown that closes the connection ends it
    let mut s = Server::start(&["--header-read-timeout", "120", "--shutdown-timeout", "120"]);
    let port = s.port;
    let mut pending = connect(port);
    pending.write_all(b"GET /health HTTP/1.1\r\nHo").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let pid = s.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t0 = Instant::now();
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "{st}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "serve waited on a half-sent request (shutdown timeout 60 s)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
