//! Background responses (`background: true`): the request is answered at once with the response
//! `queued` (stored, so `GET /v1/responses/{id}` polls it), and the generation runs detached to its
//! end, stored as it ends — completed, incomplete, failed, or cancelled by
//! `POST /v1/responses/{id}/cancel`. At most `--responses-store-entries` run at once (a 429 past it);
//! a run's engine request is dropped with it, so its KV blocks go back however it ends.

use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::finish;
use super::prepare::Prepared;
use super::shape::ResponsesShape;
use super::wire::ResponseError;
use crate::http::error::ApiError;
use crate::pipeline::generation::submit;
use crate::pipeline::openai::respond::respond;
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
        turn,
        ..
    } = p;
    let tenant = turn.kept.tenant;
    let tagged = submit(&st, &headers, tenant, generation).await?.tagged;
    let id = response.id.clone();
    let cancelled = st.responses().running(tenant, &id);
    response.status = "queued";
    st.responses().put_running(tenant, response.clone());
    let queued = response.clone();
    response.status = "in_progress";
    let shape = ResponsesShape::new(st.clone(), response.clone(), turn);
    let run = st.clone();
    tokio::spawn(async move {
        let _slot = slot;
        run.responses().put_running(tenant, response.clone());
        tokio::select! {
            r = respond(tagged, 1, None, shape) => {
                // the shape stored the response as it ended; a failure is stored here
                if let Err(e) = r {
                    let mut failed = response;
                    failed.status = "failed";
                    failed.error = Some(ResponseError { code: "server_error".into(), message: e.to_string() });
                    finish::unanswered(&run, tenant, failed, true);
                }
            }
            _ = cancelled.notified() => {
                let mut r = response;
                r.status = "cancelled";
                finish::unanswered(&run, tenant, r, true);
            }
        }
        run.responses().ended(&id);
    });
    Ok(Json(queued).into_response())
}
