//! The small routes that read only the application's state: `/health`, `/ping`, `/version`,
//! `/metrics`, `/v1/models`, the OpenAI-shaped 404 and 405, and the test hooks.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::http::error::{ApiError, ErrorBody};
use crate::http::state::AppState;

/// `GET /health` and `/ping`: 200 while the engine runs, 503 when it does not.
pub async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.engine().is_alive() {
        StatusCode::OK.into_response()
    } else {
        ApiError::Unavailable("the engine is not running".into()).into_response()
    }
}

/// `GET /version`'s body.
#[derive(Serialize)]
struct Version {
    version: &'static str,
}

/// `GET /version`.
pub async fn version() -> Response {
    axum::Json(Version {
        version: env!("CARGO_PKG_VERSION"),
    })
    .into_response()
}

/// `GET /metrics`: Prometheus text, kvgate's series and their `vllm:` twins.
pub async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let body = st
        .metrics()
        .map(|h| crate::http::vllm_metrics::with_vllm_names(h.render(), st.model_name(), now))
        .unwrap_or_default();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The OpenAI model object (vLLM's fields: `root`, `parent`, `max_model_len`).
#[derive(Serialize)]
struct ModelObject<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    owned_by: &'static str,
    root: &'a str,
    parent: Option<&'a str>,
    max_model_len: usize,
}

/// Jev's model entry (its SDKs' `models.list()`).
#[derive(Serialize)]
struct JevModel<'a> {
    name: &'a str,
    description: String,
    release_date: &'a str,
}

/// `GET /v1/models`'s body: OpenAI's list, and Jev's beside it.
#[derive(Serialize)]
struct ModelList<'a> {
    object: &'static str,
    data: Vec<ModelObject<'a>>,
    models: Vec<JevModel<'a>>,
}

/// The OpenAI model object of served name `n`.
fn model_object<'a>(st: &'a AppState, n: &'a str) -> ModelObject<'a> {
    ModelObject {
        id: n,
        object: "model",
        created: st.created(),
        owned_by: "kvgate",
        root: &st.served_names()[0],
        parent: None,
        max_model_len: st.engine().limits().max_model_len,
    }
}

/// `GET /v1/models/{id}` (OpenAI's `models.retrieve`): a served name's model object, else 404. The id
/// may contain `/` (`Qwen/Qwen2.5-0.5B-Instruct`).
pub async fn model(State(st): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    st.check_model(Some(&id))?;
    Ok(axum::Json(model_object(&st, &id)).into_response())
}

/// `GET /v1/models`.
pub async fn models(State(st): State<Arc<AppState>>) -> Response {
    let data = st.served_names().iter().map(|n| model_object(&st, n)).collect();
    // Jev's list (its SDKs' `models.list()`): every name `/v1/systemone` accepts, aliases included.
    let date = kvgate_model::strftime("%Y-%m-%d", st.created() as i64);
    let served = st.model_name();
    let mut models: Vec<JevModel> = st
        .served_names()
        .iter()
        .map(|n| JevModel {
            name: n,
            description: format!("{served}, served by kvgate"),
            release_date: &date,
        })
        .collect();
    models.extend(
        st.settings()
            .model_aliases
            .iter()
            .filter(|a| !st.served_names().contains(a))
            .map(|a| JevModel {
                name: a,
                description: format!("alias of {served} (System One requests)"),
                release_date: &date,
            }),
    );
    axum::Json(ModelList {
        object: "list",
        data,
        models,
    })
    .into_response()
}

/// Unknown route: 404 in the OpenAI shape.
pub async fn not_found(uri: Uri) -> Response {
    ApiError::NotFound(format!("no route for {}", uri.path())).response_in(ErrorBody::of_path(uri.path()))
}

/// Known route, wrong method: 405 in the OpenAI shape.
pub async fn method_not_allowed(method: axum::http::Method, uri: Uri) -> Response {
    ApiError::MethodNotAllowed(format!("method {method} is not allowed on {}", uri.path()))
        .response_in(ErrorBody::of_path(uri.path()))
}

/// Test hook (only routed when `KVGATE_TEST_HOOKS=1`): a handler that panics.
pub async fn debug_panic() -> Response {
    panic!("test hook: a handler panicked on purpose");
}

/// Test hook (only routed when `KVGATE_TEST_HOOKS=1`): stops the engine thread.
pub async fn debug_stop_engine(State(st): State<Arc<AppState>>) -> Response {
    st.engine().shutdown();
    StatusCode::NO_CONTENT.into_response()
}
