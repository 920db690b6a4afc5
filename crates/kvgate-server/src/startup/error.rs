//! Why `serve` could not start: one [`StartError`] for every start-up failure, naming the flag and the
//! value at fault.

use kvgate_engine::{BackendError, EngineError};
use kvgate_kv::KvError;

use crate::startup::config::{KvCacheDtype, KvCacheMethod};

/// Why `serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The backend for `--device` could not be opened (a device this build has no backend for).
    #[error("{0}")]
    Backend(BackendError),
    /// The default model could not be fetched.
    #[error("{0}")]
    DefaultModel(String),
    /// The KV event publisher could not start (a socket that does not bind).
    #[error("--kv-events-config: {0}")]
    KvEvents(String),
    /// `--speculative-config` cannot be used.
    #[error("--speculative-config: {0}")]
    Speculative(String),
    /// `--chat-template` cannot be read or compiled.
    #[error("--chat-template: {0}")]
    ChatTemplate(String),
    /// `--model` names nothing.
    #[error("--model {0}: no such file or directory")]
    ModelMissing(String),
    /// The model failed to load.
    #[error("--model {path}: cannot load: {msg}")]
    Load {
        /// The model path.
        path: String,
        /// Why.
        msg: String,
    },
    /// `--max-model-len` above the model's context.
    #[error("--max-model-len {value} exceeds the model's context length of {max} tokens")]
    MaxModelLen {
        /// Given.
        value: usize,
        /// The model's.
        max: usize,
    },
    /// The cache dtype cannot store this model.
    #[error("--kv-cache-dtype {dtype}: {err}")]
    KvDtype {
        /// Given.
        dtype: KvCacheDtype,
        /// Why.
        err: KvError,
    },
    /// The cache method cannot write this dtype or model.
    #[error("--kv-cache-method {method} with --kv-cache-dtype {dtype}: {err}")]
    KvMethod {
        /// Given.
        method: KvCacheMethod,
        /// Given.
        dtype: KvCacheDtype,
        /// Why.
        err: KvError,
    },
    /// The cache memory holds no block.
    #[error("--kv-cache-memory {bytes}: {err}")]
    KvMemory {
        /// Bytes offered.
        bytes: u64,
        /// Why.
        err: KvError,
    },
    /// The engine did not start.
    #[error("cannot start the engine: {0}")]
    Engine(#[from] EngineError),
    /// The address cannot be bound.
    #[error("--host/--port {addr}: cannot listen: {msg}")]
    Listen {
        /// host:port.
        addr: String,
        /// Why.
        msg: String,
    },
    /// The async runtime or the server itself failed.
    #[error("server: {0}")]
    Server(String),
}
