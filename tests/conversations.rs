//! Conversations are typed from the wire to the template (`kvgate_model::prompt::Message`), the same
//! way for every route that takes them, over the tiny model in process: content parts join into the
//! same text as a string; tool calls render the same on `/tokenize` as on chat; a conversation state
//! of `/v1/systemone` is normalised by its validator, so a message chat refuses is a 422 at
//! `body.state`, listed with the body's other problems. `/tokenize` and `/detokenize` bodies are serde
//! types: a wrong type or an unknown field is a 400 naming it.

mod common;

use common::InProcess;
use serde_json::json;

#[test]
fn parts_and_strings_render_alike_and_tool_calls_pass_through() {
    let s = InProcess::tiny(&[]);
    let tokens = |messages: serde_json::Value| {
        let (st, r) = s.post("/tokenize", &json!({"messages": messages}));
        assert_eq!(st, 200, "{r}");
        r["tokens"].clone()
    };
    let plain = tokens(json!([{"role": "user", "content": "hello\nthere"}]));
    let parts = tokens(json!([{"role": "user", "content": [
        {"type": "text", "text": "hello"}, {"type": "text", "text": "there"}]}]));
    assert_eq!(plain, parts);
    let call = json!([
        {"role": "user", "content": "add 1 and 2"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    ]);
    let with_call = tokens(call.clone());
    assert_ne!(with_call, tokens(json!([{"role": "user", "content": "add 1 and 2"}])));
    // the same conversation as a chat completion prompt: the same tokens
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": call, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(
        r["usage"]["prompt_tokens"].as_u64(),
        Some(with_call.as_array().unwrap().len() as u64)
    );
}

#[test]
fn a_refused_message_in_a_state_is_a_422_at_state_with_the_other_problems() {
    let s = InProcess::tiny(&[]);
    let state = json!([
        {"role": "user", "content": "My payouts fail."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    ]);
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": state, "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}}),
    );
    assert_eq!(st, 422, "{r}");
    let d = &r["detail"];
    assert_eq!(d.as_array().unwrap().len(), 1, "{r}");
    assert_eq!(d[0]["type"], "value_error");
    assert_eq!(d[0]["loc"], json!(["body", "state"]));
    let msg = d[0]["msg"].as_str().unwrap();
    assert!(
        msg.starts_with("Value error, ") && msg.contains("state[1].content[0]") && msg.contains("image_url"),
        "{msg}"
    );
    // with another problem in the same body, both are listed
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": state, "questions": {"q": {"type": "noul", "instructions": "Urgent?", "frobnicate": 1}}}),
    );
    assert_eq!(st, 422, "{r}");
    let locs: Vec<&serde_json::Value> = r["detail"].as_array().unwrap().iter().map(|d| &d["loc"]).collect();
    assert!(locs.contains(&&json!(["body", "state"])), "{r}");
    assert!(locs.contains(&&json!(["body", "questions", "q", "frobnicate"])), "{r}");
    // a well-formed conversation state answers
    let ok = json!([{"role": "system", "content": "Support."}, {"role": "user", "content": "My payouts fail."}]);
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": ok, "questions": {"q": {"type": "noul", "instructions": "Urgent?"}}}),
    );
    assert_eq!(st, 200, "{r}");
}

#[test]
fn tokenize_bodies_are_typed() {
    let s = InProcess::tiny(&[]);
    for (path, body, param, says) in [
        ("/tokenize", json!({"prompt": 3}), "prompt", "'prompt'"),
        (
            "/tokenize",
            json!({"prompt": "x", "add_special_tokens": "yes"}),
            "add_special_tokens",
            "'add_special_tokens'",
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "frobnicate": 1}),
            "frobnicate",
            "unknown parameter 'frobnicate'",
        ),
        ("/tokenize", json!({"prompt": "x", "messages": []}), "", "not both"),
        ("/detokenize", json!({"tokens": [1, -2]}), "tokens", "'tokens[1]'"),
        ("/detokenize", json!({}), "tokens", "'tokens' is required"),
    ] {
        let (st, r) = s.post(path, &body);
        assert_eq!(st, 400, "{path} {body}: {r}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{path} {body}: {msg}");
        if !param.is_empty() {
            assert_eq!(r["error"]["param"], param, "{r}");
        }
    }
    let (st, r) = s.post("/tokenize", &json!({"prompt": "hello", "add_special_tokens": null}));
    assert_eq!(st, 200, "null is absent: {r}");
}

