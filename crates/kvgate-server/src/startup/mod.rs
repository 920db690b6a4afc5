//! Startup: `serve`'s flags, environment and TOML parsed once into typed settings ([`config`],
//! [`settings`]), the default model fetched ([`default_model`], [`encoder_model`]), the backend chosen
//! for `--device` (`backends`, the one factory), the engine and the states built (`build`), the
//! router over every protocol (`router`), the listener run ([`cli`], [`listen`]), the KV-event
//! publisher ([`kv_events`]), and `--speculative-config` ([`speculative`]).

pub(crate) mod backends;
pub(crate) mod build;
pub mod cli;
pub mod config;
pub mod default_model;
pub mod encoder_model;
pub(crate) mod error;
pub mod kv_events;
pub mod listen;
pub(crate) mod router;
pub mod settings;
pub mod speculative;
