//! The Responses WebSocket mode (`GET /v1/responses` upgraded) over the tiny in-process server, with a
//! plain WebSocket client (tungstenite): the create event answered with the SSE stream's events in
//! order; `store: false` chains continued from the connection's memory (and not over HTTP); the error
//! events (`previous_response_not_found`, invalid JSON, an unknown event, `background`), after which
//! the connection still answers; authentication and the browser `Origin` check on the handshake. The
//! real clients (openai-python's `responses.connect()`) are in `responses_socket_sdk.rs`.

mod common;

use std::net::TcpStream;

use common::InProcess;
use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;
use tungstenite::{Message, WebSocket};

type Socket = WebSocket<TcpStream>;

/// Opens `/v1/responses` on `port` with `headers`; the handshake's HTTP status when it is refused.
fn open(port: u16, headers: &[(&str, &str)]) -> Result<Socket, u16> {
    let mut req = format!("ws://127.0.0.1:{port}/v1/responses")
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        let name = tungstenite::http::HeaderName::from_bytes(k.as_bytes()).unwrap();
        req.headers_mut().insert(name, v.parse().unwrap());
    }
    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    match tungstenite::client(req, stream) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(r))) => Err(r.status().as_u16()),
        Err(e) => panic!("handshake: {e}"),
    }
}

fn send(ws: &mut Socket, v: Value) {
    ws.send(Message::Text(v.to_string().into())).unwrap();
}

fn next(ws: &mut Socket) -> Value {
    loop {
        match ws.read().unwrap() {
            Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected message {other:?}"),
        }
    }
}

/// The events of one turn, up to its terminal one (or an `error`).
fn turn(ws: &mut Socket, body: Value) -> Vec<Value> {
    send(ws, body);
    let mut out = vec![];
    loop {
        let e = next(ws);
        let kind = e["type"].as_str().unwrap_or_default().to_string();
        out.push(e);
        if matches!(
            kind.as_str(),
            "response.completed" | "response.incomplete" | "response.failed" | "error"
        ) {
            return out;
        }
    }
}

fn create(input: &str, extra: Value) -> Value {
    let mut v = json!({"type": "response.create", "input": input, "max_output_tokens": 4, "temperature": 0});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    v
}

#[test]
fn a_turn_streams_the_sse_events_and_a_chain_continues_from_the_connection() {
    let s = InProcess::tiny(&[]);
    let mut ws = open(s.port, &[]).expect("upgrade");
    let first = turn(&mut ws, create("Hello there", json!({"store": false})));
    let kinds: Vec<&str> = first.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[..2], ["response.created", "response.in_progress"], "{kinds:?}");
    assert!(
        matches!(*kinds.last().unwrap(), "response.completed" | "response.incomplete"),
        "{kinds:?}"
    );
    let seqs: Vec<u64> = first.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    let last = first.last().unwrap();
    let id = last["response"]["id"].as_str().unwrap().to_string();
    assert_eq!(last["response"]["store"], false);

    // store: false — the connection continues it; HTTP does not know it
    let second = turn(
        &mut ws,
        create("And again", json!({"store": false, "previous_response_id": id})),
    );
    let end = second.last().unwrap();
    assert_ne!(end["type"], "error", "{end}");
    assert_eq!(end["response"]["previous_response_id"], id.as_str());
    let (st, body) = s.post("/v1/responses", &json!({"input": "x", "previous_response_id": id}));
    assert_eq!(st, 404, "{body}");

    // only the end of a chain is kept: its start no longer continues
    let again = turn(
        &mut ws,
        create("Fork", json!({"store": false, "previous_response_id": id})),
    );
    let e = again.last().unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["status"], 404);
    assert_eq!(e["error"]["code"], "previous_response_not_found");
    ws.close(None).unwrap();
}

