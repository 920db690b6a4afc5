//! Startup: `serve`'s flags, environment and TOML parsed once into typed settings ([`config`],
//! [`settings`]), the default model fetched ([`default_model`], [`encoder_model`]), the backend chosen
//! for `--device` (`backends`, the one factory), the engine started and the listener run ([`cli`],
//! [`listen`]), the KV-event publisher ([`kv_events`]), and `--speculative-config` ([`speculative`]).

pub(crate) mod backends;
pub mod cli;
pub mod config;
pub mod default_model;
pub mod encoder_model;
pub mod kv_events;
pub mod listen;
pub mod settings;
pub mod speculative;
