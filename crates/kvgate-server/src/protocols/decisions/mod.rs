//! `POST /v1/decisions`: OpenAI's Decisions API (openai-python 3.60's `decisions.create`) as a thin
//! wire over the same decision service as `/v1/systemone` — the same spec, the same reads over the same
//! warm state, the same answers. [`wire`] types the body, [`spec`] checks OpenAI's limits and builds the
//! service's spec, [`reply`] renders the answers in question order. Errors are OpenAI's shape with the
//! exact `param`.

pub(crate) mod reply;
pub(crate) mod spec;
pub(crate) mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_decide::DecisionService;
use serde_json::Value;

use crate::http::body::check_json_content_type;
use crate::http::error::ApiError;
use crate::http::middleware::RequestTenant;
use crate::http::state::AppState;
use crate::pipeline::decision::{decide, DecisionCall};

/// The handler.
pub(crate) async fn decisions(
    State(st): State<Arc<AppState>>,
    State(service): State<Arc<DecisionService>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_json_content_type(&headers)?;
    let bytes = body.map_err(|e| st.body_error(e))?;
    let body: Value = serde_json::from_slice(&bytes).map_err(|e| ApiError::bad(format!("invalid JSON body: {e}")))?;
    if !body.is_object() {
        return Err(ApiError::bad("the request body must be a JSON object"));
    }
    let req = spec::parse(body, st.settings().decisions_max_questions)?;
    if let Some(id) = &req.safety_identifier {
        tracing::info!(safety_identifier = %id, "decisions request");
    }
    let call = DecisionCall {
        route: "/v1/decisions",
        state_field: "input",
        model: Some(req.model.as_str()),
        tenant,
        body: &bytes,
    };
    let (model, decision) = decide(&st, &service, req.spec, call).await?;
    let answers = req
        .keys
        .iter()
        .zip(&decision.answers)
        .map(|(k, a)| reply::answer(k, a, req.refuse_below))
        .collect();
    let u = decision.usage;
    Ok(axum::Json(reply::Decision {
        model,
        answers,
        usage: reply::DecisionUsage::new(u.prompt_tokens, u.cached_tokens, decision.written_tokens),
    })
    .into_response())
}
