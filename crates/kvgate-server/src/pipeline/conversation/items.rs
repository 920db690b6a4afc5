//! Responses-style input items as conversation turns, shared by every protocol that takes them
//! (`/v1/responses`, `/v1/decisions`): a function or custom tool call folds into the assistant turn it
//! belongs to, its output becomes a `tool` turn naming the call, and a custom tool call reads as a
//! function of one string `input`. The same items give the same messages, so the same rendered prefix,
//! whichever door they came in by.

use kvgate_model::prompt::{FunctionCall, Message, Role, ToolCall, ToolCallKind};
use serde_json::{json, Value};

/// A plain turn.
pub(crate) fn turn(role: Role, content: String) -> Message {
    Message {
        role,
        content,
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }
}

/// A tool's output, answering the call `call_id`.
pub(crate) fn tool_output(call_id: &str, content: String) -> Message {
    let mut m = turn(Role::Tool, content);
    m.tool_call_id = Some(call_id.to_string());
    m
}

/// Appends a call to the assistant turn it belongs to (the last message when it is the assistant's and
/// no tool answered since), or opens one.
pub(crate) fn push_call(msgs: &mut Vec<Message>, call: ToolCall) {
    match msgs.last_mut() {
        Some(m) if m.role == Role::Assistant => m.tool_calls.get_or_insert_with(Vec::new).push(call),
        _ => {
            let mut m = turn(Role::Assistant, String::new());
            m.tool_calls = Some(vec![call]);
            msgs.push(m);
        }
    }
}

fn call(call_id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall {
        id: Value::String(call_id.to_string()),
        kind: ToolCallKind::Function,
        function: FunctionCall {
            name: name.to_string(),
            arguments,
        },
    }
}

/// A function call as templates read it (its arguments parsed when they are JSON).
pub(crate) fn function_call(call_id: &str, name: &str, arguments: &str) -> ToolCall {
    let args = serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()));
    call(call_id, name, args)
}

/// A custom tool call as templates read it: a function of one string `input`.
pub(crate) fn custom_call(call_id: &str, name: &str, input: &str) -> ToolCall {
    call(call_id, name, json!({ "input": input }))
}