/// A session hint (`X-Session-ID` or `prompt_cache_key`) retains a completion's state through a
/// flood of other prompts; without one it is evicted like any other.
#[test]
fn a_session_hint_keeps_the_state_for_the_next_turn() {
    let args = ["--num-kv-blocks", "64", "--block-size", "4", "--session-window", "600"];
    let s = InProcess::tiny(&args);
    let state = |i: usize| {
        let who = ["Alpha", "Bravo", "Charlie", "Delta"][i];
        format!("{who} reports: the order is late, the customer is upset, a refund is asked for.")
    };
    let next_turn_cached = |hint: Option<(&str, &str)>, body_key: Option<&str>, i: usize| -> u64 {
        let mut first = json!({"prompt": state(i), "max_tokens": 1, "temperature": 0});
        if let Some(k) = body_key {
            first["prompt_cache_key"] = json!(k);
        }
        let headers: Vec<(&str, &str)> = hint.into_iter().collect();
        let (st, _, r) = s.post_with("/v1/completions", &headers, &first);
        assert_eq!(st, 200, "{r}");
        for j in 0..6 {
            let cold = json!({"prompt": format!("Unrelated prompt {i}-{j} about warehouses and shipping lanes."), "max_tokens": 1});
            let (st, r) = s.post("/v1/completions", &cold);
            assert_eq!(st, 200, "{r}");
        }
        let next = json!({"prompt": format!("{} And now?", state(i)), "max_tokens": 1, "temperature": 0});
        let (st, _, r) = s.post_with("/v1/completions", &headers, &next);
        assert_eq!(st, 200, "{r}");
        r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    let kept = next_turn_cached(Some(("X-Session-ID", "s1")), None, 1);
    assert!(kept >= 40, "the state's blocks: {kept}");
    let kept = next_turn_cached(None, Some("s2"), 2);
    assert!(kept >= 40, "the state's blocks: {kept}");
    assert_eq!(next_turn_cached(None, None, 3), 0, "no hint: evicted by the flood");
}

/// With a second tier (`--kv-offload-memory`), a state evicted by a flood is restored instead of
/// recomputed, with no session hint at all: the next turn's `cached_tokens` counts the restored tokens
/// (without the tier the same flood leaves nothing: see the hint test above). The metrics are checked
/// on the real model in `engine_e2e.rs`.
#[test]
fn an_evicted_state_is_restored_from_the_second_tier() {
    let args = [
        "--num-kv-blocks",
        "64",
        "--block-size",
        "4",
        "--session-window",
        "0",
        "--kv-offload-memory",
        "16MiB",
    ];
    let s = InProcess::tiny(&args);
    let state = "Echo reports: the order is late, the customer is upset, a refund is asked for.";
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": state, "max_tokens": 1, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    for j in 0..6 {
        let cold =
            json!({"prompt": format!("Unrelated prompt {j} about warehouses and shipping lanes."), "max_tokens": 1});
        let (st, r) = s.post("/v1/completions", &cold);
        assert_eq!(st, 200, "{r}");
    }
    let next = json!({"prompt": format!("{state} And now?"), "max_tokens": 1, "temperature": 0});
    let (st, r) = s.post("/v1/completions", &next);
    assert_eq!(st, 200, "{r}");
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= 40, "restored from the tier: {cached}");
}
