//! `POST /v1/embeddings` (OpenAI's, with vLLM's extensions): one input or a batch of them (strings or
//! token ids), each pooled by the engine from the served model's final hidden states (`--pooling`:
//! last token or mean), L2-normalized unless `"normalize": false`, returned as floats or as base64 of
//! little-endian f32, with usage.
//!
//! Guarantees: every input is checked before any is submitted (400 naming the input, the limit and the
//! value); at most [`IN_FLIGHT`] inputs of one request wait in the engine at a time, so a batch of
//! 2048 never fills the queue; a client that goes away aborts what is still running (dropping the
//! pending results); `dimensions` other than the model's own is refused (a decoder's embedding is not
//! Matryoshka-trained, so truncating it would quietly give worse vectors).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{StreamExt, TryStreamExt};
use kvgate_engine::{EmbedRequest, Usage};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::error::ApiError;
use crate::http::middleware::RequestTenant;
use crate::http::state::AppState;
use crate::ids::{now_secs, request_id};
use crate::pipeline::openai::request::strict_body;

/// Most inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Most inputs of one request queued in the engine at once.
const IN_FLIGHT: usize = 64;

/// The request body.
#[derive(Debug, Default, Deserialize)]
struct EmbeddingsBody {
    model: Option<String>,
    /// A string, a list of strings, a list of token ids, or a list of lists of token ids.
    input: Option<Value>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
    user: Option<String>,
    /// vLLM's: scale each vector to unit length (default true).
    normalize: Option<bool>,
    /// vLLM's: keep only the last k tokens of each input (-1: the model's context).
    truncate_prompt_tokens: Option<i64>,
    /// vLLM's: add the tokenizer's special tokens to text inputs (default true).
    add_special_tokens: Option<bool>,
}

/// One input as sent.
enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// The response body.
#[derive(Debug, Serialize)]
struct EmbeddingList {
    id: String,
    object: &'static str,
    created: u64,
    model: String,
    data: Vec<EmbeddingItem>,
    usage: EmbeddingUsage,
}

#[derive(Debug, Serialize)]
struct EmbeddingItem {
    object: &'static str,
    index: usize,
    embedding: Vector,
}

/// Floats, or base64 of their little-endian f32 bytes.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize)]
struct EmbeddingUsage {
    prompt_tokens: usize,
    total_tokens: usize,
    prompt_tokens_details: CachedTokens,
}

#[derive(Debug, Serialize)]
struct CachedTokens {
    cached_tokens: usize,
}

/// Reads `input` into inputs (at least one, at most [`MAX_INPUTS`]).
fn read_inputs(input: Option<Value>, vocab: usize) -> Result<Vec<Input>, ApiError> {
    let shape = "'input' must be a string, a list of strings, a list of token ids, or a list of lists of token ids";
    let ids = |v: &[Value], at: String| -> Result<Vec<u32>, ApiError> {
        v.iter()
            .map(|x| {
                x.as_u64()
                    .filter(|&t| (t as usize) < vocab)
                    .map(|t| t as u32)
                    .ok_or_else(|| {
                        ApiError::param(
                            "input",
                            format!("'{at}' contains {x}, which is not a token id of this vocabulary (size {vocab})"),
                        )
                    })
            })
            .collect()
    };
    let inputs = match input.filter(|v| !v.is_null()) {
        None => return Err(ApiError::param("input", "'input' is required")),
        Some(Value::String(s)) => vec![Input::Text(s)],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::param("input", "'input' must not be empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![Input::Ids(ids(&a, "input".into())?)],
        Some(Value::Array(a)) if a.len() > MAX_INPUTS => {
            return Err(ApiError::param(
                "input",
                format!("at most {MAX_INPUTS} inputs per request, got {}", a.len()),
            ))
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => a
            .into_iter()
            .map(|s| Input::Text(s.as_str().unwrap_or_default().to_string()))
            .collect(),
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .enumerate()
            .map(|(i, x)| {
                ids(
                    x.as_array().map(Vec::as_slice).unwrap_or_default(),
                    format!("input[{i}]"),
                )
                .map(Input::Ids)
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::param("input", shape)),
    };
    Ok(inputs)
}

/// `POST /v1/embeddings`.
pub async fn embeddings(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: EmbeddingsBody = strict_body(st.json_body(&headers, body)?)?;
    let model = st.check_model(b.model.as_deref())?;
    let limits = st.engine().limits();
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::param(
                "encoding_format",
                format!("'encoding_format' must be \"float\" or \"base64\", got {other:?}"),
            ))
        }
    };
    if let Some(d) = b.dimensions.filter(|&d| d != limits.hidden_size as i64) {
        return Err(ApiError::param(
            "dimensions",
            format!(
                "this model's embeddings have {} dimensions and cannot be shortened (it was not trained for \
                 it); 'dimensions' must be {} or left out, got {d}",
                limits.hidden_size, limits.hidden_size
            ),
        ));
    }
    let keep = match b.truncate_prompt_tokens {
        None => None,
        Some(-1) => Some(limits.max_model_len),
        Some(k) if k >= 1 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::param(
                "truncate_prompt_tokens",
                format!("'truncate_prompt_tokens' must be at least 1, or -1 for the model's context, got {k}"),
            ))
        }
    };
    let _ = b.user; // an end-user id, as OpenAI takes it: nothing to do with it here
    let add_special = b.add_special_tokens.unwrap_or(true);
    let mut prompts = Vec::new();
    for (i, input) in read_inputs(b.input, limits.vocab_size)?.into_iter().enumerate() {
        let mut ids = match input {
            Input::Text(s) => st.encode("input", s, add_special).await?,
            Input::Ids(ids) => ids,
        };
        if let Some(k) = keep {
            ids.drain(..ids.len().saturating_sub(k));
        }
        if ids.is_empty() {
            return Err(ApiError::param(
                "input",
                format!("input {i} is empty: each input needs at least one token"),
            ));
        }
        if ids.len() > limits.max_model_len {
            return Err(ApiError::param(
                "input",
                format!(
                    "input {i} has {} tokens, more than this model's maximum context length of {} tokens \
                     (set 'truncate_prompt_tokens' to keep only the last ones)",
                    ids.len(),
                    limits.max_model_len
                ),
            ));
        }
        prompts.push(ids);
    }
    let (pooling, normalize) = (st.settings().pooling, b.normalize.unwrap_or(true));
    let salt = st.salted(tenant, None);
    let engine = st.engine().clone();
    let results: Vec<(Vec<f32>, Usage)> = futures::stream::iter(prompts)
        .map(|prompt| {
            let req = EmbedRequest {
                prompt,
                pooling,
                normalize,
                cache_salt: salt.clone(),
            };
            let pending = engine.embed(req);
            async move {
                let o = pending?.outcome().await?;
                Ok::<_, ApiError>((o.embedding, o.usage))
            }
        })
        .buffered(IN_FLIGHT)
        .try_collect()
        .await?;
    let mut usage = Usage::default();
    let data = results
        .into_iter()
        .enumerate()
        .map(|(index, (v, u))| {
            usage.add(&u);
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Vector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                Vector::Float(v)
            };
            EmbeddingItem {
                object: "embedding",
                index,
                embedding,
            }
        })
        .collect();
    Ok(axum::Json(EmbeddingList {
        id: request_id("embd"),
        object: "list",
        created: now_secs(),
        model,
        data,
        usage: EmbeddingUsage {
            prompt_tokens: usage.prompt_tokens,
            total_tokens: usage.prompt_tokens,
            prompt_tokens_details: CachedTokens {
                cached_tokens: usage.cached_tokens,
            },
        },
    })
    .into_response())
}
