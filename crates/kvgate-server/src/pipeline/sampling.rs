//! The sampling parameters shared by `/v1/completions` and `/v1/chat/completions`: the typed
//! [`SamplingFields`] validated (ranges, combinations, the limit and the value named) into the
//! engine's [`SamplingParams`], with the server defaults of `generation_config.json`.

use kvgate_engine::SamplingParams;
use kvgate_model::GenerationDefaults;

use crate::http::error::ApiError;
use crate::pipeline::openai::request::{Int, OneOrMany, SamplingFields};

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
    /// vLLM's `prompt_logprobs`: alternatives per prompt token (`params.prompt_logprobs` is set too).
    pub prompt_logprobs: Option<usize>,
}

/// `name` as an f32 within `[lo, hi]` (NaN never is). A positive value too small for an f32 stays
/// positive (the smallest normal f32), so `top_p: 5e-324` means "the top token", not 0.
fn in_range(name: &str, v: Option<f64>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x > 0.0 && x < f32::MIN_POSITIVE as f64 && lo as f64 <= x => Ok(Some(f32::MIN_POSITIVE)),
        Some(x) if x >= lo as f64 && x <= hi as f64 => Ok(Some(x as f32)),
        Some(x) => Err(ApiError::param(
            name,
            format!("'{name}' must be between {lo} and {hi}, got {x}"),
        )),
    }
}

/// `name` as an integer within `[lo, hi]`.
pub fn int_in(name: &str, v: Option<Int>, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
    match v {
        None => Ok(None),
        Some(Int(x)) if x >= lo && x <= hi => Ok(Some(x)),
        Some(Int(x)) => {
            let range = if hi == i64::MAX {
                format!("at least {lo}")
            } else {
                format!("between {lo} and {hi}")
            };
            Err(ApiError::param(name, format!("'{name}' must be {range}, got {x}")))
        }
    }
}