#[test]
fn problems_are_error_events_and_the_connection_goes_on() {
    let s = InProcess::tiny(&[]);
    let mut ws = open(s.port, &[]).expect("upgrade");
    ws.send(Message::Text("{not json".into())).unwrap();
    let e = next(&mut ws);
    assert_eq!(
        (e["type"].as_str(), e["status"].as_u64()),
        (Some("error"), Some(400)),
        "{e}"
    );
    assert_eq!(e["error"]["code"], "invalid_event");
    send(&mut ws, json!({"type": "response.steer", "input": "x"}));
    let e = next(&mut ws);
    assert_eq!(e["error"]["code"], "unknown_event_type", "{e}");
    send(&mut ws, create("x", json!({"background": true})));
    let e = next(&mut ws);
    assert_eq!(e["error"]["param"], "background", "{e}");
    send(&mut ws, create("x", json!({"previous_response_id": "resp_nope"})));
    let e = next(&mut ws);
    assert_eq!(e["error"]["code"], "previous_response_not_found", "{e}");
    send(&mut ws, create("x", json!({"temperature": "hot"})));
    let e = next(&mut ws);
    assert_eq!(e["status"], 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("temperature"), "{e}");
    // still answering; `stream` is implicit and accepted
    let ok = turn(&mut ws, create("Hi", json!({"stream": true})));
    assert_ne!(ok.last().unwrap()["type"], "error", "{ok:?}");
    // and a stored response is readable over HTTP
    let id = ok.last().unwrap()["response"]["id"].as_str().unwrap().to_string();
    let (st, body) = s.get(&format!("/v1/responses/{id}")).unwrap();
    assert_eq!(st, 200, "{body}");
}

#[test]
fn the_handshake_checks_keys_and_browser_origins() {
    let s = InProcess::tiny(&["--api-key", "k1", "--allowed-origins", "[\"http://app.local\"]"]);
    assert_eq!(open(s.port, &[]).err(), Some(401));
    assert!(open(s.port, &[("Authorization", "Bearer k1")]).is_ok());
    let evil = [("Authorization", "Bearer k1"), ("Origin", "http://evil.example")];
    assert_eq!(open(s.port, &evil).err(), Some(403));
    let app = [("Authorization", "Bearer k1"), ("Origin", "http://app.local")];
    let mut ws = open(s.port, &app).expect("a listed origin upgrades");
    let done = turn(&mut ws, create("Hi", json!({})));
    assert_ne!(done.last().unwrap()["type"], "error");
    // a plain GET is told what the route is
    let (st, _, body) = s
        .raw("GET", "/v1/responses", &[("Authorization", "Bearer k1")], b"")
        .unwrap();
    let body = common::parse(&body);
    assert_eq!(st, 400, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("WebSocket"),
        "{body}"
    );
}

