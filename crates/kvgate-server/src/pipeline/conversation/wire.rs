//! Conversation messages as the wire sends them (OpenAI chat's shape: `role`, string or text-part
//! `content`, `name`, an assistant's `tool_calls`, a tool's `tool_call_id`) as serde types, and the thin
//! validation pass that turns them into typed [`Message`]s. Fields that may hold the wrong kind of
//! value are read as [`Loose`], so a mistake is never a generic serde error: each refusal names its
//! exact path (`messages[2].content[0]`) and what was expected. Text parts are joined with newlines,
//! as vLLM does for string-content templates.

use kvgate_model::prompt::{Message, Role};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::http::body::kind;
use crate::http::error::ApiError;
use crate::pipeline::cache::{Breakpoint, Marked, Ttl};
use crate::pipeline::tools;

/// A value of the expected type, or whatever was sent instead (kept for the error).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Loose<T> {
    /// The expected type.
    Is(T),
    /// Something else.
    Not(Value),
}

impl<T> Default for Loose<T> {
    fn default() -> Self {
        Loose::Not(Value::Null)
    }
}

/// A message as sent: what kvgate reads typed, everything else in `extra` (refused by name).
#[derive(Debug, Deserialize)]
pub(crate) struct WireMessage {
    #[serde(default)]
    role: Loose<Role>,
    #[serde(default)]
    content: Option<Loose<Content>>,
    #[serde(default)]
    name: Option<Loose<String>>,
    /// Checked by [`tools::normalize_tool_calls`], which names the path inside them.
    #[serde(default)]
    tool_calls: Option<Value>,
    #[serde(default)]
    tool_call_id: Option<Loose<String>>,
    #[serde(flatten)]
    extra: Map<String, Value>,
}

/// `content`: a string or a list of parts.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Plain text.
    Text(String),
    /// Parts, text only.
    Parts(Vec<Loose<Part>>),
}

/// A content part kvgate reads.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Part {
    /// `{"type": "text", "text": …}`.
    Text {
        /// The text.
        text: String,
        /// Closes a reusable prefix at this message's end ([`crate::pipeline::cache`]).
        #[serde(default)]
        prompt_cache_breakpoint: Option<Breakpoint>,
    },
}

/// Reads `v` (the field `field`) as a non-empty list of messages.
pub(crate) fn read(v: Option<&Value>, field: &str) -> Result<Vec<Message>, ApiError> {
    read_marked(v, field).map(|(m, _)| m)
}

/// [`read`], and the messages whose parts carry a prompt-cache breakpoint (index, its own ttl).
pub(crate) fn read_marked(v: Option<&Value>, field: &str) -> Result<Marked, ApiError> {
    let bad = |msg: String| ApiError::param(field, msg);
    let arr = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(bad(format!("'{field}' must not be empty"))),
        None => return Err(bad(format!("'{field}' is required"))),
        Some(other) => {
            return Err(bad(format!(
                "'{field}' must be a list of messages, got {}",
                kind(other)
            )))
        }
    };
    let mut out = Vec::with_capacity(arr.len());
    let mut marks = vec![];
    for (i, m) in arr.iter().enumerate() {
        let at = format!("{field}[{i}]");
        if !m.is_object() {
            return Err(bad(format!("{at} must be an object, got {}", kind(m))));
        }
        let w = WireMessage::deserialize(m).map_err(|e| bad(format!("{at}: {e}")))?;
        let (msg, mark) = message(w, &at).map_err(bad)?;
        if let Some(ttl) = mark {
            marks.push((i, ttl));
        }
        out.push(msg);
    }
    Ok((out, marks))
}

