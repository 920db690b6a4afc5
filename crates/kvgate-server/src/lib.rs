//! kvgate's HTTP surface: axum routes for the OpenAI API (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/responses`, `/v1/embeddings`, `/v1/models`), System One decisions (`/v1/systemone`),
//! tokenization, health and metrics; request validation with clear 4xx errors; API keys and CORS; the
//! one configuration definition; the `serve` binary's startup; and the default-model fetch. HTTP knows
//! nothing of tensors: it talks to the engine through the [`infer::Inference`] seam.
//!
//! Laid out by layer: [`startup`] (settings, model, backend, engine, listener), `http` (router,
//! middleware, errors, state, small routes), `pipeline` (the one request path and response pipeline
//! every protocol shares), `protocols` (each a parser and a `Shape`).

mod http;
pub mod infer;
mod pipeline;
mod protocols;
pub mod startup;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use http::state::AppState;
pub use startup::{cli, config, default_model, encoder_model, kv_events, listen, settings};
