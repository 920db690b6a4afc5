//! `/v1/chat/completions`' own wire: the request's chat fields (beside the shared sampling fields of
//! `pipeline/openai/request.rs`) and the bodies it answers with — the `chat.completion` object and its
//! stream chunks, chat logprobs, tool calls. Field order and nulls are OpenAI's (and vLLM's
//! `stop_reason`, `reasoning_content`), so clients that compare shapes see what they expect.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::pipeline::openai::request::Int;
use crate::pipeline::openai::response::{PromptLogprobMap, StopReason, TokenLogprobOut, UsageOut};
use crate::pipeline::openai::surface::EndpointFields;
use crate::pipeline::tools::Tool;

/// `/v1/chat/completions`' own fields.
#[derive(Debug, Default, Deserialize)]
pub struct ChatFields {
    pub messages: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<Int>,
    pub max_completion_tokens: Option<Int>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// vLLM's: whether the reasoning is returned (default true).
    pub include_reasoning: Option<bool>,
    /// SGLang's: whether the reasoning is split from the answer (default true).
    pub separate_reasoning: Option<bool>,
    /// SGLang's: reasoning streamed as it comes (only `true`, the default, is supported).
    pub stream_reasoning: Option<bool>,
    /// vLLM's chat `echo` (prepend the final message): only `false`.
    pub echo: Option<bool>,
}

impl EndpointFields for ChatFields {
    const ADD_SPECIAL_TOKENS: bool = false;
}

/// Chat `logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// Per output token.
    pub content: Vec<TokenLogprobOut>,
}

/// A tool call (in a message, or as a stream delta with its `index`).
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    /// Its position among the choice's calls (stream deltas only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_…`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// `tool_calls[i].function`.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCallOut {
    /// The function.
    pub name: String,
    /// Its arguments, a JSON string.
    pub arguments: String,
}

/// The assistant message of a chat choice.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// Its text (null when it only calls tools).
    pub content: Option<String>,
    /// What the model thought before answering (vLLM's and DeepSeek's name), when it thinks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same (OpenRouter's and newer vLLM's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Its tool calls (present when tools were offered).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A chat choice.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Its index.
    pub index: usize,
    /// The message.
    pub message: AssistantMessage,
    /// Logprobs, when asked.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: Option<&'static str>,
    /// vLLM's stop reason.
    pub stop_reason: Option<StopReason>,
}

/// `chat.completion`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token accounting.
    pub usage: UsageOut,
    /// vLLM's prompt logprobs, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<PromptLogprobMap>>>,
}

/// A streamed chat delta.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `assistant` in a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// A text delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// A reasoning delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The same, under its other name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// Tool calls that completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A choice in a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// The choice's index.
    pub index: usize,
    /// What is new.
    pub delta: Delta,
    /// Logprobs of the token(s) in this chunk.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in a choice's last chunk.
    pub finish_reason: Option<&'static str>,
    /// vLLM's stop reason.
    pub stop_reason: Option<StopReason>,
}

/// `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    /// The completion's id.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// One choice, or none in the final usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// The final usage, or the running usage with `continuous_usage_stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}
