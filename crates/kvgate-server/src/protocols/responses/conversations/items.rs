//! Items as a conversation keeps them: each input item checked as `/v1/responses` reads it (a bad
//! one is a 400 naming its index), then written in the shape `/v1/conversations/{id}/items` lists —
//! an `id` (given or made), `type`, a message's content as typed parts (`input_text`, or
//! `output_text` with `annotations` for the assistant's), `status` on messages and calls — so an
//! item listed can be sent back as input unchanged (the Agents SDK's conversation session does).

use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::ids::item_id;

/// The prefix of a made item id, by item type.
fn prefix(kind: &str) -> &'static str {
    match kind {
        "message" => "msg",
        "function_call" => "fc",
        "function_call_output" => "fco",
        "custom_tool_call" => "ctc",
        "custom_tool_call_output" => "ctco",
        "reasoning" => "rs",
        "compaction" => "cmp",
        _ => "item",
    }
}

/// One text part of a message by `role`.
fn part(role: &str, text: Value) -> Value {
    let mut p = Map::new();
    if role == "assistant" {
        p.insert("type".into(), "output_text".into());
        p.insert("text".into(), text);
        p.insert("annotations".into(), Value::Array(vec![]));
    } else {
        p.insert("type".into(), "input_text".into());
        p.insert("text".into(), text);
    }
    Value::Object(p)
}

/// `input` (a string or a list of items, as `/v1/responses` takes it) checked, as stored items.
pub(crate) fn normalized(input: &Value) -> Result<Vec<Value>, ApiError> {
    // the same reading as /v1/responses: a bad item is refused here, not on a later turn
    crate::protocols::responses::parse_items(input)?;
    Ok(stored(input))
}

/// `input`, already read as `/v1/responses` reads it, as stored items.
pub(crate) fn stored(input: &Value) -> Vec<Value> {
    let list = match input {
        Value::String(s) => {
            let mut o = Map::new();
            o.insert("type".into(), "message".into());
            o.insert("role".into(), "user".into());
            o.insert("content".into(), Value::String(s.clone()));
            vec![Value::Object(o)]
        }
        Value::Array(a) => a.clone(),
        _ => vec![],
    };
    list.into_iter().map(normalize).collect()
}

fn normalize(v: Value) -> Value {
    let Value::Object(mut o) = v else { return v };
    if !o.contains_key("type") {
        o.insert("type".into(), "message".into());
    }
    let kind = o.get("type").and_then(Value::as_str).unwrap_or("").to_string();
    if !o.get("id").is_some_and(Value::is_string) {
        o.insert("id".into(), Value::String(item_id(prefix(&kind))));
    }
    if kind == "message" {
        let role = o.get("role").and_then(Value::as_str).unwrap_or("user").to_string();
        if let Some(Value::String(s)) = o.get("content") {
            let text = Value::String(s.clone());
            o.insert("content".into(), Value::Array(vec![part(&role, text)]));
        }
    }
    if matches!(
        kind.as_str(),
        "message" | "function_call" | "function_call_output" | "custom_tool_call"
    ) && !o.contains_key("status")
    {
        o.insert("status".into(), "completed".into());
    }
    Value::Object(o)
}
