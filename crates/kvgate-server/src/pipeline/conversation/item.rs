//! The one typed input item: the union of what `/v1/responses`, `/v1/decisions` and
//! `/v1/conversations` accept (messages, function and custom tool calls and their outputs, reasoning,
//! compactions, item references), as serde types both ways — read from the wire by [`read`] and
//! [`read_list`], kept typed by a conversation and listed back in the shape the Responses API lists
//! ([`InputItem::stored`]).
//!
//! [`read`] types one item at a time, so every problem is a 400 whose `param` is the exact path
//! (`input[2].content[0]`) whatever the `role`-or-`type` dispatch. Unknown fields are never kept:
//! [`Unknown::Refuse`] (Decisions: `additionalProperties: false`) refuses them by path,
//! [`Unknown::Ignore`] (Responses, whose clients echo output items with fields of their own) lets
//! them go. Which types and parts a wire takes is checked by the fold ([`super::fold`]).

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::http::body::{at, kind};
use crate::http::error::ApiError;
use crate::ids::item_id;
use crate::pipeline::cache::Breakpoint;

/// One input item (a message may come without `type`: it is told apart by its `role`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[allow(clippy::enum_variant_names)] // OpenAI's item type names
pub(crate) enum InputItem {
    /// A message.
    Message(MessageItem),
    /// A function call the model made earlier.
    FunctionCall(CallItem),
    /// A function's result.
    FunctionCallOutput(OutputItem),
    /// A custom (free-form) tool call the model made earlier.
    CustomToolCall(CustomCallItem),
    /// A custom tool's result.
    CustomToolCallOutput(OutputItem),
    /// Reasoning the model did earlier (kvgate re-reads the conversation instead).
    Reasoning(ReasoningItem),
    /// A compacted window's summary, stored server-side under its `encrypted_content`.
    Compaction(CompactionItem),
    /// Codex's remote compaction: compact the conversation into one `compaction` item.
    CompactionTrigger(Bare),
    /// A reference to an item of the previous response or of the conversation.
    ItemReference(Bare),
}

/// The item types, as the wire names them.
pub(crate) const TYPES: [&str; 9] = [
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "compaction",
    "compaction_trigger",
    "item_reference",
];

/// A message's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// The user.
    User,
    /// The developer (read as a system turn).
    Developer,
    /// The system.
    System,
    /// The assistant, earlier.
    Assistant,
}

/// An assistant message's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Phase {
    /// Intermediate commentary.
    Commentary,
    /// The final answer.
    FinalAnswer,
}

/// An item's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    /// Running.
    InProgress,
    /// Done.
    Completed,
    /// Cut short.
    Incomplete,
}

/// A message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MessageItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Who speaks.
    pub role: Role,
    /// A string or parts.
    pub content: Content,
    /// An assistant message's phase (`commentary` / `final_answer`), not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A function call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CallItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Pairs it with its output.
    pub call_id: String,
    /// The function.
    pub name: String,
    /// Its arguments (JSON text).
    pub arguments: String,
    /// The tool's namespace, not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A custom tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CustomCallItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Pairs it with its output.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// Its free-form input.
    pub input: String,
    /// The tool's namespace, not read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A tool's output (function or custom).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OutputItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The call it answers.
    pub call_id: String,
    /// Text or parts.
    pub output: Content,
    /// Its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// Reasoning, kept as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReasoningItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Summary parts.
    #[serde(default)]
    pub summary: Vec<Value>,
    /// Reasoning text parts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Vec<Value>>,
    /// An opaque carry-over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
    /// Its status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CompactionItem {
    /// Its id, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The stored compaction's reference.
    pub encrypted_content: String,
    /// Who compacted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
}

