//! `POST /v1/responses` over the tiny model in process: the response object and its typed stream (in
//! order, numbered, always ending with completed / incomplete / failed, the same text as unstreamed),
//! stored responses (GET, DELETE, per API key, `store: false`), `previous_response_id` over a warm
//! state, tools (function tools; custom ones and earlier calls as input; hosted ones left out; a custom
//! tool's call is checked on the real model by tests/openai_sdk_check.py), `text.format`, and the 400s
//! and 404s real clients can hit, each naming the field.

mod common;

use common::InProcess;
use serde_json::{json, Value};

fn server() -> InProcess {
    InProcess::tiny(&["--block-size", "4"])
}

fn text_of(r: &Value) -> String {
    r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "message")
        .flat_map(|o| o["content"].as_array().unwrap().iter())
        .map(|c| c["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_response_and_its_stream_agree() {
    let s = server();
    let body = json!({"input": "Tell me about the sea.", "max_output_tokens": 12, "temperature": 0});
    let (st, r) = s.post("/v1/responses", &body);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["object"], "response");
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    let u = &r["usage"];
    assert_eq!(u["output_tokens"], 12);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["input_tokens"].as_u64().unwrap() + 12)
    );
    assert!(u["input_tokens_details"]["cached_tokens"].is_u64() && u["output_tokens_details"]["reasoning_tokens"] == 0);
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let events: Vec<Value> = s
        .stream("/v1/responses", &sb)
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete"
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(deltas, text_of(&r), "streamed text = unstreamed text");
    let last = &events.last().unwrap()["response"];
    assert_eq!(text_of(last), text_of(&r));
    assert_eq!(last["status"], "incomplete");
}

