//! The conversation room: OpenAI-style wire messages (`role`, string or text-part `content`, `name`,
//! an assistant's `tool_calls`, a tool's `tool_call_id`) read into typed [`Message`]s — every refusal
//! a 400 naming the exact path (`messages[2].content[0]`) —, their size checked before any tokenizing,
//! and rendered through the model's chat template (with tools when offered). Every protocol that takes
//! a conversation (chat, responses, `/v1/systemone` states, `/tokenize`, the render endpoints) reads
//! and renders it here, so the same messages give the same prompt, and the same warm prefix,
//! whichever door they came in by.

use kvgate_model::prompt::{render_conversation, Message, PromptTools, Role};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::params::kind;
use crate::state::AppState;
use crate::tools::{self, ToolSpec};

/// Checks and normalises OpenAI chat messages: content parts of type `text` are joined with newlines
/// (as vLLM does for string-content templates); anything else is refused with its location.
pub(crate) fn normalize_messages(v: Option<&Value>, field: &str) -> Result<Vec<Message>, ApiError> {
    let arr = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::param(field, format!("'{field}' must not be empty"))),
        None => return Err(ApiError::param(field, format!("'{field}' is required"))),
        Some(other) => {
            return Err(ApiError::param(
                field,
                format!("'{field}' must be a list of messages, got {}", kind(other)),
            ))
        }
    };
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let Value::Object(obj) = m else {
            return Err(ApiError::param(
                field,
                format!("{field}[{i}] must be an object, got {}", kind(m)),
            ));
        };
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::param(field, format!("{field}[{i}].role is required and must be a string")))?;
        let Some(r) = Role::parse(role) else {
            let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            return Err(ApiError::param(
                field,
                format!("{field}[{i}].role must be one of {}, got {role:?}", roles.join(", ")),
            ));
        };
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut texts = vec![];
                for (j, p) in parts.iter().enumerate() {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => texts.push(t.to_string()),
                        (Some(t), _) if t != "text" => {
                            return Err(ApiError::param(
                                field,
                                format!(
                                    "{field}[{i}].content[{j}]: content of type {t:?} is not supported (text only)"
                                ),
                            ))
                        }
                        _ => {
                            return Err(ApiError::param(
                                field,
                                format!("{field}[{i}].content[{j}] must be {{\"type\": \"text\", \"text\": ...}}"),
                            ))
                        }
                    }
                }
                texts.join("\n")
            }
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::param(field, format!("{field}[{i}].content is required")))
            }
            Some(other) => {
                return Err(ApiError::param(
                    field,
                    format!(
                        "{field}[{i}].content must be a string or a list of text parts, got {}",
                        kind(other)
                    ),
                ))
            }
        };
        for k in obj.keys() {
            match (k.as_str(), role) {
                ("role" | "content" | "name", _) | ("tool_calls", "assistant") | ("tool_call_id", "tool") => {}
                ("refusal", "assistant") => {}
                ("tool_calls" | "tool_call_id" | "function_call" | "audio" | "refusal", _) => {
                    if !obj[k].is_null() {
                        return Err(ApiError::param(
                            field,
                            format!("{field}[{i}].{k} is not supported by kvgate on a {role} message"),
                        ));
                    }
                }
                (other, _) => {
                    return Err(ApiError::param(
                        field,
                        format!("{field}[{i}] has an unknown field '{other}'"),
                    ))
                }
            }
        }
        let mut n = Message::text(r, content);
        n.name = obj.get("name").and_then(Value::as_str).map(str::to_string);
        if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = tools::normalize_tool_calls(calls, &format!("{field}[{i}].tool_calls"))
                .map_err(|e| ApiError::param(field, e))?;
            n.tool_calls = Some(calls);
        }
        if let Some(id) = obj.get("tool_call_id").filter(|v| !v.is_null()) {
            let id = id
                .as_str()
                .ok_or_else(|| ApiError::param(field, format!("{field}[{i}].tool_call_id must be a string")))?;
            n.tool_call_id = Some(id.to_string());
        }
        out.push(n);
    }
    Ok(out)
}

/// The text bytes of normalised messages (their contents and tool calls): what decides, before any
/// rendering or tokenizing, whether they can fit the context.
pub(crate) fn message_bytes(messages: &[Message]) -> usize {
    messages.iter().map(Message::text_bytes).sum()
}

/// Renders messages with the model's template exactly as `/v1/chat/completions` does (no tools).
pub(crate) fn render(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    render_with_tools(st, messages, add_generation_prompt, continue_final, kwargs, None)
}

/// Renders messages and, when offered, tools ([`kvgate_model::prompt::render_conversation`]).
pub(crate) fn render_with_tools(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&ToolSpec>,
) -> Result<String, ApiError> {
    let tmpl = st
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::bad("this model has no chat template; use /v1/completions"))?;
    let offered = tools.map(|t| t as &dyn PromptTools);
    render_conversation(tmpl, messages, add_generation_prompt, continue_final, kwargs, offered)
        .map_err(|e| ApiError::param("messages", e.to_string()))
}
