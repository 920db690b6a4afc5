//! kvgate's HTTP surface: axum routes for the OpenAI API (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/responses`, `/v1/embeddings`, `/v1/models`), System One decisions (`/v1/systemone`), tokenization, health and metrics; request
//! validation with clear 4xx errors; API keys and CORS; the one configuration definition; the `serve`
//! binary; and the default-model fetch. HTTP knows nothing of tensors: it talks to the engine through
//! [`kvgate_engine::EngineHandle`].

mod app;
mod chat;
pub mod cli;
mod completions;
pub mod config;
mod conversation;
pub mod default_model;
mod embeddings;
pub mod encoder_model;
mod error;
mod events;
mod generation;
pub mod infer;
pub mod kv_events;
pub mod listen;
mod middleware;
mod openai;
mod params;
mod reasoning;
mod render;
mod responses;
mod routes;
mod sampling;
pub mod settings;
mod state;
mod structured;
mod systemone;
#[cfg(feature = "test-utils")]
pub mod testing;
mod tools;
mod vllm_metrics;

pub use state::AppState;
