//! The Responses request on the wire: the body, its tools, tool choice, text options and input items
//! as serde types.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline::openai::request::{Int, Refused};

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
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub top_logprobs: Option<Int>,
    pub store: Option<bool>,
    pub metadata: Option<Map<String, Value>>,
    pub prompt_cache_key: Option<String>,
    /// Prompt caching: `implicit` / `explicit` and the breakpoints' lifetime.
    pub prompt_cache_options: Option<crate::pipeline::cache::CacheOptions>,
    /// Deprecated by OpenAI; accepted.
    #[allow(dead_code)]
    pub prompt_cache_retention: Option<crate::pipeline::cache::Retention>,
    /// Extra outputs asked for (`reasoning.encrypted_content`, `message.output_text.logprobs`, …):
    /// accepted; kvgate has no encrypted reasoning to give.
    #[allow(dead_code)]
    pub include: Option<Vec<String>>,
    /// `{effort, summary}`: accepted (the served model thinks or does not).
    pub reasoning: Option<Reasoning>,
    /// `"disabled"` (default) or `"auto"`.
    pub truncation: Option<String>,
    #[allow(dead_code)]
    pub user: Option<String>,
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
    /// The conversation this response belongs to (`"conv_…"` or `{"id": "conv_…"}`).
    pub conversation: Option<ConversationParam>,
    pub prompt: Refused,
}

/// `conversation`: an id, or an object naming one.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ConversationParam {
    /// `"conv_…"`.
    Id(String),
    /// `{"id": "conv_…"}`.
    Object {
        /// The conversation's id.
        id: String,
    },
}

impl ConversationParam {
    /// The conversation's id.
    pub fn id(&self) -> &str {
        match self {
            ConversationParam::Id(id) | ConversationParam::Object { id } => id,
        }
    }
}

/// One of `tools` (flat, unlike chat's: the function's fields beside `type`). Hosted tools kvgate
/// cannot run are told apart by their `type` before this is read.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponsesTool {
    /// A function tool.
    Function {
        name: Option<String>,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        parameters: Option<Value>,
        #[serde(default)]
        strict: Option<bool>,
    },
    /// A custom (freeform-input) tool.
    Custom {
        name: Option<String>,
        #[serde(default)]
        description: Option<String>,
    },
}

/// `tool_choice`: a mode, or a typed choice (`{"type": "function", "name": …}`, a custom tool's, or
/// a hosted tool's).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponsesToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// A typed choice.
    Typed {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        name: Option<String>,
    },
}

/// `reasoning`, asked for and echoed (both fields always present, `null` when not given).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Reasoning {
    #[serde(default)]
    pub effort: Option<String>,
    #[serde(default)]
    pub summary: Option<String>,
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
        #[serde(default)]
        description: Option<String>,
        /// The schema.
        schema: Value,
        /// Strict mode (echoed with the value used: `false` when not given).
        #[serde(default)]
        strict: Option<bool>,
    },
}
