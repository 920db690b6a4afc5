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
use kvgate_engine::{metrics as m, DecideRequest, DecisionRead, Event, ReadResult, Usage};
use serde_json::{json, Map, Value};

use super::answer;
use super::labels::LabelSet;
use super::render::{choice_labels, messages, template_kwargs};
use super::trie::LabelTrie;
use super::wire::{self, Question, State as StateKind};
use crate::chat::{normalize_messages, render};
use crate::error::{ApiError, Detail, Shape};
use crate::state::{check_json_content_type, AppState};

/// How a question's labels are read: single tokens (with their alias forms) in one read, or token
/// sequences through a [`LabelTrie`] (numbered choices beyond 26 options).
enum Labels {
    Single(Vec<Vec<u32>>),
    Trie(LabelTrie),
}

impl Labels {
    /// The first read's labels.
    fn first_read(&self) -> Vec<Vec<u32>> {
        match self {
            Labels::Single(ids) => ids.clone(),
            Labels::Trie(t) => t.first_tokens().into_iter().map(|t| vec![t]).collect(),
        }
    }
}

fn labels_for(st: &AppState, id: &str, q: &Question) -> Result<Labels, ApiError> {
    let cannot = |why: &str| {
        ApiError::param(
            "questions",
            format!(
                "question '{id}': this model cannot answer {} questions: {why}",
                q.kind()
            ),
        )
    };
    if let Question::Choice { options, .. } = q {
        if options.len() > 26 {
            let mut seqs = Vec::with_capacity(options.len());
            for l in choice_labels(options.len()) {
                seqs.push(st.tokenizer.encode(&l, false).map_err(|e| cannot(&e.to_string()))?);
            }
            return LabelTrie::new(seqs).map(Labels::Trie).map_err(|why| cannot(&why));
        }
    }
    let set: &LabelSet = match q {
        Question::Noul { .. } => &st.labels.noul,
        Question::Choice { .. } => &st.labels.choice,
        Question::Score { .. } => &st.labels.score,
    };
    let labels = set.as_ref().map_err(|why| cannot(why))?;
    let n = match q {
        Question::Noul { .. } => 2,
        Question::Choice { options, .. } => options.len(),
        Question::Score { levels, .. } => levels.len(),
    };
    if n > labels.len() {
        return Err(ApiError::param(
            "questions",
            format!(
                "question '{id}': {n} levels exceed the {} single-token labels this model has for {} questions",
                labels.len(),
                q.kind()
            ),
        ));
    }
    Ok(Labels::Single(labels[..n].iter().map(|l| l.ids.clone()).collect()))
}

/// Runs one engine decision to its result.
async fn decide(st: &AppState, req: DecideRequest) -> Result<(Vec<ReadResult>, Usage), ApiError> {
    let mut stream = st.engine.decide(req)?;
    loop {
        match stream.next().await {
            Some(Event::Decision { reads, usage }) => return Ok((reads, usage)),
            Some(Event::Error(e)) => return Err(e.into()),
            Some(_) => continue,
            None => return Err(ApiError::Unavailable("the engine stopped".into())),
        }
    }
}

/// The branch reads of a multi-token-label question: its prompt plus each branch point's prefix,
/// after the first read put the prompt's full blocks in the prefix cache (so each costs the prompt's
/// last partial block and the prefix, not the question again). Returns each label's probability.
async fn read_trie(
    st: &AppState,
    trie: &LabelTrie,
    prompt: &[u32],
    first: &ReadResult,
    salt: &Option<String>,
    usage: &mut Usage,
) -> Result<Vec<f64>, ApiError> {
    if trie.branches().is_empty() {
        return Ok(trie.combine(&first.label_probs, &[]));
    }
    let reads = trie
        .branches()
        .iter()
        .map(|(prefix, next)| DecisionRead {
            prompt: prompt.iter().chain(prefix).copied().collect(),
            labels: next.iter().map(|&t| vec![t]).collect(),
        })
        .collect();
    let (results, u) = decide(
        st,
        DecideRequest {
            reads,
            cache_salt: salt.clone(),
            keep_alive: None,
        },
    )
    .await?;
    usage.prompt_tokens += u.prompt_tokens;
    usage.cached_tokens += u.cached_tokens;
    let branch_probs: Vec<Vec<f64>> = results.into_iter().map(|r| r.label_probs).collect();
    Ok(trie.combine(&first.label_probs, &branch_probs))
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
    let mut label_plans = Vec::with_capacity(req.questions.len());
    for (id, q) in &req.questions {
        let labels = labels_for(&st, id, q)?;
        let text = render(&st, &messages(&req, q), true, false, &kwargs)?;
        let prompt = st
            .tokenizer
            .encode(&text, false)
            .map_err(|e| ApiError::param("state", e.to_string()))?;
        let longest = match &labels {
            Labels::Trie(t) => t.branches().iter().map(|(p, _)| p.len()).max().unwrap_or(0),
            Labels::Single(_) => 0,
        };
        if st.engine.limits().check_read(prompt.len() + longest).is_err() {
            return Err(ApiError::param(
                "state",
                format!(
                    "question '{id}': the prompt is {} tokens, more than this model's maximum context length of {} tokens",
                    prompt.len() + longest,
                    st.engine.limits().max_model_len
                ),
            ));
        }
        reads.push(DecisionRead {
            prompt,
            labels: labels.first_read(),
        });
        label_plans.push(labels);
        metrics::counter!(m::DECISION_QUESTIONS, "model_name" => model.clone(), "type" => q.kind()).increment(1);
    }
    let prompts: Vec<Vec<u32>> = reads.iter().map(|r| r.prompt.clone()).collect();
    let (results, mut usage) = decide(
        &st,
        DecideRequest {
            reads,
            cache_salt: req.cache_salt.clone(),
            keep_alive: req.keep_alive.map(Duration::from_secs_f64),
        },
    )
    .await?;
    // Multi-token labels: their branch reads, one engine request per question, concurrently.
    let mut probs: Vec<Vec<f64>> = results.iter().map(|r| r.label_probs.clone()).collect();
    let tries: Vec<usize> = (0..label_plans.len())
        .filter(|&i| matches!(label_plans[i], Labels::Trie(_)))
        .collect();
    if !tries.is_empty() {
        let mut extra = vec![Usage::default(); tries.len()];
        let futs = tries.iter().zip(extra.iter_mut()).map(|(&i, u)| {
            let Labels::Trie(t) = &label_plans[i] else {
                unreachable!("filtered to tries")
            };
            read_trie(&st, t, &prompts[i], &results[i], &req.cache_salt, u)
        });
        let out = futures::future::join_all(futs).await;
        for (&i, p) in tries.iter().zip(out) {
            probs[i] = p?;
        }
        for u in extra {
            usage.prompt_tokens += u.prompt_tokens;
            usage.cached_tokens += u.cached_tokens;
        }
    }
    let mut answers = Map::new();
    let mut diagnostics = Map::new();
    for (((id, q), r), p) in req.questions.iter().zip(&results).zip(&probs) {
        let a = match q {
            Question::Noul { .. } => answer::noul(p),
            Question::Choice { options, .. } => {
                let names: Vec<String> = options.iter().map(|(n, _)| n.clone()).collect();
                answer::choice(&names, p)
            }
            Question::Score { levels, .. } => answer::score(levels, p),
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