/// The validation pass over the sampling fields: ranges, combinations, the server defaults of
/// `generation_config.json`. `max_tokens` is the endpoint's (chat's `max_completion_tokens` wins).
pub fn read(
    b: &SamplingFields,
    defaults: &GenerationDefaults,
    vocab: usize,
    max_tokens: Option<i64>,
) -> Result<Common, ApiError> {
    b.refuse_unsupported()?;
    let mut p = SamplingParams {
        temperature: in_range("temperature", b.temperature, 0.0, f32::MAX)?
            .or(defaults.temperature)
            .unwrap_or(1.0),
        top_p: in_range("top_p", b.top_p, 0.0, 1.0)?.or(defaults.top_p).unwrap_or(1.0),
        min_p: in_range("min_p", b.min_p, 0.0, 1.0)?.or(defaults.min_p).unwrap_or(0.0),
        presence_penalty: in_range("presence_penalty", b.presence_penalty, -2.0, 2.0)?.unwrap_or(0.0),
        frequency_penalty: in_range("frequency_penalty", b.frequency_penalty, -2.0, 2.0)?.unwrap_or(0.0),
        repetition_penalty: in_range("repetition_penalty", b.repetition_penalty, 0.0, f32::MAX)?
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
    let top_k = int_in("top_k", b.top_k, -1, i64::MAX)?.or(defaults.top_k).unwrap_or(0);
    p.top_k = if top_k <= 0 { 0 } else { top_k as usize };
    p.seed = b.seed.map(|Int(s)| s as u64);
    p.n = int_in("n", b.n, 1, 128)?.unwrap_or(1) as usize;
    let mt = max_tokens;
    p.max_tokens = mt.unwrap_or(0) as usize;
    p.min_tokens = int_in("min_tokens", b.min_tokens, 0, i64::MAX)?.unwrap_or(0) as usize;
    if mt.is_some() && p.min_tokens > p.max_tokens {
        return Err(ApiError::param(
            "min_tokens",
            format!(
                "'min_tokens' ({}) must not exceed 'max_tokens' ({})",
                p.min_tokens, p.max_tokens
            ),
        ));
    }
    p.stop = b.stop.clone().map(OneOrMany::into_vec).unwrap_or_default();
    if p.stop.len() > 64 {
        return Err(ApiError::param(
            "stop",
            format!("'stop' may hold at most 64 items, got {}", p.stop.len()),
        ));
    }
    if let Some(ids) = &b.allowed_token_ids {
        if ids.is_empty() {
            return Err(ApiError::param(
                "allowed_token_ids",
                "'allowed_token_ids' must not be empty",
            ));
        }
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(ApiError::param(
                "allowed_token_ids",
                format!("'allowed_token_ids' holds {bad}, which is not a token id below {vocab}"),
            ));
        }
        p.allowed_token_ids = Some(ids.clone());
    }
    p.stop_token_ids = b.stop_token_ids.clone().unwrap_or_default();
    if let Some(&bad) = p.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::param(
            "stop_token_ids",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    p.include_stop_str_in_output = b.include_stop_str_in_output.unwrap_or(false);
    p.ignore_eos = b.ignore_eos.unwrap_or(false);
    p.skip_special_tokens = b.skip_special_tokens.unwrap_or(true);
    if let Some(bias) = &b.logit_bias {
        if bias.len() > 300 {
            return Err(ApiError::param(
                "logit_bias",
                format!("'logit_bias' may hold at most 300 entries, got {}", bias.len()),
            ));
        }
        for (k, &x) in bias {
            let id: u32 = k.parse().ok().filter(|&i: &u32| (i as usize) < vocab).ok_or_else(|| {
                ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' key {k:?} is not a token id below {vocab}"),
                )
            })?;
            if !(-100.0..=100.0).contains(&x) {
                return Err(ApiError::param(
                    "logit_bias",
                    format!("'logit_bias' values must be numbers between -100 and 100, got {x}"),
                ));
            }
            p.logit_bias.push((id, x as f32));
        }
    }
    let stream = b.stream.unwrap_or(false);
    let so = b.stream_options.clone().unwrap_or_default();
    if b.stream_options.is_some() && !stream {
        return Err(ApiError::param(
            "stream_options",
            "'stream_options' is only allowed when 'stream' is true",
        ));
    }
    let prompt_logprobs = int_in("prompt_logprobs", b.prompt_logprobs, 0, 20)?.map(|k| k as usize);
    if prompt_logprobs.is_some() && stream {
        return Err(ApiError::param(
            "prompt_logprobs",
            "'prompt_logprobs' is not available with 'stream': true (as in vLLM)",
        ));
    }
    p.prompt_logprobs = prompt_logprobs;
    let include_usage = so.include_usage.unwrap_or(false);
    let continuous = so.continuous_usage_stats.unwrap_or(false);
    harmless(b)?;
    if b.cache_salt.as_deref() == Some("") {
        return Err(ApiError::param("cache_salt", "'cache_salt' must not be empty"));
    }
    Ok(Common {
        params: p,
        max_tokens_given: mt.is_some(),
        stream,
        include_usage,
        continuous_usage: include_usage && continuous,
        cache_salt: b.cache_salt.clone(),
        prompt_logprobs,
    })
}

/// OpenAI fields accepted with the meaning they have for a server that stores nothing and has one
/// service tier and no reasoning mode (as vLLM): checked for OpenAI's limits, then ignored. `user`:
/// for abuse tracking; `store`: nothing is stored; `metadata`: for stored completions only;
/// `service_tier`: kvgate has one; `reasoning_effort`: the served model does not reason.
fn harmless(b: &SamplingFields) -> Result<(), ApiError> {
    if let Some(m) = &b.metadata {
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
    for (k, v, allowed) in [
        (
            "service_tier",
            &b.service_tier,
            &["auto", "default", "flex", "scale", "priority"][..],
        ),
        (
            "reasoning_effort",
            &b.reasoning_effort,
            &["none", "minimal", "low", "medium", "high", "xhigh"][..],
        ),
    ] {
        if let Some(v) = v {
            if !allowed.contains(&v.as_str()) {
                return Err(ApiError::param(
                    k,
                    format!("'{k}' must be one of {}, got {v:?}", allowed.join(", ")),
                ));
            }
        }
    }
    Ok(())
}
