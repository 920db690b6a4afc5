//! The router: every route with its layers. CORS is outermost (so every response, errors included,
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

use crate::http::middleware::{auth, body_encoding, cors, log, panic_response, CorsPolicy, Keys};
use crate::http::state::AppState;
use crate::{
    http::routes, protocols::chat, protocols::completions, protocols::conversations, protocols::decisions,
    protocols::embeddings, protocols::render, protocols::responses, protocols::systemone,
};

/// Builds the application; `test_hooks` adds the routes that break things on purpose.
pub fn router(st: Arc<AppState>, policy: Arc<CorsPolicy>, keys: Arc<Keys>, test_hooks: bool) -> Router {
    let limit = st.settings().max_request_body.min(usize::MAX as u64) as usize;
    let body_timeout = st.settings().body_read_timeout;
    let mut r = Router::new();
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
        .route("/v1/completions/render", post(render::completions))
        .route("/v1/chat/completions/render", post(render::chat))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/responses", post(responses::create))
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
        .route("/tokenize", post(routes::tokenize))
        .route("/detokenize", post(routes::detokenize))
        .route("/tokenizer_info", get(routes::tokenizer_info))
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
