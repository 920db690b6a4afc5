//! The typed item: both readings, the exact paths, the stored shape and the round trip.

use serde_json::{json, Value};

use super::*;

fn param(e: ApiError) -> (String, String) {
    match e {
        ApiError::BadRequest { message, param } => (param.unwrap_or_default(), message),
        other => panic!("not a 400: {other}"),
    }
}

/// One item of every type, with the fields clients send.
fn every_type() -> Value {
    json!([
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Order ", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}},
            {"type": "input_json", "data": {"id": 7}}
        ]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "phase": "final_answer",
         "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}, {"type": "refusal", "refusal": "no"}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}", "namespace": "ns", "status": "completed"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "12"}]},
        {"type": "custom_tool_call", "call_id": "c2", "name": "patch", "input": "diff"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "done"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}], "status": "completed"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": "cmp_1", "created_by": "kvgate"},
        {"type": "compaction_trigger"},
        {"type": "item_reference", "id": "fc_1"}
    ])
}

#[test]
fn every_type_reads_and_round_trips_through_the_stored_shape() {
    let items = read_list(&every_type(), "input", Unknown::Refuse).unwrap();
    let kinds: Vec<&str> = items.iter().map(InputItem::kind).collect();
    assert_eq!(kinds[2..], TYPES[..], "one item of each type, in order");
    // what is kept is what is read back: the stored shape is input
    for it in items {
        let stored = it.stored();
        let back = read(stored.to_json(), "x", Unknown::Refuse).unwrap();
        assert_eq!(back, stored);
        assert!(stored.id().is_some(), "{stored:?}");
    }
}

#[test]
fn the_stored_shape_is_the_listed_one() {
    let s = read(json!({"role": "user", "content": "hi"}), "i", Unknown::Ignore)
        .unwrap()
        .stored();
    let v = s.to_json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["content"], json!([{"type": "input_text", "text": "hi"}]));
    assert!(v["id"].as_str().unwrap().starts_with("msg_"), "{v}");
    let a = InputItem::assistant("yes".into()).stored().to_json();
    assert_eq!(
        a["content"],
        json!([{"type": "output_text", "text": "yes", "annotations": []}])
    );
    let o = read(
        json!({"type": "custom_tool_call_output", "call_id": "c", "output": "x"}),
        "i",
        Unknown::Ignore,
    )
    .unwrap()
    .stored()
    .to_json();
    assert!(o["id"].as_str().unwrap().starts_with("ctco_"), "{o}");
    assert!(o.get("status").is_none(), "{o}");
    let given = read(
        json!({"type": "function_call", "id": "fc_9", "call_id": "c", "name": "f", "arguments": "{}"}),
        "i",
        Unknown::Ignore,
    )
    .unwrap()
    .stored();
    assert_eq!(given.id(), Some("fc_9"));
}

#[test]
fn unknown_fields_are_refused_by_path_or_let_go() {
    let cases = [
        (json!({"role": "user", "content": "x", "mood": "glad"}), "input[0].mood"),
        (
            json!({"role": "user", "content": [{"type": "input_text", "text": "x", "bold": true}]}),
            "input[0].content[0].bold",
        ),
        (
            json!({"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "x", "v": 1}]}),
            "input[0].output[0].v",
        ),
        (
            json!({"role": "user", "content": [{"type": "input_text", "text": "x", "prompt_cache_breakpoint": {"mode": "explicit", "why": 1}}]}),
            "input[0].content[0]",
        ),
    ];
    for (v, path) in cases {
        let (p, m) = param(read_list(&json!([v.clone()]), "input", Unknown::Refuse).unwrap_err());
        assert_eq!(p, path, "{m}");
        assert!(m.contains("unknown field"), "{m}");
        // the breakpoint's own fields are strict on every wire (its type denies them)
        if !path.ends_with("content[0]") {
            assert!(read_list(&json!([v]), "input", Unknown::Ignore).is_ok(), "{path}");
        }
    }
    // a null is as good as absent
    let v = json!({"role": "user", "content": "x", "phase": null, "extra": null});
    assert!(read(v, "i", Unknown::Refuse).is_ok());
}

#[test]
fn every_problem_names_its_path() {
    let cases = [
        (json!([5]), "input[0]", "must be an object"),
        (json!([{"content": "x"}]), "input[0]", "needs a 'type'"),
        (json!([{"type": 3}]), "input[0].type", "must be a string"),
        (json!([{"type": "bogus"}]), "input[0].type", "unknown variant `bogus`"),
        (
            json!([{"role": "tool", "content": "x"}]),
            "input[0].role",
            "unknown variant `tool`",
        ),
        (json!([{"role": "user"}]), "input[0]", "missing field `content`"),
        (
            json!([{"role": "user", "content": ["x", {"type": "input_video"}]}]),
            "input[0].content[0]",
            "",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text", "text": "x"}, {"type": "input_video"}]}]),
            "input[0].content[1].type",
            "unknown variant `input_video`",
        ),
        (json!([{"type": "item_reference"}]), "input[0].id", "missing field `id`"),
        (
            json!([{"type": "function_call", "call_id": "c", "name": "f"}]),
            "input[0]",
            "`arguments`",
        ),
        (json!(7), "input", "must be a string or a list of items"),
    ];
    for (v, path, msg) in cases {
        let (p, m) = param(read_list(&v, "input", Unknown::Ignore).unwrap_err());
        assert_eq!(p, path, "{v}: {m}");
        assert!(m.contains(msg), "{v}: {m}");
    }
    assert_eq!(
        read_list(&json!("hello"), "input", Unknown::Refuse).unwrap(),
        [InputItem::user("hello".into())]
    );
}