#[test]
fn stored_responses_are_per_key_and_continue_warm() {
    let s = InProcess::tiny(&["--block-size", "4", "--api-key", "ka", "--api-key", "kb"]);
    let (a, b) = ([("Authorization", "Bearer ka")], [("Authorization", "Bearer kb")]);
    let state = "Order 17 left the north warehouse on Monday and the customer asks when it arrives. ".repeat(3);
    let (st, _, r) = s.post_with(
        "/v1/responses",
        &a,
        &json!({"input": state, "max_output_tokens": 8, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    let turn = r["usage"]["total_tokens"].as_u64().unwrap();
    let get = |h: &[(&str, &str)], id: &str| s.raw("GET", &format!("/v1/responses/{id}"), h, b"").unwrap().0;
    assert_eq!(get(&a, &id), 200);
    assert_eq!(get(&b, &id), 404, "another key does not see it");
    // the next turn over the stored conversation finds its tokens warm
    let (st, _, r2) = s.post_with(
        "/v1/responses",
        &a,
        &json!({"input": "And now?", "previous_response_id": id, "max_output_tokens": 2}),
    );
    assert_eq!(st, 200, "{r2}");
    let cached = r2["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached as f64 >= 0.9 * turn as f64, "{cached} of {turn}");
    assert_eq!(r2["previous_response_id"], id.as_str());
    let (st, _, r3) = s.post_with("/v1/responses", &b, &json!({"input": "x", "previous_response_id": id}));
    assert_eq!(st, 404, "{r3}");
    // cancel: a finished response is a 400 naming its status; delete, then it is gone
    let (st, _, c) = s.post_with(&format!("/v1/responses/{id}/cancel"), &a, &json!({}));
    assert_eq!(st, 400, "{c}");
    assert!(c["error"]["message"].as_str().unwrap().contains("incomplete"), "{c}");
    let (st, _, d) = s.raw("DELETE", &format!("/v1/responses/{id}"), &a, b"").unwrap();
    assert_eq!(st, 200);
    assert_eq!(common::parse(&d)["deleted"], true);
    assert_eq!(get(&a, &id), 404);
    // store: false keeps nothing
    let (_, _, r) = s.post_with(
        "/v1/responses",
        &a,
        &json!({"input": "hi", "max_output_tokens": 2, "store": false}),
    );
    assert_eq!(r["store"], false);
    assert_eq!(get(&a, r["id"].as_str().unwrap()), 404);
}

#[test]
fn tools_and_text_format() {
    let s = InProcess::tiny_long(&["--block-size", "4"], 4096);
    let tools = json!([
        {"type": "function", "name": "get_weather", "description": "Weather in a city", "strict": true,
         "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"], "additionalProperties": false}},
        {"type": "custom", "name": "apply_patch", "description": "Apply a patch"},
        {"type": "web_search"}
    ]);
    let (st, r) = s.post(
        "/v1/responses",
        &json!({"input": "Weather in Paris?", "tools": tools, "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 200}),
    );
    assert_eq!(st, 200, "{r}");
    let calls: Vec<&Value> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["type"] == "function_call")
        .collect();
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!(calls[0]["name"], "get_weather");
    assert!(calls[0]["call_id"].as_str().unwrap().starts_with("call_"));
    let args: Value = serde_json::from_str(calls[0]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"] == "Paris" || args["city"] == "Rome", "{args}");
    assert_eq!(r["status"], "completed", "one forced call, then the grammar ends: {r}");
    // earlier calls and their outputs as input items
    let (st, r) = s.post(
        "/v1/responses",
        &json!({"input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** patch"},
            {"type": "custom_tool_call_output", "call_id": "call_2", "output": "done"},
            {"type": "reasoning", "id": "rs_1", "summary": []}
        ], "tools": tools, "max_output_tokens": 4}),
    );
    assert_eq!(st, 200, "{r}");
    let schema = json!({"type": "object", "properties": {"team": {"enum": ["billing", "tech"]}}, "required": ["team"], "additionalProperties": false});
    let (st, r) = s.post(
        "/v1/responses",
        &json!({"input": "Which team?", "text": {"format": {"type": "json_schema", "name": "t", "schema": schema, "strict": true}}, "max_output_tokens": 40}),
    );
    assert_eq!(st, 200, "{r}");
    let v: Value = serde_json::from_str(&text_of(&r)).unwrap();
    assert!(v["team"] == "billing" || v["team"] == "tech", "{v}");
}

#[test]
fn what_is_refused_is_named() {
    let s = server();
    let cases = [
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]}),
            400,
            "input[0].content[0]",
        ),
        (json!({"input": "hi", "frobnicate": 1}), 400, "frobnicate"),
        (
            json!({"input": "hi", "background": true, "store": false}),
            400,
            "must be stored",
        ),
        (json!({"input": "hi", "conversation": "conv_nope"}), 404, "conv_nope"),
        (
            json!({"input": "hi", "conversation": "conv_x", "previous_response_id": "resp_x"}),
            400,
            "cannot be used together",
        ),
        (
            json!({"input": [{"type": "compaction", "encrypted_content": "cmp_nope"}]}),
            404,
            "cmp_nope",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            404,
            "msg_1",
        ),
        (
            json!({"input": "hi", "tools": [{"type": "computer_use"}]}),
            400,
            "tools[0].type",
        ),
        (json!({"input": "hi", "truncation": "middle"}), 400, "truncation"),
        (
            json!({"input": "hi", "previous_response_id": "resp_nope"}),
            404,
            "resp_nope",
        ),
        (json!({"model": "gpt-9"}), 404, "gpt-9"),
        (json!({}), 400, "'input' is required"),
        (json!({"input": 5}), 400, "'input' must be"),
    ];
    for (body, status, says) in cases {
        let (st, r) = s.post("/v1/responses", &body);
        assert_eq!(st, status, "{body}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(says), "{body}: {r}");
        // the Open Responses schema's error: `code` a string
        assert!(r["error"]["code"].is_string(), "{body}: {r}");
    }
    let (st, r) = s.post("/v1/responses", &json!({"input": "hi", "top_logprobs": 21}));
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("top_logprobs")), "{r}");
    // compaction names its model, as the spec requires
    let (st, r) = s.post("/v1/responses/compact", &json!({"input": "hi"}));
    assert_eq!((st, r["error"]["param"].as_str()), (400, Some("model")), "{r}");
    let (st, _, _) = s.raw("GET", "/v1/responses/resp_nope", &[], b"").unwrap();
    assert_eq!(st, 404);
    let (st, _, _) = s.post_with("/v1/responses/resp_nope/cancel", &[], &json!({}));
    assert_eq!(st, 404);
}

