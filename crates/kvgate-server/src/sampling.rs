//! The sampling parameters shared by `/v1/completions` and `/v1/chat/completions`, read and validated
//! into the engine's [`SamplingParams`], with the server defaults of `generation_config.json`.

use kvgate_engine::SamplingParams;
use kvgate_model::GenerationDefaults;

use crate::error::ApiError;
use crate::params::Body;

/// Parameters accepted by both endpoints.
pub const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "include_stop_str_in_output",
    "ignore_eos",
    "min_tokens",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "stream",
    "stream_options",
    "user",
    "store",
    "metadata",
    "service_tier",
    "reasoning_effort",
    "cache_salt",
    "skip_special_tokens",
    "echo",
];

/// OpenAI parameters kvgate does not implement: refused by name instead of silently ignored.
pub const UNSUPPORTED: &[&str] = &[
    "best_of",
    "suffix",
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "use_beam_search",
    "prompt_logprobs",
];

/// What the handlers need besides the sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// Engine parameters (`max_tokens` may still be 0 = "not given").
    pub params: SamplingParams,
    /// Whether `max_tokens` was given.
    pub max_tokens_given: bool,
    /// SSE streaming.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `stream_options.continuous_usage_stats` (with `include_usage`, as vLLM): usage in every chunk.
    pub continuous_usage: bool,
    /// `cache_salt`.
    pub cache_salt: Option<String>,
    /// `echo`.
    pub echo: bool,
}

/// Reads the common parameters. `max_tokens_key` is `max_tokens` (or chat's `max_completion_tokens`).
pub fn read(
    b: &Body,
    defaults: &GenerationDefaults,
    vocab: usize,
    max_tokens: Option<i64>,
) -> Result<Common, ApiError> {
    let mut p = SamplingParams {
        temperature: b
            .f32_in("temperature", 0.0, f32::MAX)?
            .or(defaults.temperature)
            .unwrap_or(1.0),
        top_p: b.f32_in("top_p", 0.0, 1.0)?.or(defaults.top_p).unwrap_or(1.0),
        min_p: b.f32_in("min_p", 0.0, 1.0)?.or(defaults.min_p).unwrap_or(0.0),
        presence_penalty: b.f32_in("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: b.f32_in("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        repetition_penalty: b
            .f32_in("repetition_penalty", 0.0, f32::MAX)?
            .or(defaults.repetition_penalty)
            .unwrap_or(1.0),
        ..Default::default()
    };
    if p.top_p == 0.0 {
        return Err(ApiError::param("top_p", "'top_p' must be in (0, 1], got 0"));
    }
    if p.repetition_penalty == 0.0 {
        return Err(ApiError::param(
            "repetition_penalty",
            "'repetition_penalty' must be greater than 0, got 0",
        ));
    }
    let top_k = b.int_in("top_k", -1, i64::MAX)?.or(defaults.top_k).unwrap_or(0);
    p.top_k = if top_k <= 0 { 0 } else { top_k as usize };
    p.seed = b.int_in("seed", i64::MIN, i64::MAX)?.map(|s| s as u64);
    p.n = b.int_in("n", 1, 128)?.unwrap_or(1) as usize;
    let mt = max_tokens;
    p.max_tokens = mt.unwrap_or(0) as usize;
    p.min_tokens = b.int_in("min_tokens", 0, i64::MAX)?.unwrap_or(0) as usize;
    if mt.is_some() && p.min_tokens > p.max_tokens {
        return Err(ApiError::param(
            "min_tokens",
            format!(
                "'min_tokens' ({}) must not exceed 'max_tokens' ({})",
                p.min_tokens, p.max_tokens
            ),
        ));
    }
    p.stop = b.strings("stop", 64)?;
    p.stop_token_ids = b.ids("stop_token_ids")?;
    if let Some(&bad) = p.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::param(
            "stop_token_ids",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    p.include_stop_str_in_output = b.bool("include_stop_str_in_output")?.unwrap_or(false);
    p.ignore_eos = b.bool("ignore_eos")?.unwrap_or(false);
    p.skip_special_tokens = b.bool("skip_special_tokens")?.unwrap_or(true);
    if let Some(bias) = b.object("logit_bias")? {
        if bias.len() > 300 {
            return Err(ApiError::param(
                "logit_bias",
                format!("'logit_bias' may hold at most 300 entries, got {}", bias.len()),
            ));
        }
        for (k, v) in bias {
            let id: u32 = k.parse().ok().filter(|&i: &u32| (i as usize) < vocab).ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' key {k:?} is not a token id below {vocab}"),
                )
            })?;
            let x = v.as_f64().filter(|x| (-100.0..=100.0).contains(x)).ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' values must be numbers between -100 and 100, got {v}"),
                )
            })?;
            p.logit_bias.push((id, x as f32));
        }
    }
    let stream = b.bool("stream")?.unwrap_or(false);
    let mut include_usage = false;
    let mut continuous = false;
    if let Some(so) = b.object("stream_options")? {
        if !stream {
            return Err(ApiError::param(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ));
        }
        for (k, v) in so {
            match (k.as_str(), v) {
                ("include_usage", serde_json::Value::Bool(x)) => include_usage = *x,
                ("continuous_usage_stats", serde_json::Value::Bool(x)) => continuous = *x,
                ("include_usage" | "continuous_usage_stats", _) => {
                    return Err(ApiError::param(
                        "stream_options",
                        format!("'stream_options.{k}' must be a boolean"),
                    ))
                }
                _ => {
                    return Err(ApiError::param(
                        "stream_options",
                        format!("unsupported stream option '{k}'"),
                    ))
                }
            }
        }
    }
    let _ = b.str("user")?;
    harmless(b)?;
    let cache_salt = b.str("cache_salt")?.map(str::to_string);
    if cache_salt.as_deref() == Some("") {
        return Err(ApiError::param("cache_salt", "'cache_salt' must not be empty"));
    }
    Ok(Common {
        params: p,
        max_tokens_given: mt.is_some(),
        stream,
        include_usage,
        continuous_usage: include_usage && continuous,
        cache_salt,
        echo: b.bool("echo")?.unwrap_or(false),
    })
}

/// OpenAI fields accepted with the meaning they have for a server that stores nothing and has one
/// service tier and no reasoning mode (as vLLM): checked for their type and OpenAI's limits, then
/// ignored. `store`: nothing is stored; `metadata`: for stored completions only; `service_tier`:
/// kvgate has one; `reasoning_effort`: the served model does not reason.
fn harmless(b: &Body) -> Result<(), ApiError> {
    let _ = b.bool("store")?;
    if let Some(m) = b.object("metadata")? {
        if m.len() > 16 {
            return Err(ApiError::param(
                "metadata",
                format!("'metadata' may hold at most 16 keys, got {}", m.len()),
            ));
        }
        for (k, v) in m {
            let ok = k.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512);
            if !ok {
                return Err(ApiError::param(
                    "metadata",
                    format!(
                        "'metadata' keys must be at most 64 characters and values strings of at most 512; {k:?} is not"
                    ),
                ));
            }
        }
    }
    for (k, allowed) in [
        ("service_tier", &["auto", "default", "flex", "scale", "priority"][..]),
        (
            "reasoning_effort",
            &["none", "minimal", "low", "medium", "high", "xhigh"][..],
        ),
    ] {
        if let Some(v) = b.str(k)? {
            if !allowed.contains(&v) {
                return Err(ApiError::param(
                    k,
                    format!("'{k}' must be one of {}, got {v:?}", allowed.join(", ")),
                ));
            }
        }
    }
    Ok(())
}
