//! The `response` object on the wire: its output items, usage, and the echo of the request's
//! settings, complete as the Open Responses schema and openai-python's `Response` require them.

use serde::Serialize;
use serde_json::{Map, Value};

use super::request::{Reasoning, TextOptions};
use crate::pipeline::conversation::item::{self, InputItem, Unknown};
use crate::pipeline::openai::response::TokenLogprobOut;

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: usize,
}

impl ResponseUsage {
    /// `usage` from the engine's accounting.
    pub fn of(u: &kvgate_engine::Usage) -> ResponseUsage {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputDetails {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: u.cache_write_tokens,
            },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputDetails { reasoning_tokens: 0 },
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct InputDetails {
    pub cached_tokens: usize,
    /// Prompt tokens this request computed and kept at a prompt-cache breakpoint (openai-python's
    /// `Response` requires the field).
    pub cache_write_tokens: usize,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct OutputDetails {
    pub reasoning_tokens: usize,
}

/// One output item.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    /// The assistant's text.
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    /// A function call.
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
    /// A custom tool call.
    CustomToolCall {
        id: String,
        call_id: String,
        name: String,
        input: String,
        status: &'static str,
    },
    /// A compacted window's summary, stored server-side (`encrypted_content` names it).
    Compaction {
        id: String,
        encrypted_content: String,
        created_by: &'static str,
    },
    /// What the model thought before answering (models that think).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
}

impl OutputItem {
    /// The item as input (what a conversation keeps of it, what an `item_reference` names).
    pub(crate) fn as_input(&self) -> Option<InputItem> {
        let v = serde_json::to_value(self).ok()?;
        item::read(v, "output", Unknown::Ignore).ok()
    }

    /// The item's id.
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Message { id, .. }
            | OutputItem::FunctionCall { id, .. }
            | OutputItem::CustomToolCall { id, .. }
            | OutputItem::Compaction { id, .. }
            | OutputItem::Reasoning { id, .. } => id,
        }
    }
}

/// A `reasoning_text` part.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

/// An `output_text` part.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    pub logprobs: Vec<TokenLogprobOut>,
}

impl OutputText {
    /// An `output_text` part of `text`.
    pub fn of(text: String) -> OutputText {
        OutputText {
            kind: "output_text",
            text,
            annotations: vec![],
            logprobs: vec![],
        }
    }
}

/// `incomplete_details`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Incomplete {
    pub reason: String,
}

/// `error` of a failed response.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

/// One of the response's `tools`: a tool the model was offered, as it was used (hosted tools kvgate
/// cannot run were not offered and are not listed).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolEcho {
    /// A function tool: `strict` is whether its arguments were held to the schema.
    Function {
        name: String,
        description: Option<String>,
        parameters: Option<Value>,
        strict: bool,
    },
    /// A custom (freeform-input) tool.
    Custom { name: String, description: Option<String> },
}

/// `conversation` of a response: the conversation it was added to.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ConversationRef {
    pub id: String,
}

/// The `response` object: every field the Open Responses schema requires, the sampling settings with
/// the values used (server defaults filled in), `completed_at` once completed.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    pub status: &'static str,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub incomplete_details: Option<Incomplete>,
    pub error: Option<ResponseError>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub max_tool_calls: Option<i64>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub temperature: f64,
    pub top_p: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub top_logprobs: i64,
    pub tool_choice: Value,
    pub tools: Vec<ToolEcho>,
    pub text: TextOptions,
    pub truncation: String,
    pub metadata: Map<String, Value>,
    pub store: bool,
    pub reasoning: Reasoning,
    pub service_tier: String,
    pub background: bool,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    pub conversation: Option<ConversationRef>,
}