/// `top_logprobs` (or `include: ["message.output_text.logprobs"]`): each output-text delta carries its
/// token's logprob with that many alternatives, and the text part holds them all — streamed or not,
/// the same tokens.
#[test]
fn output_text_carries_its_logprobs() {
    let s = server();
    let body = json!({"input": "Say something.", "max_output_tokens": 6, "temperature": 0, "top_logprobs": 2});
    let (st, r) = s.post("/v1/responses", &body);
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["top_logprobs"], 2);
    let part = &r["output"][0]["content"][0];
    let lps = part["logprobs"].as_array().unwrap();
    assert!(!lps.is_empty(), "{r}");
    for lp in lps {
        assert!(lp["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2, "{lp}");
        assert!(lp["bytes"].is_array() && lp["token"].is_string(), "{lp}");
    }
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let events: Vec<Value> = s
        .stream("/v1/responses", &streamed)
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    let deltas: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .collect();
    let from_deltas: Vec<Value> = deltas
        .iter()
        .flat_map(|d| d["logprobs"].as_array().unwrap().clone())
        .collect();
    assert_eq!(&from_deltas, lps, "the deltas' logprobs are the body's");
    let done = events
        .iter()
        .find(|e| e["type"] == "response.output_text.done")
        .unwrap();
    assert_eq!(done["logprobs"].as_array().unwrap(), lps);
    // by `include`: the tokens' own logprobs, no alternatives
    let (_, r) = s.post(
        "/v1/responses",
        &json!({"input": "Say something.", "max_output_tokens": 6, "temperature": 0,
                "include": ["message.output_text.logprobs"]}),
    );
    let lps = r["output"][0]["content"][0]["logprobs"].as_array().unwrap().clone();
    assert!(
        !lps.is_empty() && lps.iter().all(|l| l["top_logprobs"].as_array().unwrap().is_empty()),
        "{r}"
    );
    // and without either, none
    let (_, r) = s.post(
        "/v1/responses",
        &json!({"input": "Say something.", "max_output_tokens": 6}),
    );
    assert_eq!(r["output"][0]["content"][0]["logprobs"], json!([]), "{r}");
}

/// An `item_reference` names an item of the previous response's output (or the conversation's) and
/// reads as that item.
#[test]
fn item_references_name_the_previous_output() {
    let s = server();
    let (st, first) = s.post(
        "/v1/responses",
        &json!({"input": "Hello", "max_output_tokens": 4, "temperature": 0}),
    );
    assert_eq!(st, 200, "{first}");
    let msg_id = first["output"][0]["id"].as_str().unwrap().to_string();
    let body = json!({"input": [{"type": "item_reference", "id": msg_id}, {"role": "user", "content": "Again"}],
                      "previous_response_id": first["id"], "max_output_tokens": 4, "temperature": 0});
    let (st, r) = s.post("/v1/responses", &body);
    assert_eq!(st, 200, "{r}");
    let (st, r) = s.post(
        "/v1/responses",
        &json!({"input": [{"type": "item_reference", "id": "msg_unknown"}], "previous_response_id": first["id"]}),
    );
    assert_eq!(st, 404, "{r}");
    assert!(r["error"]["message"].as_str().unwrap().contains("msg_unknown"), "{r}");

    // in a conversation, a reference is kept as the item it names: later turns read it as that item
    let (st, conv) = s.post(
        "/v1/conversations",
        &json!({"items": [{"type": "function_call", "id": "fc_a", "call_id": "c1", "name": "f", "arguments": "{}", "echoed": 1}]}),
    );
    assert_eq!(st, 200, "{conv}");
    let turn = |input: Value| {
        let (st, r) = s.post(
            "/v1/responses",
            &json!({"input": input, "conversation": conv["id"], "max_output_tokens": 2, "temperature": 0}),
        );
        assert_eq!(st, 200, "{r}");
    };
    turn(
        json!([{"type": "item_reference", "id": "fc_a"}, {"type": "function_call_output", "call_id": "c1", "output": "3"}]),
    );
    turn(json!("And then?"));
    let (st, items) = s
        .get(&format!(
            "/v1/conversations/{}/items?order=asc",
            conv["id"].as_str().unwrap()
        ))
        .unwrap();
    assert_eq!(st, 200, "{items}");
    let kinds: Vec<&str> = items["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "function_call",
            "function_call",
            "function_call_output",
            "message",
            "message",
            "message"
        ],
        "{items}"
    );
    let first = &items["data"][0];
    assert_eq!(
        first["status"], "completed",
        "typed and listed in the Responses shape: {first}"
    );
    assert!(
        first.get("echoed").is_none(),
        "fields kvgate does not read are not kept: {first}"
    );
}

