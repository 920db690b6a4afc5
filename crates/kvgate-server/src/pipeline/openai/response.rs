//! The OpenAI response bodies kvgate sends, as serde structs: chat completions and their stream
//! chunks, text completions and theirs, usage, logprobs in both the chat and the legacy shape, tool
//! calls. Field order and nulls are OpenAI's (and vLLM's `stop_reason`), so clients that compare
//! shapes see what they expect.

use kvgate_engine::{StopMatch, Usage};
use serde::Serialize;

/// `usage`; `prompt_tokens_details.cached_tokens` always present.
#[derive(Debug, Clone, Serialize)]
pub struct UsageOut {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Cached prompt tokens (absent in vLLM's running usage).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize)]
pub struct PromptDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
    /// Prompt tokens this request computed and kept at a prompt-cache breakpoint (present when any).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_tokens: Option<usize>,
}

impl UsageOut {
    /// A finished request's usage.
    pub fn of(u: &Usage) -> UsageOut {
        UsageOut {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
            prompt_tokens_details: Some(PromptDetails {
                cached_tokens: u.cached_tokens,
                cache_write_tokens: (u.cache_write_tokens > 0).then_some(u.cache_write_tokens),
            }),
        }
    }

    /// The running usage vLLM puts in every chunk with `continuous_usage_stats`.
    pub fn running(prompt: usize, completion: usize) -> UsageOut {
        UsageOut {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: None,
        }
    }
}

/// vLLM's `stop_reason`: the stop string, the stop token id, or null.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum StopReason {
    /// A stop string.
    Text(String),
    /// A stop token id.
    Token(u32),
}

impl StopReason {
    /// From the engine's match.
    pub fn of(s: &Option<StopMatch>) -> Option<StopReason> {
        match s {
            Some(StopMatch::Text(t)) => Some(StopReason::Text(t.clone())),
            Some(StopMatch::Token(id)) => Some(StopReason::Token(*id)),
            None => None,
        }
    }
}

/// A chat logprobs entry's alternative.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// One token of chat `logprobs.content`.
#[derive(Debug, Clone, Serialize)]
pub struct TokenLogprobOut {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives.
    pub top_logprobs: Vec<TopLogprob>,
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

/// Legacy completions `logprobs`.
#[derive(Debug, Clone, Serialize)]
pub struct LegacyLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their logprobs (null for the first prompt token).
    pub token_logprobs: Vec<Option<f32>>,
    /// Per token: text → logprob of the alternatives, or null.
    pub top_logprobs: Vec<Option<TopMap>>,
    /// Byte offsets into the choice's text.
    pub text_offset: Vec<usize>,
}

/// Legacy `top_logprobs` of one token: a JSON object from token text to logprob, best first (a
/// text two tokens decode to keeps the better one).
#[derive(Debug, Clone, Default)]
pub struct TopMap(pub Vec<(String, f32)>);

impl TopMap {
    /// Adds an entry unless its text is there already.
    pub fn insert(&mut self, text: String, lp: f32) {
        if !self.0.iter().any(|(t, _)| *t == text) {
            self.0.push((text, lp));
        }
    }
}

impl Serialize for TopMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// A completions choice (whole or streamed).
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// Its index (prompt index · n + choice).
    pub index: usize,
    /// Its text (or text delta).
    pub text: String,
    /// Logprobs, when asked.
    pub logprobs: Option<LegacyLogprobs>,
    /// `stop` or `length`.
    pub finish_reason: Option<&'static str>,
    /// vLLM's stop reason.
    pub stop_reason: Option<StopReason>,
    /// vLLM's prompt logprobs, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<Vec<Option<PromptLogprobMap>>>,
}

/// vLLM's logprob of one token at one prompt position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VllmLogprob {
    /// Its log-probability.
    pub logprob: f32,
    /// 1 + the number of tokens more likely.
    pub rank: usize,
    /// Its text.
    pub decoded_token: String,
}

/// One prompt position of vLLM's `prompt_logprobs`: a JSON object from token id to its logprob, the
/// prompt's own token first, then the most likely ones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromptLogprobMap(pub Vec<(u32, VllmLogprob)>);

impl Serialize for PromptLogprobMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(&k.to_string(), v)?;
        }
        m.end()
    }
}

/// `text_completion` (also each streamed chunk).
#[derive(Debug, Clone, Serialize)]
pub struct Completion {
    /// `cmpl-…`.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model name.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// Token accounting (in a stream: the final chunk, or every chunk with `continuous_usage_stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageOut>,
}

/// A chunk as JSON text for the SSE stream, serialized exactly as the non-streamed bodies are (f32
/// in its shortest form).
pub fn to_json<T: Serialize>(t: &T) -> String {
    serde_json::to_string(t).unwrap_or_else(|e| serde_json::json!({"error": {"message": e.to_string()}}).to_string())
}
