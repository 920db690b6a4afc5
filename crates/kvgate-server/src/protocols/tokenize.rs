//! vLLM's tokenizer routes: `POST /tokenize` (a prompt, or chat messages rendered through the
//! template exactly as chat completions renders them), `POST /detokenize`, and `GET /tokenizer_info`
//! (what a remote tokenizer client such as lm-eval's needs). Their wire types live here.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::pipeline::conversation::{message_bytes, normalize_messages, render};
use crate::pipeline::openai::request::strict_body;

/// `POST /tokenize` (vLLM's): a prompt, or messages rendered through the chat template.
#[derive(Debug, Default, Deserialize)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<String>,
    /// Checked by the chat messages' validator (the same one chat completions use).
    pub messages: Option<Value>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
}

/// `POST /detokenize` (vLLM's).
#[derive(Debug, Default, Deserialize)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Option<Vec<u32>>,
}

/// `POST /tokenize`'s body.
#[derive(Serialize)]
struct Tokenized {
    count: usize,
    max_model_len: usize,
    tokens: Vec<u32>,
}

/// `POST /tokenize`: `{prompt}` or `{messages}` → `{count, max_model_len, tokens}`.
pub async fn tokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: TokenizeBody = strict_body(st.json_body(&headers, body)?)?;
    st.check_model(b.model.as_deref())?;
    let messages = b.messages.filter(|m| !m.is_null());
    let tokens = match (b.prompt, messages) {
        (Some(_), Some(_)) => return Err(ApiError::bad("give either 'prompt' or 'messages', not both")),
        (Some(p), None) => st.encode("prompt", p, b.add_special_tokens.unwrap_or(true)).await?,
        (None, Some(m)) => {
            let msgs = normalize_messages(Some(&m), "messages")?;
            st.check_prompt_bytes("messages", message_bytes(&msgs))?;
            let kwargs = b.chat_template_kwargs.unwrap_or_default();
            let cont = b.continue_final_message.unwrap_or(false);
            let add_gen = b.add_generation_prompt.unwrap_or(true) && !cont;
            let text = render(&st, &msgs, add_gen, cont, &kwargs)?;
            st.encode("messages", text, b.add_special_tokens.unwrap_or(false))
                .await?
        }
        (None, None) => return Err(ApiError::bad("'prompt' or 'messages' is required")),
    };
    Ok(axum::Json(Tokenized {
        count: tokens.len(),
        max_model_len: st.engine().limits().max_model_len,
        tokens,
    })
    .into_response())
}

/// `GET /tokenizer_info`'s body (the fields of vLLM's).
#[derive(Serialize)]
struct TokenizerInfo<'a> {
    tokenizer_class: &'static str,
    eos_token: Option<String>,
    eos_token_ids: &'a [u32],
    bos_token: Option<String>,
    pad_token: Option<String>,
    unk_token: Option<String>,
    chat_template: Option<&'a str>,
    model_max_length: usize,
    vocab_size: usize,
}

/// `GET /tokenizer_info`: what a remote tokenizer client needs (lm-eval's `tokenized_requests`
/// through the server, as vLLM serves it): the special tokens as strings, the chat template, the
/// context length and vocabulary size.
pub async fn tokenizer_info(State(st): State<Arc<AppState>>) -> Response {
    let tok = &st.tokenizer();
    let name = |id: Option<&u32>| id.and_then(|&i| tok.id_to_token(i));
    let eos = st
        .chat()
        .map(|c| c.eos_token().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| name(st.eos_token_ids().first()));
    let bos = st.chat().map(|c| c.bos_token().to_string()).filter(|s| !s.is_empty());
    let find = |cands: &[&str]| {
        cands
            .iter()
            .find(|c| tok.token_to_id(c).is_some())
            .map(|c| c.to_string())
    };
    axum::Json(TokenizerInfo {
        tokenizer_class: "PreTrainedTokenizerFast",
        eos_token: eos,
        eos_token_ids: st.eos_token_ids(),
        bos_token: bos,
        pad_token: find(&["<pad>", "<|pad|>", "<|finetune_right_pad_id|>"]),
        unk_token: find(&["<unk>", "<|unk|>"]),
        chat_template: st.chat().as_ref().map(|c| c.source()),
        model_max_length: st.engine().limits().max_model_len,
        vocab_size: tok.vocab_size(),
    })
    .into_response()
}

/// `POST /detokenize`'s body.
#[derive(Serialize)]
struct Detokenized {
    prompt: String,
}

/// `POST /detokenize`: `{tokens}` → `{prompt}`.
pub async fn detokenize(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let b: DetokenizeBody = strict_body(st.json_body(&headers, body)?)?;
    st.check_model(b.model.as_deref())?;
    let Some(ids) = b.tokens else {
        return Err(ApiError::param("tokens", "'tokens' is required"));
    };
    if let Some(&bad) = ids.iter().find(|&&t| t as usize >= st.engine().limits().vocab_size) {
        return Err(ApiError::param(
            "tokens",
            format!(
                "token id {bad} is outside the vocabulary (size {})",
                st.engine().limits().vocab_size
            ),
        ));
    }
    let text = st
        .tokenizer()
        .decode(&ids, false)
        .map_err(|e| ApiError::param("tokens", e.to_string()))?;
    Ok(axum::Json(Detokenized { prompt: text }).into_response())
}
