//! The Responses API on the wire (`POST /v1/responses`, as OpenAI and vLLM define it): the request
//! body and its input items as serde types, the `response` object and its output items, and the typed
//! stream events. Only the shapes live here; what they mean is in [`super::input`] and
//! [`super::shape`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::openai::request::{Int, Refused};

/// The request body.
#[derive(Debug, Default, Deserialize)]
pub struct ResponsesBody {
    pub model: Option<String>,
    /// A string (one user message) or a list of items.
    pub input: Option<Value>,
    pub instructions: Option<String>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub text: Option<TextOptions>,
    pub max_output_tokens: Option<Int>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_logprobs: Option<Int>,
    pub store: Option<bool>,
    pub metadata: Option<Map<String, Value>>,
    pub prompt_cache_key: Option<String>,
    /// Extra outputs asked for (`reasoning.encrypted_content`, `message.output_text.logprobs`, …):
    /// accepted; kvgate has no encrypted reasoning to give.
    #[allow(dead_code)]
    pub include: Option<Vec<String>>,
    /// `{effort, summary}`: accepted (the served model thinks or does not).
    pub reasoning: Option<Value>,
    /// `"disabled"` (default) or `"auto"`.
    pub truncation: Option<String>,
    #[allow(dead_code)]
    pub user: Option<String>,
    #[allow(dead_code)]
    pub safety_identifier: Option<String>,
    pub service_tier: Option<String>,
    pub stream: Option<bool>,
    /// `{include_obfuscation}`: accepted (kvgate pads nothing).
    #[allow(dead_code)]
    pub stream_options: Option<Value>,
    pub previous_response_id: Option<String>,
    /// Codex's per-request metadata: accepted.
    #[allow(dead_code)]
    pub client_metadata: Option<Value>,
    pub max_tool_calls: Option<Int>,
    pub background: Option<bool>,
    /// vLLM's prefix-cache salt.
    pub cache_salt: Option<String>,
    pub conversation: Refused,
    pub prompt: Refused,
}

/// `text`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct TextOptions {
    /// The output's format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<TextFormat>,
    /// `low` / `medium` / `high`: accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
}

/// `text.format`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    /// Plain text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// A JSON Schema (flat, unlike chat's `response_format`).
    JsonSchema {
        /// Its name.
        #[serde(default)]
        name: Option<String>,
        /// What it is for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        description: Option<String>,
        /// The schema.
        schema: Value,
        /// Strict mode.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        strict: Option<bool>,
    },
}

/// One input item (a message without `type` is read as a message).
#[derive(Debug, Clone, Deserialize)]
#[allow(clippy::enum_variant_names)] // OpenAI's item type names
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Item {
    /// A message.
    Message {
        /// `user`, `assistant`, `system` or `developer`.
        role: String,
        /// Text or parts.
        content: Content,
    },
    /// A function call the model made earlier.
    FunctionCall {
        /// Its call id.
        call_id: String,
        /// The function.
        name: String,
        /// Its arguments (a JSON string).
        arguments: String,
    },
    /// A function's result.
    FunctionCallOutput {
        /// The call it answers.
        call_id: String,
        /// Its output.
        output: Content,
    },
    /// A custom (freeform) tool call the model made earlier.
    CustomToolCall {
        /// Its call id.
        call_id: String,
        /// The tool.
        name: String,
        /// Its input.
        input: String,
    },
    /// A custom tool's result.
    CustomToolCallOutput {
        /// The call it answers.
        call_id: String,
        /// Its output.
        output: Content,
    },
    /// Reasoning the model did earlier: accepted and dropped (kvgate re-reads the conversation).
    Reasoning {},
    /// A reference to a stored item: refused.
    ItemReference {
        /// The item.
        #[allow(dead_code)]
        id: String,
    },
}

/// Message content: a string or a list of parts.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts.
    Parts(Vec<Part>),
}

/// A content part.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// User (or system) text.
    InputText {
        /// The text.
        text: String,
    },
    /// Text the model wrote earlier.
    OutputText {
        /// The text.
        text: String,
    },
    /// A refusal the model wrote earlier.
    Refusal {
        /// The text.
        refusal: String,
    },
    /// An image: refused (the served models read text).
    InputImage {},
    /// A file: refused.
    InputFile {},
    /// Audio: refused.
    InputAudio {},
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ResponseUsage {
    pub input_tokens: usize,
    pub input_tokens_details: InputDetails,
    pub output_tokens: usize,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: usize,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct InputDetails {
    pub cached_tokens: usize,
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
    /// What the model thought before answering (models that think).
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
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
    pub logprobs: Vec<Value>,
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

/// The `response` object.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub status: &'static str,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub incomplete_details: Option<Incomplete>,
    pub error: Option<ResponseError>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<i64>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub text: TextOptions,
    pub truncation: String,
    pub metadata: Map<String, Value>,
    pub store: bool,
    pub reasoning: Value,
    pub service_tier: String,
    pub background: bool,
    pub user: Option<String>,
}

/// A stream event: its type, its sequence number, and the fields of that type.
#[derive(Debug, Clone, Serialize)]
pub struct StreamEvent {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub sequence_number: usize,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}
