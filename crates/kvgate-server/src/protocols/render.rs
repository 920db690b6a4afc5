//! vLLM's render endpoints, `POST /v1/chat/completions/render` and `POST /v1/completions/render`: a
//! request body read exactly as its endpoint reads it (the same checks, the same 400s), answered with
//! the prompt's token ids instead of a generation. Cache-aware routers (vllm-router's `cache_aware`,
//! llm-d's and Dynamo's endpoint pickers) call them on every replica to learn which tokens a request
//! will prefill; without them they pay a 404 and a `/tokenize` per replica per request. The answer has
//! vLLM's shape: for chat one object, for completions a list with one per prompt, each
//! `{request_id, token_ids, sampling_params, model, stream, cache_salt}`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_engine::SamplingParams;
use serde::Serialize;

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::pipeline::events::request_id;
use crate::{protocols::chat, protocols::completions};

/// One rendered prompt (vLLM's `GenerateRequest`).
#[derive(Debug, Serialize)]
struct Rendered {
    request_id: String,
    token_ids: Vec<u32>,
    sampling_params: Sampling,
    model: String,
    stream: bool,
    cache_salt: Option<String>,
}

/// The sampling parameters the generation would run with (vLLM's names).
#[derive(Debug, Serialize)]
struct Sampling {
    n: usize,
    temperature: f32,
    top_p: f32,
    top_k: i64,
    min_p: f32,
    seed: Option<u64>,
    presence_penalty: f32,
    frequency_penalty: f32,
    repetition_penalty: f32,
    max_tokens: usize,
    min_tokens: usize,
    stop: Vec<String>,
    stop_token_ids: Vec<u32>,
    include_stop_str_in_output: bool,
    ignore_eos: bool,
    skip_special_tokens: bool,
    logprobs: Option<usize>,
    prompt_logprobs: Option<usize>,
}

impl From<&SamplingParams> for Sampling {
    fn from(p: &SamplingParams) -> Sampling {
        Sampling {
            n: p.n,
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: if p.top_k == 0 { -1 } else { p.top_k as i64 },
            min_p: p.min_p,
            seed: p.seed,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            repetition_penalty: p.repetition_penalty,
            max_tokens: p.max_tokens,
            min_tokens: p.min_tokens,
            stop: p.stop.clone(),
            stop_token_ids: p.stop_token_ids.clone(),
            include_stop_str_in_output: p.include_stop_str_in_output,
            ignore_eos: p.ignore_eos,
            skip_special_tokens: p.skip_special_tokens,
            logprobs: p.logprobs,
            prompt_logprobs: p.prompt_logprobs,
        }
    }
}

/// `POST /v1/chat/completions/render`.
pub async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/chat/completions/render")?;
    let p = chat::prepare(&st, map).await?;
    Ok(axum::Json(Rendered {
        request_id: request_id("chatcmpl"),
        sampling_params: Sampling::from(&p.c.params),
        model: p.model,
        stream: p.c.stream,
        cache_salt: p.c.cache_salt,
        token_ids: p.ids,
    })
    .into_response())
}

/// `POST /v1/completions/render`.
pub async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/completions/render")?;
    let p = completions::prepare(&st, map).await?;
    let mut params = p.c.params;
    if p.score_only {
        params.max_tokens = 0;
    }
    let id = request_id("cmpl");
    let out: Vec<Rendered> = p
        .prompts
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| Rendered {
            request_id: format!("{id}-{i}"),
            token_ids: prompt.ids,
            sampling_params: Sampling::from(&params),
            model: p.model.clone(),
            stream: p.c.stream,
            cache_salt: p.c.cache_salt.clone(),
        })
        .collect();
    Ok(axum::Json(out).into_response())
}
