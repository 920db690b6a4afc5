//! The `/v1/systemone` handler: validate (422 with every problem), resolve the model, bound the state
//! by its bytes, ask the decision service (`kvgate_decide`: the state first in every read, one engine
//! decision for all of them, nothing sampled; a model that cannot label a question type gets a 400
//! naming why), and render the answers in request order, errors in Jev's shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_decide::answer::Keyed;
use kvgate_decide::{Answer, Diagnostics, State as StateKind};
use serde::Serialize;

use super::wire;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::state::{check_json_content_type, AppState, RequestTenant};

/// The response body.
#[derive(Serialize)]
struct Reply<'a> {
    model: String,
    answers: Keyed<&'a Answer>,
    usage: ReplyUsage,
    #[serde(skip_serializing_if = "Option::is_none")]
    diagnostics: Option<Keyed<&'a Diagnostics>>,
}

/// Jev's usage: every read's prompt tokens, no output tokens.
#[derive(Serialize)]
struct ReplyUsage {
    input_tokens: usize,
    output_tokens: usize,
    input_tokens_details: CachedTokens,
}

#[derive(Serialize)]
struct CachedTokens {
    cached_tokens: usize,
}

/// The handler: every error in Jev's shape (its clients are Jev clients).
pub async fn systemone(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer_request(st, headers, tenant, body)
        .await
        .unwrap_or_else(|e| e.response_in(ErrorBody::Jev))
}

async fn answer_request(
    st: Arc<AppState>,
    headers: HeaderMap,
    tenant: Option<u32>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_json_content_type(&headers)?;
    let bytes = body.map_err(|e| st.body_error(e))?;
    let req = wire::parse(&bytes, st.settings().systemone_max_questions).map_err(ApiError::Unprocessable)?;
    let model = st.check_decision_model(req.model.as_deref())?;
    st.check_generates("/v1/systemone")?;
    let mut spec = req.spec;
    // A state that cannot fit the context by its bytes is refused before any question renders and
    // tokenizes it (each read would).
    let state_bytes = match &spec.state {
        StateKind::Conversation(c) => crate::pipeline::conversation::message_bytes(c),
        StateKind::Text(t) => t.len(),
    };
    st.check_prompt_bytes("state", state_bytes)?;
    if st.settings().log_requests {
        tracing::info!(body = %String::from_utf8_lossy(&bytes), "systemone request");
    }
    spec.cache_salt = st.salted(tenant, spec.cache_salt.take());
    spec.tenant = tenant;
    let decision = st.decisions().decide(&spec).await?;
    let usage = decision.usage;
    let reply = Reply {
        model,
        answers: Keyed(decision.answers.iter().map(|a| (a.id.clone(), &a.answer)).collect()),
        usage: ReplyUsage {
            input_tokens: usage.prompt_tokens,
            output_tokens: 0,
            input_tokens_details: CachedTokens {
                cached_tokens: usage.cached_tokens,
            },
        },
        diagnostics: req.diagnostics.then(|| {
            Keyed(
                decision
                    .answers
                    .iter()
                    .map(|a| (a.id.clone(), &a.diagnostics))
                    .collect(),
            )
        }),
    };
    Ok(axum::Json(reply).into_response())
}
