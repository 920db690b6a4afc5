//! The `/v1/systemone` handler: validate (422 with every problem), resolve the model, run the reads
//! (`super::reads`: the state first in every read, one engine decision for all of them, nothing
//! sampled; a model that cannot label a question type gets a 400 naming why), and answer in request
//! order, errors in Jev's shape.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::wire::{self, Question, State as StateKind};
use super::{answer, reads};
use crate::chat::normalize_messages;
use crate::error::{ApiError, Detail, Shape};
use crate::state::{check_json_content_type, AppState};

/// The handler: every error in Jev's shape (its clients are Jev clients).
pub async fn systemone(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    answer_request(st, headers, body)
        .await
        .unwrap_or_else(|e| e.response_in(Shape::Jev))
}

async fn answer_request(
    st: Arc<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    check_json_content_type(&headers)?;
    let bytes = body.map_err(|e| st.body_error(e))?;
    let mut req = wire::parse(&bytes, st.args.systemone_max_questions).map_err(ApiError::Unprocessable)?;
    let model = st.check_decision_model(req.model.as_deref())?;
    if let StateKind::Conversation(c) = &req.state {
        let norm = normalize_messages(Some(c), "state").map_err(|e| {
            ApiError::Unprocessable(vec![Detail {
                kind: "value_error",
                loc: vec!["body".into(), "state".into()],
                msg: format!("Value error, {e}"),
                input: c.clone(),
            }])
        })?;
        req.state = StateKind::Conversation(norm);
    }
    // A state that cannot fit the context by its bytes is refused before any question renders and
    // tokenizes it (each read would).
    let state_bytes = match &req.state {
        StateKind::Conversation(c) => crate::chat::message_bytes(c),
        StateKind::Text(t) => t.len(),
    };
    st.check_prompt_bytes("state", state_bytes)?;
    if st.args.log_requests {
        tracing::info!(body = %String::from_utf8_lossy(&bytes), "systemone request");
    }
    req.cache_salt = st.salted(&headers, req.cache_salt.take());
    req.tenant = crate::state::tenant(&headers);
    let read = reads::run(&st, &req, &model).await?;
    let usage = read.usage;
    let mut answers = Map::new();
    let mut diagnostics = Map::new();
    for (((id, q), p), diag) in req.questions.iter().zip(&read.probs).zip(read.diagnostics) {
        let p = p.as_slice();
        let a = match q {
            Question::Noul { .. } => answer::noul(p),
            Question::Choice { options, .. } => {
                let names: Vec<String> = options.iter().map(|(n, _)| n.clone()).collect();
                answer::choice(&names, p)
            }
            Question::Score { levels, .. } => answer::score(levels, p),
        };
        answers.insert(id.clone(), a);
        diagnostics.insert(id.clone(), diag);
    }
    let mut out = Map::new();
    out.insert("model".into(), Value::String(model));
    out.insert("answers".into(), Value::Object(answers));
    out.insert(
        "usage".into(),
        json!({"input_tokens": usage.prompt_tokens, "output_tokens": 0,
               "input_tokens_details": {"cached_tokens": usage.cached_tokens}}),
    );
    if req.diagnostics {
        out.insert("diagnostics".into(), Value::Object(diagnostics));
    }
    Ok(axum::Json(Value::Object(out)).into_response())
}
