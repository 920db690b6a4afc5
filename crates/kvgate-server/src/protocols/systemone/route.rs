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
use kvgate_decide::{Answer, DecisionService, Diagnostics};
use serde::Serialize;

use super::wire;
use crate::http::body::check_json_content_type;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::middleware::RequestTenant;
use crate::http::state::AppState;
use crate::pipeline::decision::{decide, DecisionCall};

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
    State(service): State<Arc<DecisionService>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer_request(st, service, headers, tenant, body)
        .await
        .unwrap_or_else(|e| e.response_in(ErrorBody::Jev))
}

async fn answer_request(
    st: Arc<AppState>,
    service: Arc<DecisionService>,
    headers: HeaderMap,
    tenant: Option<u32>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_json_content_type(&headers)?;
    let bytes = body.map_err(|e| st.body_error(e))?;
    let req = wire::parse(&bytes, st.settings().systemone_max_questions).map_err(ApiError::Unprocessable)?;
    let call = DecisionCall {
        route: "/v1/systemone",
        state_field: "state",
        model: req.model.as_deref(),
        tenant,
        body: &bytes,
    };
    let (model, decision) = decide(&st, &service, req.spec, call).await?;
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
