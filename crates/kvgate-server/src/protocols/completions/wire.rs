//! `/v1/completions`' own wire: the request's completion fields (beside the shared sampling fields of
//! `pipeline/openai/request.rs`) and the `text_completion` body with its legacy logprobs.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::pipeline::openai::request::Int;
use crate::pipeline::openai::response::{PromptLogprobMap, StopReason, UsageOut};
use crate::pipeline::openai::surface::EndpointFields;

/// `/v1/completions`' own fields.
#[derive(Debug, Default, Deserialize)]
pub struct CompletionFields {
    pub prompt: Option<Value>,
    pub logprobs: Option<Int>,
    pub echo: Option<bool>,
}

impl EndpointFields for CompletionFields {
    const ADD_SPECIAL_TOKENS: bool = true;
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