/// An item of an id at most (a compaction trigger; an item reference, whose id is required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Bare {
    /// The id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// Content: a string or parts (read one by one, so an error names `content[j]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Content {
    /// Text.
    Text(String),
    /// Parts.
    Parts(Vec<Part>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Content, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of content parts")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Content, E> {
                Ok(Content::Text(s.to_string()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Content, E> {
                Ok(Content::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut parts = vec![];
                while let Some(p) = seq.next_element()? {
                    parts.push(p);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

/// A content part of a message or a tool output (which role may carry which is the fold's check).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Part {
    /// Text, possibly closing a reusable prefix.
    InputText {
        /// The text.
        text: String,
        /// Ends a reusable prefix at this message's end.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_cache_breakpoint: Option<Breakpoint>,
    },
    /// An image (refused: kvgate serves text-only models).
    InputImage {
        /// A data URL or an HTTP(S) URL.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image_url: Option<String>,
        /// An uploaded file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_id: Option<String>,
        /// `low`, `high`, `auto` or `original`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// Ends a reusable prefix here.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt_cache_breakpoint: Option<Breakpoint>,
    },
    /// A file (refused).
    InputFile {
        /// An uploaded file.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_id: Option<String>,
        /// Its bytes, inline.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_data: Option<String>,
        /// Where it is.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        file_url: Option<String>,
        /// Its name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        filename: Option<String>,
    },
    /// Audio (refused).
    InputAudio {
        /// The audio.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        input_audio: Option<Value>,
    },
    /// JSON data, rendered as compact JSON text.
    InputJson {
        /// An object or an array of objects.
        data: Value,
    },
    /// Text the assistant wrote.
    OutputText {
        /// The text.
        text: String,
        /// Echoed from a Responses output item.
        #[serde(default)]
        annotations: Vec<Value>,
        /// Echoed from a Responses output item.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        logprobs: Option<Vec<Value>>,
    },
    /// A refusal the assistant wrote.
    Refusal {
        /// Its text.
        refusal: String,
    },
}

impl Part {
    /// The wire name of the part's type.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Part::InputText { .. } => "input_text",
            Part::InputImage { .. } => "input_image",
            Part::InputFile { .. } => "input_file",
            Part::InputAudio { .. } => "input_audio",
            Part::InputJson { .. } => "input_json",
            Part::OutputText { .. } => "output_text",
            Part::Refusal { .. } => "refusal",
        }
    }
}

/// What a reader does with fields the types do not have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// A 400 naming the first one's path.
    Refuse,
    /// Let them go.
    Ignore,
}

/// Reads one item (`v`, at the path `p`).
pub(crate) fn read(v: Value, p: &str, unknown: Unknown) -> Result<InputItem, ApiError> {
    let Value::Object(o) = &v else {
        return Err(ApiError::param(
            p,
            format!("{p}: an item must be an object, got {}", kind(&v)),
        ));
    };
    let ty = match o.get("type") {
        None | Some(Value::Null) if o.contains_key("role") => "message",
        Some(Value::String(t)) => t.as_str(),
        None | Some(Value::Null) => {
            return Err(ApiError::param(
                p,
                format!("{p}: an item needs a 'type' (or a 'role', for a message)"),
            ))
        }
        Some(other) => {
            return Err(ApiError::param(
                &format!("{p}.type"),
                format!("{p}.type must be a string, got {}", kind(other)),
            ))
        }
    };
    let item = match ty {
        "message" => InputItem::Message(at(body(&v), p)?),
        "function_call" => InputItem::FunctionCall(at(body(&v), p)?),
        "function_call_output" => InputItem::FunctionCallOutput(at(body(&v), p)?),
        "custom_tool_call" => InputItem::CustomToolCall(at(body(&v), p)?),
        "custom_tool_call_output" => InputItem::CustomToolCallOutput(at(body(&v), p)?),
        "reasoning" => InputItem::Reasoning(at(body(&v), p)?),
        "compaction" => InputItem::Compaction(at(body(&v), p)?),
        "compaction_trigger" => InputItem::CompactionTrigger(at(body(&v), p)?),
        "item_reference" => {
            let r: Bare = at(body(&v), p)?;
            if r.id.is_none() {
                return Err(ApiError::param(
                    &format!("{p}.id"),
                    format!("{p}.id: missing field `id`"),
                ));
            }
            InputItem::ItemReference(r)
        }
        other => {
            let known = TYPES.map(|t| format!("`{t}`")).join(", ");
            return Err(ApiError::param(
                &format!("{p}.type"),
                format!("{p}.type: unknown variant `{other}`, expected one of {known}"),
            ));
        }
    };
    if unknown == Unknown::Refuse {
        let typed = serde_json::to_value(&item).unwrap_or(Value::Null);
        if let Some(path) = first_unknown(&v, &typed, p) {
            let key = path.rsplit('.').next().unwrap_or(&path).to_string();
            return Err(ApiError::param(&path, format!("{path}: unknown field `{key}`")));
        }
    }
    Ok(item)
}

/// `v` without its `type` (the struct of a variant does not have it).
fn body(v: &Value) -> Value {
    let mut o = v.as_object().cloned().unwrap_or_default();
    o.remove("type");
    Value::Object(o)
}

/// The path of the first field of `sent` (not null) that the typed reading of it (`typed`,
/// serialized back: every field read is written) does not have.
fn first_unknown(sent: &Value, typed: &Value, p: &str) -> Option<String> {
    match (sent, typed) {
        (Value::Object(s), Value::Object(t)) => s.iter().find_map(|(k, v)| match t.get(k) {
            None if !v.is_null() => Some(format!("{p}.{k}")),
            None => None,
            Some(tv) => first_unknown(v, tv, &format!("{p}.{k}")),
        }),
        (Value::Array(s), Value::Array(t)) => s
            .iter()
            .zip(t)
            .enumerate()
            .find_map(|(i, (v, tv))| first_unknown(v, tv, &format!("{p}[{i}]"))),
        _ => None,
    }
}

/// Reads `input` (a string is one user message; else a list of items), the items' paths under
/// `field` (`input[3]`).
pub(crate) fn read_list(input: &Value, field: &str, unknown: Unknown) -> Result<Vec<InputItem>, ApiError> {
    match input {
        Value::String(s) => Ok(vec![InputItem::user(s.clone())]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| read(v.clone(), &format!("{field}[{i}]"), unknown))
            .collect(),
        other => Err(ApiError::param(
            field,
            format!("'{field}' must be a string or a list of items, got {}", kind(other)),
        )),
    }
}

impl InputItem {
    /// A message of `text` by `role`.
    fn message(role: Role, text: String) -> InputItem {
        InputItem::Message(MessageItem {
            id: None,
            role,
            content: Content::Text(text),
            phase: None,
            status: None,
        })
    }

    /// A user message of `text`.
    pub(crate) fn user(text: String) -> InputItem {
        InputItem::message(Role::User, text)
    }

    /// An assistant message of `text`.
    pub(crate) fn assistant(text: String) -> InputItem {
        InputItem::message(Role::Assistant, text)
    }

    /// The wire name of its type.
    pub(crate) fn kind(&self) -> &'static str {
        TYPES[match self {
            InputItem::Message(_) => 0,
            InputItem::FunctionCall(_) => 1,
            InputItem::FunctionCallOutput(_) => 2,
            InputItem::CustomToolCall(_) => 3,
            InputItem::CustomToolCallOutput(_) => 4,
            InputItem::Reasoning(_) => 5,
            InputItem::Compaction(_) => 6,
            InputItem::CompactionTrigger(_) => 7,
            InputItem::ItemReference(_) => 8,
        }]
    }

    /// Its id, when it has one.
    pub(crate) fn id(&self) -> Option<&str> {
        match self {
            InputItem::Message(m) => m.id.as_deref(),
            InputItem::FunctionCall(c) => c.id.as_deref(),
            InputItem::CustomToolCall(c) => c.id.as_deref(),
            InputItem::FunctionCallOutput(o) | InputItem::CustomToolCallOutput(o) => o.id.as_deref(),
            InputItem::Reasoning(r) => r.id.as_deref(),
            InputItem::Compaction(c) => c.id.as_deref(),
            InputItem::CompactionTrigger(b) | InputItem::ItemReference(b) => b.id.as_deref(),
        }
    }

    /// The item as a conversation keeps and lists it: an id (given or made: `msg_…`, `fc_…`), a
    /// message's text as one typed part (`input_text`, or `output_text` for the assistant's), and
    /// `completed` on messages and calls that have no status, so a listed item can be sent back as
    /// input unchanged (the Agents SDK's conversation session does).
    pub(crate) fn stored(mut self) -> InputItem {
        let done = Some(Status::Completed);
        let (id, prefix) = match &mut self {
            InputItem::Message(m) => {
                if let Content::Text(t) = &mut m.content {
                    let text = std::mem::take(t);
                    m.content = Content::Parts(vec![match m.role {
                        Role::Assistant => Part::OutputText {
                            text,
                            annotations: vec![],
                            logprobs: None,
                        },
                        _ => Part::InputText {
                            text,
                            prompt_cache_breakpoint: None,
                        },
                    }]);
                }
                m.status = m.status.or(done);
                (&mut m.id, "msg")
            }
            InputItem::FunctionCall(c) => {
                c.status = c.status.or(done);
                (&mut c.id, "fc")
            }
            InputItem::CustomToolCall(c) => {
                c.status = c.status.or(done);
                (&mut c.id, "ctc")
            }
            InputItem::FunctionCallOutput(o) => {
                o.status = o.status.or(done);
                (&mut o.id, "fco")
            }
            InputItem::CustomToolCallOutput(o) => (&mut o.id, "ctco"),
            InputItem::Reasoning(r) => (&mut r.id, "rs"),
            InputItem::Compaction(c) => (&mut c.id, "cmp"),
            InputItem::CompactionTrigger(b) | InputItem::ItemReference(b) => (&mut b.id, "item"),
        };
        if id.is_none() {
            *id = Some(item_id(prefix));
        }
        self
    }

    /// As JSON, the shape it is listed in.
    pub(crate) fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Object(Map::new()))
    }
}

#[cfg(test)]
#[path = "item_tests.rs"]
mod tests;
