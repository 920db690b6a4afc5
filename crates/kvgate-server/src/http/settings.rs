//! What the handlers and middleware read of the configuration, parsed once from the flags at start-up
//! (`startup::settings`): handlers never see the raw flags.

use std::sync::Arc;
use std::time::Duration;

use crate::http::middleware::{CorsPolicy, Keys};

/// The serving settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Log every request body (`--log-requests`).
    pub log_requests: bool,
    /// Largest request body in bytes, after decompression (`--max-request-body`).
    pub max_request_body: u64,
    /// How long a body may take to arrive (`--body-read-timeout`, at least 1 s).
    pub body_read_timeout: Duration,
    /// Further names `/v1/systemone` answers to (`--model-alias`).
    pub model_aliases: Vec<String>,
    /// Requests of different API keys share cached prefixes (`--share-prefix-cache-across-keys`).
    pub share_prefix_cache_across_keys: bool,
    /// Most questions one decision may ask (`--systemone-max-questions`).
    pub systemone_max_questions: usize,
    /// Most questions one `/v1/decisions` request may ask (`--decisions-max-questions`, at most 400).
    pub decisions_max_questions: usize,
    /// How long a session's state is retained for its next turn (`--session-window`; `None`: off).
    pub session_window: Option<Duration>,
    /// How embeddings are pooled (`--pooling`).
    pub pooling: kvgate_engine::Pooling,
    /// The CORS policy (`--allowed-origins`, …).
    pub cors: Arc<CorsPolicy>,
    /// The API keys (`--api-key`), and whether there are several (each a tenant).
    pub keys: Arc<Keys>,
    /// The Responses WebSocket mode's limits.
    pub sockets: SocketLimits,
}

/// Limits of the Responses WebSocket mode.
#[derive(Debug, Clone, Copy)]
pub struct SocketLimits {
    /// Connections open at once (`--max-websocket-connections`).
    pub max: usize,
    /// How long a connection may sit without a message (`--websocket-idle-timeout`).
    pub idle: Duration,
    /// How long a connection may live (`--websocket-max-age`).
    pub max_age: Duration,
}
