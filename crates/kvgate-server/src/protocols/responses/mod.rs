//! `POST /v1/responses` and the stored responses' routes (`GET` / `DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`), on the shared request pipeline: the input items become a
//! conversation ([`input`]), rendered through the chat template with the tools, sampled as chat is,
//! and written by [`shape::ResponsesShape`] as the `response` object or its typed events.
//!
//! Tools: flat `function` tools as chat's; `custom` (freeform) tools offered as functions of one
//! string `input` and answered as `custom_tool_call` items; hosted tools kvgate cannot run
//! (`web_search`, `namespace`, `file_search`, …, which Codex sends by default) are left out of the
//! prompt, so the model never calls them. `text.format` (`json_schema`, `json_object`) goes through
//! llguidance. `previous_response_id` continues a stored response's conversation and `conversation`
//! a stored conversation's (`/v1/conversations`) — whose tokens are usually still warm: the state is
//! retained as a session's for the next turn. `background: true` runs it detached ([`background`]);
//! `POST /v1/responses/compact` summarises a window into a `compaction` item ([`compact`]). The
//! `response` object echoes every setting with the value used ([`prepare`]), as the Open Responses
//! schema requires.

mod background;
mod chains;
mod compact;
pub(crate) mod conversations;
mod finish;
mod input;
mod prepare;
mod replay;
mod shape;
pub(crate) mod socket;
mod state;
pub mod store;
mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::http::error::{ApiError, SpecError};
use crate::http::middleware::RequestTenant;
use crate::pipeline::generation::submit;
use crate::pipeline::openai::request::strict_body;
use crate::pipeline::openai::respond::{respond, respond_until, Stop, StreamUsage};

pub use compact::compact;
pub(crate) use compact::Compaction;
use prepare::{prepare, Prepared};
use shape::ResponsesShape;
pub(crate) use state::ResponsesState;
use store::Cancel;
use wire::{Deleted, ResponsesBody, Stub};

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, SpecError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/responses")?;
    if st.settings().log_requests {
        let logged = Value::Object(map.clone());
        tracing::info!(body = %logged, "responses request");
    }
    let b: ResponsesBody = strict_body(map)?;
    let model = st.check_model(b.model.as_deref())?;
    let p = prepare(&st, tenant, &b, model, None).await?;
    if p.trigger {
        return Ok(compact::answer_trigger(st, headers, p).await?);
    }
    if p.response.background {
        return Ok(background::start(st, headers, p).await?);
    }
    let Prepared {
        generation,
        response,
        turn,
        prompt_len,
        ..
    } = p;
    let id = response.id.clone();
    let stream = generation.sampling.stream;
    let tagged = submit(&st, &headers, tenant, generation).await?.tagged;
    let shape = ResponsesShape::new(st.clone(), response.clone(), turn);
    // `POST /v1/responses/{id}/cancel` may stop it, streamed or not
    let mut stop = cancel_signal(&st, tenant, &id);
    if stream {
        let usage = StreamUsage::bare(prompt_len);
        return Ok(respond_until(tagged, 1, Some(usage), shape, Some(stop)).await?);
    }
    let out = tokio::select! {
        r = respond(tagged, 1, None, shape) => r,
        _ = &mut stop => {
            let mut r = response;
            r.status = "cancelled";
            finish::unanswered(&st, tenant, r.clone(), false);
            Ok(axum::Json(r).into_response())
        }
    };
    // (the registration ends once the cancelled response is stored)
    drop(stop);
    Ok(out?)
}

/// Registers response `id` of `tenant` for `POST /v1/responses/{id}/cancel`: the signal resolves
/// when it is cancelled, and the registration ends when the signal is dropped — with the response's
/// stream, however that ends (a client gone included).
pub(super) fn cancel_signal(st: &Arc<ResponsesState>, tenant: Option<u32>, id: &str) -> Stop {
    let cancelled = st.responses().running(tenant, id);
    let running = Running(st.clone(), id.to_string());
    Box::pin(async move {
        let _running = running;
        cancelled.notified().await
    })
}

/// A response's registration for cancel, ended when dropped.
struct Running(Arc<ResponsesState>, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.responses().ended(&self.1);
    }
}

/// `GET /v1/responses/{id}`'s query.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    /// Stream a background response's events instead of its object.
    #[serde(default)]
    stream: Option<bool>,
    /// With `stream`: only the events after this `sequence_number` (a resumed stream).
    #[serde(default)]
    starting_after: Option<usize>,
    /// Accepted (kvgate's objects carry what `include` asks for on create).
    #[serde(default)]
    #[allow(dead_code)]
    include: Option<String>,
    /// Accepted (kvgate pads nothing).
    #[serde(default)]
    #[allow(dead_code)]
    include_obfuscation: Option<bool>,
}

/// `GET /v1/responses/{id}`: the stored object, or (`stream=true`) a background response's events,
/// from the start or after `starting_after`, followed until it ends.
pub async fn get(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
    query: Result<axum::extract::Query<GetQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, SpecError> {
    let axum::extract::Query(q) = query.map_err(|e| ApiError::bad(format!("invalid query: {e}")))?;
    if q.stream == Some(true) {
        return match st.replays().get(tenant, &id) {
            Some(replay) => Ok(replay::stream(replay, q.starting_after)),
            None if st.responses().get(tenant, &id).is_some() => Err(ApiError::param(
                "stream",
                format!(
                    "response {id:?} was not created with background: true; only a background response can be streamed"
                ),
            )
            .into()),
            None => Err(not_found(&id).into()),
        };
    }
    if q.starting_after.is_some() {
        return Err(ApiError::param("starting_after", "'starting_after' goes with stream=true").into());
    }
    match st.responses().get(tenant, &id) {
        Some((r, _)) => Ok(axum::Json(r).into_response()),
        None => Err(not_found(&id).into()),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no stored response with id {id:?}"))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, SpecError> {
    match st.responses().delete(tenant, &id) {
        true => Ok(axum::Json(Deleted {
            id,
            object: "response.deleted",
            deleted: true,
        })
        .into_response()),
        false => Err(not_found(&id).into()),
    }
}

/// `POST /v1/responses/{id}/cancel`: stops a response still being generated (not streamed) and
/// returns it with status `cancelled`; a finished one is a 400 naming its status.
pub async fn cancel(
    State(st): State<Arc<ResponsesState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, SpecError> {
    match st.responses().cancel(tenant, &id) {
        Cancel::Missing => Err(not_found(&id).into()),
        Cancel::Ended(status) => Err(ApiError::param(
            "response_id",
            format!("response {id:?} cannot be cancelled: its status is {status:?}"),
        )
        .into()),
        Cancel::Stopped(mut ended) => {
            // the sender is dropped once the response is stored or forgotten: `changed` then errs
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), ended.changed()).await;
            // a streamed response's registration ends when its stop fires, a moment before the stream
            // stores it (the same poll, another task): look again briefly before answering without it
            let mut stored = st.responses().get(tenant, &id);
            for _ in 0..20 {
                if stored.is_some() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                stored = st.responses().get(tenant, &id);
            }
            match stored {
                Some((r, _)) => Ok(axum::Json(r).into_response()),
                None => Ok(axum::Json(Stub {
                    id,
                    object: "response",
                    status: "cancelled",
                })
                .into_response()),
            }
        }
    }
}
