//! The serving [`Settings`] read once from [`Args`]: the one place a flag becomes what handlers and
//! middleware read.

use std::sync::Arc;
use std::time::Duration;

use crate::http::middleware::{CorsPolicy, Keys};
pub use crate::http::settings::{Settings, SocketLimits};
use crate::startup::config::Args;

impl Settings {
    /// The settings `args` give.
    pub fn from_args(args: &Args) -> Settings {
        Settings {
            log_requests: args.log_requests,
            max_request_body: args.max_request_body.bytes(),
            body_read_timeout: Duration::from_secs(args.body_read_timeout.max(1)),
            model_aliases: args.model_alias.clone(),
            share_prefix_cache_across_keys: args.share_prefix_cache_across_keys,
            systemone_max_questions: args.systemone_max_questions,
            decisions_max_questions: args.decisions_max_questions,
            session_window: args.session_window(),
            pooling: args.pooling.into(),
            cors: Arc::new(CorsPolicy {
                origins: args.allowed_origins.clone(),
                methods: args.allowed_methods.clone(),
                headers: args.allowed_headers.clone(),
                credentials: args.allow_credentials,
            }),
            keys: Arc::new(Keys(args.api_key.clone(), args.api_key.len() > 1)),
            sockets: SocketLimits {
                max: args.max_websocket_connections,
                idle: Duration::from_secs(args.websocket_idle_timeout.max(1)),
                max_age: Duration::from_secs(args.websocket_max_age.max(1)),
            },
        }
    }
}
