//! kvgate's model formats: the architectures' configs (Llama, Mistral, Qwen2, Qwen3, Gemma 3 — one
//! layer shape, differing in config), weight loading from GGUF (quant blocks as stored) and Hugging
//! Face directories (safetensors) into [`StoredModel`] (a GGUF's tensors read in place from a memory
//! map of the file, [`GgufTensor`]), the tokenizer (from `tokenizer.json` or built
//! from a GGUF's own vocabulary), chat templates rendered with minijinja, and conversations as prompt
//! text ([`prompt`]).
//!
//! No compute lives here: the loaders take no device decision, and each backend lays the stored
//! weights out itself (`kvgate-cpu` for the CPU's kernels, `kvgate-cuda` for a GPU).

mod chat;
mod config;
mod error;
mod gguf_tensor;
mod load_gguf;
mod load_hf;
mod loader;
pub mod prompt;
mod rope;
mod spm;
mod stored;
#[cfg(any(test, feature = "test-utils"))]
pub mod tiny;
mod tokenizer;

pub use chat::{strftime, ChatTemplate};
pub use config::{Activation, Arch, ModelConfig, RopeScaling, RopeStyle};
pub use error::{ModelError, Result};
pub use gguf_tensor::GgufTensor;
pub use load_hf::load_hf_dir;
pub use loader::{load_stored, load_unprepared, GenerationDefaults, LoadOptions, LoadedModel};
pub use rope::Rope;
pub use stored::{Configured, LayerWeights, StoredLayer, StoredLinear, StoredModel, StoredTensor, StoredWeights};
pub use tokenizer::{IncrementalDecoder, Tokenizer};

/// A Hugging Face checkpoint's files, for loaders of other model families (the CPU's encoder).
pub mod hf {
    pub use crate::load_hf::{read_json, Tensors};
}
