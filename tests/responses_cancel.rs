//! `POST /v1/responses/{id}/cancel` on a streamed response, over a scripted engine that streams one
//! token and then waits for its caller (so the cancel cannot race the end): the stream ends at once with
//! the open message closed and `response.incomplete` carrying status `cancelled`, numbered in order; the
//! engine request is dropped (aborted); the stored response says `cancelled`; a second cancel is a 400
//! naming that status.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::InProcess;
use kvgate_engine::{
    DecideRequest, EmbedRequest, EngineError, Event, GenerateRequest, Limits, PendingDecision, PendingEmbedding,
    RequestStream,
};
use kvgate_server::infer::Inference;
use serde_json::{json, Value};

/// Streams one token, then holds the request open until the caller drops it (recorded).
struct Stalls {
    dropped: Arc<AtomicBool>,
}

impl Inference for Stalls {
    fn limits(&self) -> Limits {
        Limits {
            max_model_len: 4096,
            max_queue: 16,
            num_blocks: 256,
            block_size: 16,
            vocab_size: 300,
            hidden_size: 8,
            window_blocks: None,
            tree_attention: false,
        }
    }

    fn is_alive(&self) -> bool {
        true
    }

    fn generate(&self, _: GenerateRequest) -> Result<RequestStream, EngineError> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = tx.send(Event::Token {
            choice: 0,
            token: 1,
            text: "Hello".into(),
            logprob: None,
        });
        let dropped = self.dropped.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !tx.is_closed() && t0.elapsed() < Duration::from_secs(60) {
                std::thread::sleep(Duration::from_millis(5));
            }
            dropped.store(tx.is_closed(), Ordering::SeqCst);
        });
        Ok(RequestStream::detached(1, rx))
    }

    fn decide(&self, _: DecideRequest) -> Result<PendingDecision, EngineError> {
        Err(EngineError::EngineDead)
    }

    fn embed(&self, _: EmbedRequest) -> Result<PendingEmbedding, EngineError> {
        Err(EngineError::EngineDead)
    }

    fn shutdown(&self) {}
}

#[test]
fn a_streamed_response_is_cancelled() {
    let dropped = Arc::new(AtomicBool::new(false));
    let s = InProcess::with_engine(
        &[],
        Arc::new(Stalls {
            dropped: dropped.clone(),
        }),
    );
    let body = json!({"input": "Say hello.", "stream": true, "max_output_tokens": 50}).to_string();
    let mut conn = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        conn,
        "POST /v1/responses HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut r = BufReader::new(conn);
    let mut events: Vec<Value> = vec![];
    let mut id = String::new();
    let mut line = String::new();
    // read until the first text delta: the response is running
    while r.read_line(&mut line).unwrap() > 0 {
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            if let Ok(v) = serde_json::from_str::<Value>(d) {
                if v["type"] == "response.created" {
                    id = v["response"]["id"].as_str().unwrap().to_string();
                }
                let delta = v["type"] == "response.output_text.delta";
                events.push(v);
                if delta {
                    break;
                }
            }
        }
        line.clear();
    }
    assert!(!id.is_empty(), "{events:?}");
    let (st, c) = s.post(&format!("/v1/responses/{id}/cancel"), &json!({}));
    assert_eq!(st, 200, "{c}");
    assert_eq!(c["status"], "cancelled", "{c}");
    // the answer is the stored response (the cancel waited for its end signal), not a stub
    assert_eq!(c["output"][0]["content"][0]["text"], "Hello", "{c}");
    // the stream ends now, with the message closed and a response.incomplete saying cancelled
    line.clear();
    while r.read_line(&mut line).unwrap_or(0) > 0 {
        if let Some(d) = line.trim_end().strip_prefix("data: ") {
            if let Ok(v) = serde_json::from_str::<Value>(d) {
                events.push(v);
            }
        }
        line.clear();
    }
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.incomplete", "{kinds:?}");
    assert_eq!(last["response"]["status"], "cancelled");
    assert!(
        kinds.contains(&"response.output_text.done") && kinds.contains(&"response.output_item.done"),
        "{kinds:?}"
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // the engine's request went with the stream
    let t0 = Instant::now();
    while !dropped.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(dropped.load(Ordering::SeqCst), "the engine request was not aborted");
    let (st, g) = s.get(&format!("/v1/responses/{id}")).unwrap();
    assert_eq!((st, g["status"].as_str()), (200, Some("cancelled")), "{g}");
    let (st, again) = s.post(&format!("/v1/responses/{id}/cancel"), &json!({}));
    assert_eq!(st, 400, "{again}");
    assert!(
        again["error"]["message"].as_str().unwrap().contains("cancelled"),
        "{again}"
    );
}
