//! Reasoning out of the output of a model that thinks, over an engine scripted to answer
//! `<think>\nWeigh the order.\n</think>\n\nShip it today.` token by token: chat returns it as
//! `reasoning_content` and `reasoning` (streamed as their own deltas, never in `content`),
//! `include_reasoning: false` drops it, `separate_reasoning: false` leaves the text whole; the Responses
//! API returns a `reasoning` item (streamed as `response.reasoning_text.*`) before the message and counts
//! its tokens in `output_tokens_details.reasoning_tokens`.

mod common;

use std::sync::Arc;

use common::InProcess;
use kvgate_engine::{
    DecideRequest, EmbedRequest, EngineError, Event, FinishReason, GenerateRequest, Limits, PendingDecision,
    PendingEmbedding, RequestStream, Usage,
};
use kvgate_server::infer::Inference;
use serde_json::{json, Value};

const PIECES: [&str; 9] = [
    "<th",
    "ink>\n",
    "Weigh the ",
    "order.",
    "\n</",
    "think>",
    "\n\n",
    "Ship it",
    " today.",
];

struct Thinker;

impl Inference for Thinker {
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
        for (i, p) in PIECES.iter().enumerate() {
            let _ = tx.send(Event::Token {
                choice: 0,
                token: i as u32,
                text: p.to_string(),
                logprob: None,
            });
        }
        let _ = tx.send(Event::Finished {
            choice: 0,
            reason: FinishReason::Stop,
            text: String::new(),
            stop: None,
        });
        let _ = tx.send(Event::Done(Usage {
            cache_write_tokens: 0,
            prompt_tokens: 7,
            completion_tokens: PIECES.len(),
            cached_tokens: 0,
        }));
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

fn server() -> InProcess {
    InProcess::with_engine(&[], Arc::new(Thinker))
}

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Ship?"}], "max_tokens": 20});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn chat_splits_reasoning_from_the_answer() {
    let s = server();
    let (st, r) = s.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(st, 200, "{r}");
    let m = &r["choices"][0]["message"];
    assert_eq!(m["content"], "Ship it today.");
    assert_eq!(m["reasoning_content"], "\nWeigh the order.\n");
    assert_eq!(m["reasoning"], m["reasoning_content"]);
    let events: Vec<Value> = s
        .stream("/v1/chat/completions", &chat(json!({"stream": true})))
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let field = |f: &str| -> String {
        events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"][f].as_str())
            .collect()
    };
    assert_eq!(field("content"), "Ship it today.");
    assert_eq!(field("reasoning_content"), "\nWeigh the order.\n");
    assert_eq!(field("reasoning"), "\nWeigh the order.\n");
    let (_, r) = s.post("/v1/chat/completions", &chat(json!({"include_reasoning": false})));
    let m = &r["choices"][0]["message"];
    assert_eq!(m["content"], "Ship it today.");
    assert!(
        m.get("reasoning_content").is_none() && m.get("reasoning").is_none(),
        "{m}"
    );
    let (_, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"separate_reasoning": false, "stream_reasoning": true})),
    );
    assert_eq!(r["choices"][0]["message"]["content"], PIECES.concat());
    let (st, r) = s.post("/v1/chat/completions", &chat(json!({"stream_reasoning": false})));
    assert_eq!(st, 400, "{r}");
}

#[test]
fn responses_return_a_reasoning_item() {
    let s = server();
    let (st, r) = s.post("/v1/responses", &json!({"input": "Ship?", "max_output_tokens": 20}));
    assert_eq!(st, 200, "{r}");
    let out = r["output"].as_array().unwrap();
    assert_eq!(out[0]["type"], "reasoning", "{r}");
    assert_eq!(out[0]["content"][0]["type"], "reasoning_text");
    assert_eq!(out[0]["content"][0]["text"], "\nWeigh the order.\n");
    assert_eq!(out[1]["type"], "message");
    assert_eq!(out[1]["content"][0]["text"], "Ship it today.");
    assert!(
        r["usage"]["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0,
        "{r}"
    );
    let events: Vec<Value> = s
        .stream(
            "/v1/responses",
            &json!({"input": "Ship?", "max_output_tokens": 20, "stream": true}),
        )
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = |k: &str| {
        kinds
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("{k} in {kinds:?}"))
    };
    assert!(at("response.reasoning_text.delta") < at("response.reasoning_text.done"));
    assert!(at("response.reasoning_text.done") < at("response.output_text.delta"));
    let reasoning: String = events
        .iter()
        .filter(|e| e["type"] == "response.reasoning_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(reasoning, "\nWeigh the order.\n");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["output"][0]["type"], "reasoning");
    let n = last["response"]["usage"]["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!((4..=6).contains(&n), "reasoning tokens {n}");
}