#[test]
fn connections_are_capped_and_closed_when_idle() {
    let s = InProcess::tiny(&["--max-websocket-connections", "1", "--websocket-idle-timeout", "1"]);
    let mut first = open(s.port, &[]).expect("the first connection");
    assert_eq!(open(s.port, &[]).err(), Some(429), "past the cap");
    // idle past the timeout: closed by the server with 1001, and the slot is free again
    let started = std::time::Instant::now();
    let closed = loop {
        match first.read() {
            Ok(Message::Close(frame)) => break frame,
            Ok(_) => continue,
            Err(e) => panic!("expected a close frame, got {e}"),
        }
    };
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    let frame = closed.expect("a close frame with a code");
    assert_eq!(u16::from(frame.code), 1001, "{frame:?}");
    assert!(frame.reason.contains("idle"), "{frame:?}");
    drop(first);
    let mut again = None;
    for _ in 0..50 {
        if let Ok(ws) = open(s.port, &[]) {
            again = Some(ws);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut ws = again.expect("the slot was given back");
    let done = turn(&mut ws, create("Hi", json!({})));
    assert_ne!(done.last().unwrap()["type"], "error");
}

/// A client that vanishes mid-stream: the turn's engine request ends with it (nothing left running or
/// waiting), and the server goes on answering other connections. On the real `serve` (its metrics).
#[test]
fn a_client_gone_mid_stream_leaves_nothing_running() {
    let s = common::Server::start(&[]);
    let mut ws = open(s.port, &[]).expect("upgrade");
    send(
        &mut ws,
        json!({"type": "response.create", "input": "Write a very long story about a lighthouse keeper.",
               "max_output_tokens": 4000, "temperature": 0.8}),
    );
    for _ in 0..6 {
        next(&mut ws);
    }
    assert_eq!(s.metric("kvgate:num_requests_running"), 1.0, "the turn is running");
    drop(ws);
    let quiet = |s: &common::Server| {
        s.metric("kvgate:num_requests_running") == 0.0 && s.metric("kvgate:num_requests_waiting") == 0.0
    };
    let t = std::time::Instant::now();
    while !quiet(&s) {
        // 4,000 tokens take this model over 10 s on 2 cores: only an aborted request is gone in 3
        assert!(
            t.elapsed() < std::time::Duration::from_secs(3),
            "a request outlived its socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut other = open(s.port, &[]).expect("another connection");
    let done = turn(&mut other, create("Hi", json!({})));
    assert_ne!(done.last().unwrap()["type"], "error");
}

/// `generate: false` (Codex's start-up prewarm): the prompt is computed and kept, the response has no
/// output, and the turn that continues it finds its prompt cached.
#[test]
fn a_warm_up_turn_computes_the_prompt_and_the_next_turn_finds_it() {
    let s = InProcess::tiny(&["--block-size", "4"]);
    let mut ws = open(s.port, &[]).expect("upgrade");
    let long = "Here is the repository's README, which the agent reads before it works. ".repeat(6);
    let warm = turn(&mut ws, create(&long, json!({"generate": false, "store": false})));
    let kinds: Vec<&str> = warm.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["response.created", "response.completed"], "{warm:?}");
    let r = &warm[1]["response"];
    assert_eq!(r["output"], json!([]));
    assert_eq!(r["usage"]["output_tokens"], 0);
    let prompt = r["usage"]["input_tokens"].as_u64().unwrap();
    let next = turn(
        &mut ws,
        create("Now answer.", json!({"previous_response_id": r["id"], "store": false})),
    );
    let end = &next.last().unwrap()["response"];
    let cached = end["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    // all but the template's opening of the assistant's turn (and a partial block)
    assert!(
        cached + 16 >= prompt,
        "the warmed prompt is cached: {cached} of {prompt}"
    );
}

/// The states a connection's turns retained are held by the connection: while it is open they stay
/// (the next turn finds them), and when it closes they are let go at once (not at the end of the
/// session window). On the real `serve` (its metrics).
#[test]
fn a_closing_socket_releases_what_it_retained() {
    let s = common::Server::start(&[]);
    let retained = |s: &common::Server| s.metric("kvgate:kv_cache_retained_blocks");
    let mut ws = open(s.port, &[]).expect("upgrade");
    let long = "The agent reads the repository's README before it answers anything at all. ".repeat(8);
    let done = turn(&mut ws, create(&long, json!({"store": false})));
    assert_ne!(done.last().unwrap()["type"], "error");
    let t = std::time::Instant::now();
    while retained(&s) == 0.0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "the turn's state was not retained"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ws.close(None).unwrap();
    let _ = ws.read(); // the close handshake
    let t = std::time::Instant::now();
    while retained(&s) > 0.0 {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(5),
            "the socket closed and its state stayed pinned"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // a plain HTTP session keeps its window
    let body = json!({"input": long, "max_output_tokens": 2, "prompt_cache_key": "k"});
    let (st, r) = s.post("/v1/responses", &body);
    assert_eq!(st, 200, "{r}");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(retained(&s) > 0.0, "an HTTP session's state is retained for its window");
}

/// Codex's remote compaction over the socket, as over HTTP: an input ending with `compaction_trigger`
/// is answered with exactly one `compaction` item, and the compaction starts a new chain.
#[test]
fn a_compaction_trigger_over_the_socket() {
    // (the summary's own prompt is longer than the default tiny context)
    let s = InProcess::tiny_long(&[], 4096);
    let mut ws = open(s.port, &[]).expect("upgrade");
    let input = json!([
        {"role": "user", "content": "Please look at the build failure in the parser module."},
        {"role": "assistant", "content": "The parser fails on nested lists; I will fix the recursion."},
        {"type": "compaction_trigger"}
    ]);
    let events = turn(
        &mut ws,
        json!({"type": "response.create", "input": input, "store": false}),
    );
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ],
        "{events:?}"
    );
    let done = &events[4]["response"];
    let out = done["output"].as_array().unwrap();
    assert_eq!((out.len(), out[0]["type"].as_str()), (1, Some("compaction")), "{done}");
    // the window continues from the compaction item, on the socket
    let next = json!([{"type": "compaction", "encrypted_content": out[0]["encrypted_content"]},
                      {"role": "user", "content": "Go on."}]);
    let more = turn(&mut ws, create("", json!({"input": next})));
    assert_ne!(more.last().unwrap()["type"], "error", "{more:?}");
}