/// One message, checked: every error names its path under `at`; with the breakpoint a part carries
/// (its own ttl), if any.
fn message(w: WireMessage, at: &str) -> Result<(Message, Option<Option<Ttl>>), String> {
    let mut mark = None;
    let role = match w.role {
        Loose::Is(r) => r,
        Loose::Not(Value::String(s)) => {
            let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            return Err(format!("{at}.role must be one of {}, got {s:?}", roles.join(", ")));
        }
        Loose::Not(_) => return Err(format!("{at}.role is required and must be a string")),
    };
    let content = match w.content {
        Some(Loose::Is(Content::Text(s))) => s,
        Some(Loose::Is(Content::Parts(parts))) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.into_iter().enumerate() {
                match p {
                    Loose::Is(Part::Text {
                        text,
                        prompt_cache_breakpoint,
                    }) => {
                        texts.push(text);
                        if let Some(b) = prompt_cache_breakpoint {
                            mark = Some(b.ttl);
                        }
                    }
                    Loose::Not(v) => match v.get("type").and_then(Value::as_str) {
                        Some(t) if t != "text" => {
                            return Err(format!(
                                "{at}.content[{j}]: content of type {t:?} is not supported (text only)"
                            ))
                        }
                        _ => {
                            return Err(format!(
                                "{at}.content[{j}] must be {{\"type\": \"text\", \"text\": ...}}"
                            ))
                        }
                    },
                }
            }
            texts.join("\n")
        }
        None if role == Role::Assistant => String::new(),
        None => return Err(format!("{at}.content is required")),
        Some(Loose::Not(other)) => {
            return Err(format!(
                "{at}.content must be a string or a list of text parts, got {}",
                kind(&other)
            ))
        }
    };
    let name = role.as_str();
    let given = |v: &Option<Value>| v.as_ref().is_some_and(|v| !v.is_null());
    let tool_calls = w.tool_calls.filter(|v| !v.is_null());
    if tool_calls.is_some() && role != Role::Assistant {
        return Err(format!(
            "{at}.tool_calls is not supported by kvgate on a {name} message"
        ));
    }
    let tool_call_id = match w.tool_call_id {
        None | Some(Loose::Not(Value::Null)) => None,
        Some(_) if role != Role::Tool => {
            return Err(format!(
                "{at}.tool_call_id is not supported by kvgate on a {name} message"
            ))
        }
        Some(Loose::Is(id)) => Some(id),
        Some(Loose::Not(_)) => return Err(format!("{at}.tool_call_id must be a string")),
    };
    for (k, v) in &w.extra {
        match k.as_str() {
            "refusal" if role == Role::Assistant => {}
            "function_call" | "audio" | "refusal" if given(&Some(v.clone())) => {
                return Err(format!("{at}.{k} is not supported by kvgate on a {name} message"))
            }
            "function_call" | "audio" | "refusal" => {}
            other => return Err(format!("{at} has an unknown field '{other}'")),
        }
    }
    let mut m = Message::text(role, content);
    m.name = match w.name {
        Some(Loose::Is(n)) => Some(n),
        _ => None,
    };
    if let Some(calls) = tool_calls {
        m.tool_calls = Some(tools::normalize_tool_calls(&calls, &format!("{at}.tool_calls"))?);
    }
    m.tool_call_id = tool_call_id;
    Ok((m, mark))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        read(Some(&v), "messages").unwrap_err().to_string()
    }

    /// Every refusal names its exact path; accepted messages keep their role, joined text parts, name,
    /// tool calls and tool call id.
    #[test]
    fn messages_are_typed_and_every_refusal_names_its_path() {
        let ok = read(
            Some(&json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"x\": 1}"}}], "refusal": null},
                {"role": "tool", "content": "42", "tool_call_id": "c1"}
            ])),
            "messages",
        )
        .unwrap();
        assert_eq!(ok.len(), 4);
        assert_eq!(
            (ok[1].role, ok[1].content.as_str(), ok[1].name.as_deref()),
            (Role::User, "a\nb", Some("u"))
        );
        assert_eq!(ok[2].content, "");
        assert_eq!(ok[2].tool_calls.as_ref().map(Vec::len), Some(1));
        assert_eq!(ok[3].tool_call_id.as_deref(), Some("c1"));
        let cases = [
            (json!("hi"), "'messages' must be a list of messages, got a string"),
            (json!([]), "'messages' must not be empty"),
            (json!([3]), "messages[0] must be an object, got a number"),
            (
                json!([{"role": "wizard", "content": "x"}]),
                "messages[0].role must be one of system, user, assistant, tool, developer, got \"wizard\"",
            ),
            (
                json!([{"content": "x"}]),
                "messages[0].role is required and must be a string",
            ),
            (json!([{"role": "user"}]), "messages[0].content is required"),
            (
                json!([{"role": "user", "content": 5}]),
                "messages[0].content must be a string or a list of text parts, got a number",
            ),
            (
                json!([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
                "messages[0].content[0]: content of type \"image_url\" is not supported (text only)",
            ),
            (
                json!([{"role": "user", "content": [{"text": "x"}]}]),
                "messages[0].content[0] must be {\"type\": \"text\", \"text\": ...}",
            ),
            (
                json!([{"role": "user", "content": "x"}, {"role": "user", "content": "x", "tool_call_id": "c"}]),
                "messages[1].tool_call_id is not supported by kvgate on a user message",
            ),
            (
                json!([{"role": "tool", "content": "x", "tool_call_id": 7}]),
                "messages[0].tool_call_id must be a string",
            ),
            (
                json!([{"role": "user", "content": "x", "tool_calls": []}]),
                "messages[0].tool_calls is not supported by kvgate on a user message",
            ),
            (
                json!([{"role": "user", "content": "x", "audio": {"id": "a"}}]),
                "messages[0].audio is not supported by kvgate on a user message",
            ),
            (
                json!([{"role": "user", "content": "x", "mood": 1}]),
                "messages[0] has an unknown field 'mood'",
            ),
            (
                json!([{"role": "assistant", "content": "x", "tool_calls": 3}]),
                "messages[0].tool_calls must be a list",
            ),
        ];
        for (v, want) in cases {
            assert_eq!(err(v.clone()), want, "{v}");
        }
    }
}
