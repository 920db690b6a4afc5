//! kvgate's model runtime on candle (CPU): the architectures (Llama, Qwen2, Qwen3, Gemma 3 — one layer
//! code, differing in config), weight loading from GGUF (quantized weights stay quantized) and Hugging
//! Face directories (safetensors), the tokenizer (from `tokenizer.json` or built from a GGUF's own
//! vocabulary), and chat templates rendered with minijinja.
//!
//! The model never allocates KV blocks: it is handed a [`Batch`] whose rows already carry their cache
//! slots and block tables, and an [`kvgate_kv::AttentionBackend`] to read and write them. The CPU
//! backend ([`CpuBackend`]) is this model over a host cache behind the `kvgate_backend` seam.

mod chat;
mod config;
mod cpu_backend;
mod dense;
pub mod encoder;
mod error;
mod linear;
mod load_gguf;
mod load_hf;
mod loader;
mod model;
mod ops;
mod pool;
pub mod prompt;
mod qmatmul;
mod repack;
mod spm;
mod stored;
#[cfg(any(test, feature = "test-utils"))]
pub mod tiny;
mod tokenizer;
mod weights;

pub use chat::{strftime, ChatTemplate};
pub use config::{Activation, Arch, ModelConfig, RopeScaling, RopeStyle};
pub use cpu_backend::{CpuBackend, CpuSettings};
pub use error::{ModelError, Result};
pub use kvgate_backend::{Batch, KvAmax, Output, Precision, Want, RELEASED_BLOCK};
pub use load_hf::load_hf_dir;
pub use loader::{load, load_stored, load_unprepared, GenerationDefaults, LoadOptions, LoadedModel};
pub use model::{ForwardOut, Model};
pub use ops::Rope;
pub use qmatmul::{QKind, QMatrix};
pub use stored::{Configured, CpuLayout, StoredLayer, StoredLinear, StoredModel, StoredTensor, StoredWeights};
pub use tokenizer::{IncrementalDecoder, Tokenizer};
