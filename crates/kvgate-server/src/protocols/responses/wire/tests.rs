//! Tests of `wire/`: the stream events' byte order.
use super::*;
use serde_json::Value;

/// Every event serializes as `{"type", "sequence_number", ...its fields in the spec's order}`, and
/// `kind` names the type it serializes with.
#[test]
fn stream_events_serialize_in_the_wire_order() {
    let mut delta = StreamEvent::TextDelta(TextDelta {
        sequence_number: 0,
        item_id: "msg_1".into(),
        output_index: 0,
        content_index: 0,
        delta: "Hi".into(),
        logprobs: Some(vec![]),
    });
    delta.set_sequence(7);
    assert_eq!(
        serde_json::to_string(&delta).unwrap(),
        r#"{"type":"response.output_text.delta","sequence_number":7,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hi","logprobs":[]}"#
    );
    let reasoning = StreamEvent::ReasoningDelta(TextDelta {
        sequence_number: 1,
        item_id: "rs_1".into(),
        output_index: 0,
        content_index: 0,
        delta: "hm".into(),
        logprobs: None,
    });
    assert_eq!(
        serde_json::to_string(&reasoning).unwrap(),
        r#"{"type":"response.reasoning_text.delta","sequence_number":1,"item_id":"rs_1","output_index":0,"content_index":0,"delta":"hm"}"#
    );
    let added = StreamEvent::ItemAdded(WithItem {
        sequence_number: 2,
        output_index: 1,
        item: OutputItem::FunctionCall {
            id: "fc_1".into(),
            call_id: "call_1".into(),
            name: "f".into(),
            arguments: String::new(),
            status: "in_progress",
        },
    });
    assert_eq!(
        serde_json::to_string(&added).unwrap(),
        r#"{"type":"response.output_item.added","sequence_number":2,"output_index":1,"item":{"type":"function_call","id":"fc_1","call_id":"call_1","name":"f","arguments":"","status":"in_progress"}}"#
    );
    let done = StreamEvent::InputDone(InputDone {
        sequence_number: 3,
        item_id: "fc_2".into(),
        output_index: 2,
        name: "shell".into(),
        input: "ls".into(),
    });
    assert_eq!(
        serde_json::to_string(&done).unwrap(),
        r#"{"type":"response.custom_tool_call_input.done","sequence_number":3,"item_id":"fc_2","output_index":2,"name":"shell","input":"ls"}"#
    );
    for e in [&delta, &reasoning, &added, &done] {
        let v: Value = serde_json::to_value(e).unwrap();
        assert_eq!(v["type"], e.kind());
    }
}
