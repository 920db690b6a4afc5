//! Background responses (`background: true`): the request is answered at once with the response
//! `queued` (stored, so `GET /v1/responses/{id}` polls it) — or, with `stream: true`, with its events
//! — and the generation runs detached to its end, stored as it ends: completed, incomplete, failed, or
//! cancelled by `POST /v1/responses/{id}/cancel`. Its events are kept (`replay.rs`), so
//! `GET /v1/responses/{id}?stream=true&starting_after=N` streams it from the start or resumes it. At most `--responses-store-entries` run at once (a 429 past it);
//! a run's engine request is dropped with it, so its KV blocks go back however it ends.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use futures::StreamExt;

use super::cancel_signal;
use super::prepare::Prepared;
use super::replay;
use super::shape::ResponsesShape;
use crate::http::error::ApiError;
use crate::pipeline::generation::submit;
use crate::pipeline::openai::respond::{chunks, StreamUsage};
use crate::protocols::responses::ResponsesState;

/// Starts `p` in the background; answers with its `queued` snapshot.
pub(super) async fn start(st: Arc<ResponsesState>, headers: HeaderMap, p: Prepared) -> Result<Response, ApiError> {
    if !st.responses().enabled() {
        return Err(ApiError::param(
            "background",
            "'background' responses must be stored, and this server stores none (--responses-store-entries 0)",
        ));
    }
    let slot = st.responses().background().ok_or_else(|| ApiError::TooManyRequests {
        message: format!(
            "{} background responses are already running (the bound is --responses-store-entries)",
            st.responses().max_background()
        ),
        retry_after: 1,
    })?;
    let Prepared {
        generation,
        mut response,
        mut turn,
        prompt_len,
        ..
    } = p;
    let stream = generation.sampling.stream;
    let tenant = turn.kept.tenant;
    turn.kept.background = true;
    let tagged = submit(&st, &headers, tenant, generation).await?.tagged;
    let id = response.id.clone();
    // `POST /v1/responses/{id}/cancel` ends the events with the shape's cancelled ones (the shape
    // stores the response however it ends); the registration goes with the run
    let stop = cancel_signal(&st, tenant, &id);
    response.status = "queued";
    st.responses().put_running(tenant, response.clone());
    let queued = response.clone();
    response.status = "in_progress";
    let shape = ResponsesShape::new(st.clone(), response.clone(), turn);
    // every event is kept, so the run can be streamed (now or later) and resumed
    let (recorder, replay) = replay::channel();
    st.replays().put(tenant, &id, replay.clone());
    let run = st.clone();
    tokio::spawn(async move {
        let _slot = slot;
        run.responses().put_running(tenant, response);
        let mut events = chunks(tagged, StreamUsage::bare(prompt_len), shape, Some(stop));
        while let Some(batch) = events.next().await {
            recorder.push(batch);
        }
    });
    if stream {
        return Ok(replay::stream(replay, None));
    }
    Ok(Json(queued).into_response())
}
