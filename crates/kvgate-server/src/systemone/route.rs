//! The `/v1/systemone` handler: validate (422 with every problem), check the model can label each
//! question type (400 naming why), render one read per question with the state first, submit them to the
//! engine as one decision (shared prefix computed once, one logits row per question, nothing sampled),
//! and answer in request order.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_engine::{metrics as m, DecideRequest, DecisionRead, Event};
use serde_json::{json, Map, Value};

use super::answer;
use super::labels::LabelSet;
use super::render::{messages, template_kwargs};
use super::wire::{self, Question, State as StateKind};
use crate::chat::{normalize_messages, render};
use crate::error::{ApiError, Detail, Shape};
use crate::state::{check_json_content_type, AppState};

fn labels_for<'a>(st: &'a AppState, id: &str, q: &Question) -> Result<&'a [super::labels::Label], ApiError> {
    let set: &LabelSet = match q {
        Question::Noul { .. } => &st.labels.noul,
        Question::Choice { .. } => &st.labels.choice,
        Question::Score { .. } => &st.labels.score,
    };
    let labels = set.as_ref().map_err(|why| {
        ApiError::param(
            "questions",
            format!(
                "question '{id}': this model cannot answer {} questions: {why}",
                q.kind()
            ),
        )
    })?;
    let n = match q {
        Question::Noul { .. } => 2,
        Question::Choice { options, .. } => options.len(),
        Question::Score { levels, .. } => levels.len(),
    };
    if n > labels.len() {
        return Err(ApiError::param(
            "questions",
            format!(
                "question '{id}': {n} {} exceed the {} single-token labels this model has for {} questions",
                if matches!(q, Question::Choice { .. }) {
                    "options"
                } else {
                    "levels"
                },
                labels.len(),
                q.kind()
            ),
        ));
    }
    Ok(&labels[..n])
}

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
    if st.args.log_requests {
        tracing::info!(body = %String::from_utf8_lossy(&bytes), "systemone request");
    }
    let kwargs = template_kwargs();
    let mut reads = Vec::with_capacity(req.questions.len());
    for (id, q) in &req.questions {
        let labels = labels_for(&st, id, q)?;
        let text = render(&st, &messages(&req, q), true, false, &kwargs)?;
        let prompt = st
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::param("state", e.to_string()))?;
        if st.engine.limits().check_read(prompt.len()).is_err() {
            return Err(ApiError::param(
                "state",
                format!(
                    "question '{id}': the prompt is {} tokens, more than this model's maximum context length of {} tokens",
                    prompt.len(),
                    st.engine.limits().max_model_len
                ),
            ));
        }
        reads.push(DecisionRead {
            prompt,
            labels: labels.iter().map(|l| l.ids.clone()).collect(),
        });
        metrics::counter!(m::DECISION_QUESTIONS, "model_name" => model.clone(), "type" => q.kind()).increment(1);
    }
    let mut stream = st.engine.decide(DecideRequest {
        reads,
        cache_salt: req.cache_salt.clone(),
        keep_alive: req.keep_alive.map(Duration::from_secs_f64),
    })?;
    let (results, usage) = loop {
        match stream.next().await {
            Some(Event::Decision { reads, usage }) => break (reads, usage),
            Some(Event::Error(e)) => return Err(e.into()),
            Some(_) => continue,
            None => return Err(ApiError::Unavailable("the engine stopped".into())),
        }
    };
    let mut answers = Map::new();
    let mut diagnostics = Map::new();
    for ((id, q), r) in req.questions.iter().zip(&results) {
        let a = match q {
            Question::Noul { .. } => answer::noul(&r.label_probs),
            Question::Choice { options, .. } => {
                let names: Vec<String> = options.iter().map(|(n, _)| n.clone()).collect();
                answer::choice(&names, &r.label_probs)
            }
            Question::Score { levels, .. } => answer::score(levels, &r.label_probs),
        };
        answers.insert(id.clone(), a);
        diagnostics.insert(id.clone(), json!({"label_mass": r.label_mass}));
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
