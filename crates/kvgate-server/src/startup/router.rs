//! The router, the one room that knows every protocol: every route with the state it reads (the
//! application's [`AppState`], the Responses protocol's [`ResponsesState`], the decision service),
//! and its layers. CORS is outermost (so every response, errors included,
//! carries the CORS headers for a listed origin, and preflights never reach auth), then the request
//! log, the panic catcher, API-key auth, request-body decompression (`Content-Encoding: zstd`, `gzip`,
//! `deflate`, `br`: the official Jev Python SDK sends zstd bodies), the body-read timeout
//! (`--body-read-timeout`: a body that stalls fails) and the body limit, which the handlers apply to
//! the decompressed bytes, so a small compressed bomb gets a 413, never the memory.

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::routing::{get, post};
use axum::Router;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::decompression::RequestDecompressionLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;

use axum::extract::FromRef;
use kvgate_decide::DecisionService;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::http::middleware::{auth, body_encoding, cors, log, panic_response, CorsPolicy, Keys};
use crate::http::settings::Settings;
use crate::http::state::{AppState, ServedModel};
use crate::infer::Inference;
use crate::protocols::responses::{conversations, ResponsesState};
use crate::startup::config::Args;
use crate::{
    http::routes, protocols::chat, protocols::completions, protocols::decisions, protocols::embeddings,
    protocols::responses, protocols::systemone, protocols::tokenize,
};

/// The router's state: each handler extracts the part it reads (`State<Arc<AppState>>`,
/// `State<Arc<ResponsesState>>`, `State<Arc<DecisionService>>`).
#[derive(Clone)]
pub(crate) struct Routes {
    /// The application's state.
    pub(crate) app: Arc<AppState>,
    /// The Responses protocol's state (its stores).
    pub(crate) responses: Arc<ResponsesState>,
    /// The decision service both decision wires ask.
    pub(crate) decisions: Arc<DecisionService>,
}

impl FromRef<Routes> for Arc<AppState> {
    fn from_ref(r: &Routes) -> Arc<AppState> {
        r.app.clone()
    }
}

impl FromRef<Routes> for Arc<ResponsesState> {
    fn from_ref(r: &Routes) -> Arc<ResponsesState> {
        r.responses.clone()
    }
}

impl FromRef<Routes> for Arc<DecisionService> {
    fn from_ref(r: &Routes) -> Arc<DecisionService> {
        r.decisions.clone()
    }
}

/// Builds the application; `test_hooks` adds the routes that break things on purpose.
pub(crate) fn router(st: Routes, policy: Arc<CorsPolicy>, keys: Arc<Keys>, test_hooks: bool) -> Router {
    let limit = st.app.settings().max_request_body.min(usize::MAX as u64) as usize;
    let body_timeout = st.app.settings().body_read_timeout;
    let mut r: Router<Routes> = Router::new();
    if test_hooks {
        // For the test suite only: routes that break things on purpose.
        r = r
            .route("/debug/panic", post(routes::debug_panic))
            .route("/debug/stop-engine", post(routes::debug_stop_engine));
    }
    r.route("/health", get(routes::health))
        .route("/ping", get(routes::health).post(routes::health))
        .route("/version", get(routes::version))
        .route("/metrics", get(routes::metrics))
        .route("/v1/models", get(routes::models))
        .route("/v1/models/{*id}", get(routes::model))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions/render", post(completions::render))
        .route("/v1/chat/completions/render", post(chat::render))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create).get(responses::socket::connect))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/responses/compact", post(responses::compact))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/conversations", post(conversations::create))
        .route(
            "/v1/conversations/{id}",
            get(conversations::get)
                .post(conversations::update)
                .delete(conversations::delete),
        )
        .route(
            "/v1/conversations/{id}/items",
            get(conversations::list_items).post(conversations::add_items),
        )
        .route(
            "/v1/conversations/{id}/items/{item_id}",
            get(conversations::get_item).delete(conversations::delete_item),
        )
        .route("/v1/systemone", post(systemone::route::systemone))
        .route("/v1/decisions", post(decisions::decisions))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/tokenizer_info", get(tokenize::tokenizer_info))
        .fallback(routes::not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(st)
        .layer(DefaultBodyLimit::max(limit))
        .layer(RequestDecompressionLayer::new())
        .layer(RequestBodyTimeoutLayer::new(body_timeout))
        .layer(from_fn(body_encoding))
        .layer(from_fn_with_state(keys, auth))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(from_fn(log))
        .layer(from_fn_with_state(policy, cors))
}

/// The application over `engine` and `model` with the flags `args`: the settings read once, the
/// state every protocol reads, the Responses stores and the decision service built here (for `serve`
/// and the test servers alike), and the router over them with the CORS policy and keys the settings
/// name.
pub fn assemble(
    engine: Arc<dyn Inference>,
    model: ServedModel,
    args: &Args,
    metrics: Option<PrometheusHandle>,
    test_hooks: bool,
) -> (Router, Arc<AppState>, Arc<CorsPolicy>, Arc<Keys>) {
    let fitted = model.fitted;
    let settings = Settings::from_args(args);
    let (policy, keys) = (settings.cors.clone(), settings.keys.clone());
    let app = Arc::new(AppState::new(engine, model, settings, args.max_queue, metrics));
    let decisions = Arc::new(
        DecisionService::new(
            app.engine().clone(),
            app.tokenizer().clone(),
            app.chat().cloned(),
            args.decision_temperature.resolve(fitted.map(|f| f.temperature)),
            args.decision_orders
                .map(usize::from)
                .or(fitted.map(|f| f.orders))
                .unwrap_or(kvgate_decide::orders::DEFAULT_ORDERS),
            app.model_name().to_string(),
        )
        .with_yes_no_calibration(
            args.decision_yes_no_calibration
                .or(fitted.map(|f| f.yes_no_calibration))
                .unwrap_or(true),
        )
        .with_default_read(
            args.decision_read
                .or(fitted.map(|f| f.read))
                .unwrap_or(kvgate_decide::orders::ReadMethod::UNFITTED),
        ),
    );
    let store_bytes = args.responses_store_memory.bytes() as usize;
    let responses = Arc::new(ResponsesState::new(
        app.clone(),
        args.responses_store_entries,
        store_bytes,
    ));
    let routes = Routes {
        app: app.clone(),
        responses,
        decisions,
    };
    let router = router(routes, policy.clone(), keys.clone(), test_hooks);
    (router, app, policy, keys)
}
