//! kvgate's model runtime on candle (CPU): the architectures (Llama, Qwen2, Qwen3, Gemma 3 — one layer
//! code, differing in config), weight loading from GGUF (quantized weights stay quantized) and Hugging
//! Face directories (safetensors), the tokenizer (from `tokenizer.json` or built from a GGUF's own
//! vocabulary), and chat templates rendered with minijinja.
//!
//! The model never allocates KV blocks: it is handed a [`Batch`] whose rows already carry their cache
//! slots and block tables, and an [`kvgate_kv::AttentionBackend`] to read and write them.

pub mod chat;
pub mod config;
pub mod dense;
pub mod error;
pub mod linear;
pub mod load_gguf;
pub mod load_hf;
pub mod loader;
pub mod model;
pub mod ops;
pub mod qmatmul;
#[cfg(any(test, feature = "test-utils"))]
pub mod tiny;
pub mod tokenizer;
pub mod weights;

pub use chat::ChatTemplate;
pub use config::{Arch, ModelConfig};
pub use error::{ModelError, Result};
pub use loader::{load, GenerationDefaults, LoadOptions, LoadedModel};
pub use model::{Batch, KvAmax, Model};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
