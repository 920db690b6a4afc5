//! kvgate's HTTP surface: axum routes for the OpenAI API (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/responses` with `/v1/conversations`, `/v1/embeddings`, `/v1/models`), decisions on two wires
//! (Jev's `/v1/systemone`, OpenAI's `/v1/decisions`), vLLM's tokenizer and render routes, health and
//! metrics; request validation with clear 4xx errors; API keys and CORS; the one configuration
//! definition; the `serve` binary's startup; and the default-model fetch. HTTP knows nothing of
//! tensors: it talks to the engine through the [`infer::Inference`] seam, whose three request kinds
//! are completions, decisions and embeddings.
//!
//! Laid out by layer, imported in one direction: [`startup`] (settings, model, backend, engine, the
//! router, listener) → `protocols` (each a parser, a `Shape` and its own state) → `pipeline` (the one
//! request path and response pipeline every protocol shares) → `http` (the state every handler reads,
//! errors, middleware) → `ids`.

mod http;
mod ids;
pub mod infer;
mod pipeline;
mod protocols;
pub mod startup;
#[cfg(feature = "test-utils")]
pub mod testing;

pub use http::state::AppState;
pub use startup::{cli, config, default_model, encoder_model, kv_events, listen, settings};
