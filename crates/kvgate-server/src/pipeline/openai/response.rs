//! The parts of OpenAI's response bodies every protocol shares, as serde structs: `usage`, vLLM's
//! `stop_reason`, a token's logprobs (chat's and Responses' shape) and prompt logprobs. Each protocol's own bodies live with it (`protocols/chat/wire.rs`,
//! `protocols/completions/wire.rs`). Field order and nulls are OpenAI's (and vLLM's), so clients that
//! compare shapes see what they expect.

use kvgate_engine::{StopMatch, TokenLogprob, Usage};
use kvgate_model::Tokenizer;
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

/// A chunk as JSON text for the SSE stream, serialized exactly as the non-streamed bodies are (f32
/// in its shortest form).
pub fn to_json<T: Serialize>(t: &T) -> String {
    serde_json::to_string(t).unwrap_or_else(|e| serde_json::json!({"error": {"message": e.to_string()}}).to_string())
}

/// A logprobs entry's alternative.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its logprob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// One token's logprobs (chat's `logprobs.content`, Responses' `output_text.logprobs`).
#[derive(Debug, Clone, Serialize, PartialEq)]
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

impl TokenLogprobOut {
    /// `l` with its tokens as text (and their bytes), as chat and Responses write them.
    pub fn of(tok: &Tokenizer, l: &TokenLogprob) -> TokenLogprobOut {
        let text = |id: u32| tok.decode(&[id], false).unwrap_or_default();
        let s = text(l.token);
        TokenLogprobOut {
            bytes: s.as_bytes().to_vec(),
            token: s,
            logprob: l.logprob,
            top_logprobs: l
                .top
                .iter()
                .map(|&(id, lp)| {
                    let s = text(id);
                    TopLogprob {
                        bytes: s.as_bytes().to_vec(),
                        token: s,
                        logprob: lp,
                    }
                })
                .collect(),
        }
    }
}