/// SSE `data:` payloads of a body, as JSON.
fn sse_events(body: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

/// A background response streams at create (`stream: true`) and later, from the start or resumed
/// after an event (`GET /v1/responses/{id}?stream=true&starting_after=N`), always the same events.
#[test]
fn background_responses_stream_and_resume() {
    let s = server();
    let body = json!({"input": "Tell me something.", "max_output_tokens": 8, "temperature": 0, "background": true});
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let live: Vec<Value> = s
        .stream("/v1/responses", &streamed)
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    assert_eq!(live.first().unwrap()["type"], "response.created", "{live:?}");
    assert!(
        matches!(
            live.last().unwrap()["type"].as_str(),
            Some("response.completed" | "response.incomplete")
        ),
        "{live:?}"
    );
    let id = live[0]["response"]["id"].as_str().unwrap().to_string();
    // the whole stream again, then resumed after event 2
    let (st, _, all) = s
        .raw("GET", &format!("/v1/responses/{id}?stream=true"), &[], b"")
        .unwrap();
    assert_eq!(st, 200);
    assert_eq!(sse_events(&all), live, "a replay is the live stream");
    let (st, _, rest) = s
        .raw(
            "GET",
            &format!("/v1/responses/{id}?stream=true&starting_after=2"),
            &[],
            b"",
        )
        .unwrap();
    assert_eq!(st, 200);
    let rest = sse_events(&rest);
    assert_eq!(rest[..], live[3..], "resumed after sequence number 2");
    assert_eq!(rest[0]["sequence_number"], 3);
    // queued, then streamed while (or after) it runs
    let (st, q) = s.post("/v1/responses", &body);
    assert_eq!((st, q["status"].as_str()), (200, Some("queued")), "{q}");
    let qid = q["id"].as_str().unwrap();
    let (_, _, ev) = s
        .raw("GET", &format!("/v1/responses/{qid}?stream=true"), &[], b"")
        .unwrap();
    let ev = sse_events(&ev);
    assert!(
        matches!(
            ev.last().unwrap()["type"].as_str(),
            Some("response.completed" | "response.incomplete")
        ),
        "{ev:?}"
    );
    let (_, stored) = s.get(&format!("/v1/responses/{qid}")).unwrap();
    assert_eq!(stored["status"], ev.last().unwrap()["response"]["status"]);
    // a response that did not run in the background has no stream; a resume needs one
    let (_, plain) = s.post("/v1/responses", &json!({"input": "Hi", "max_output_tokens": 2}));
    let pid = plain["id"].as_str().unwrap();
    let (st, _, b) = s
        .raw("GET", &format!("/v1/responses/{pid}?stream=true"), &[], b"")
        .unwrap();
    assert_eq!(st, 400, "{}", String::from_utf8_lossy(&b));
    let (st, _, _) = s
        .raw("GET", &format!("/v1/responses/{pid}?starting_after=1"), &[], b"")
        .unwrap();
    assert_eq!(st, 400);
}
