//! The engine's errors: what a submission can be refused for, and what can end a request early.

use thiserror::Error;

use crate::registry::SchedError;
use kvgate_backend::BackendError;

/// Everything the engine reports to its callers.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum EngineError {
    /// The prompt alone exceeds the context.
    #[error("This model's maximum context length is {max_model_len} tokens. However, your prompt contains {prompt_tokens} input tokens.")]
    PromptTooLong {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// The context.
        max_model_len: usize,
    },
    /// Prompt plus requested output exceed the context.
    #[error("This model's maximum context length is {max_model_len} tokens. However, you requested {} tokens ({prompt_tokens} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.", prompt_tokens + max_tokens)]
    TooManyTokens {
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Requested output tokens.
        max_tokens: usize,
        /// The context.
        max_model_len: usize,
    },
    /// The request needs more KV blocks than the whole cache has.
    #[error("the request needs {needed} KV-cache blocks but the cache has {available} in all (raise --kv-cache-memory or lower n / max_tokens)")]
    DoesNotFit {
        /// Blocks needed.
        needed: usize,
        /// Blocks in the pool.
        available: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary (size {vocab})")]
    InvalidToken {
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// An empty prompt.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The waiting queue is full.
    #[error("the server is busy: {max_queue} requests are already waiting; retry later")]
    QueueFull {
        /// The queue limit.
        max_queue: usize,
    },
    /// The engine thread is gone.
    #[error("the engine is not running")]
    EngineDead,
    /// The engine's configuration does not match its backend (start-up).
    #[error("engine configuration: {0}")]
    Config(String),
    /// The engine thread could not be started.
    #[error("cannot start the engine thread: {0}")]
    Spawn(String),
    /// The backend failed a step (the requests in it fail).
    #[error("engine step failed: {0}")]
    Backend(#[from] BackendError),
    /// The scheduler's bookkeeping failed a step (the requests in it fail).
    #[error("engine step failed: {0}")]
    Scheduler(#[from] SchedError),
    /// A step panicked (the requests in flight fail; the engine resets and keeps serving).
    #[error("internal engine error: engine panic: {0}")]
    Panic(String),
    /// The served model cannot do what was asked (an embedding model asked for a completion).
    #[error("{0}")]
    Unsupported(String),
}

impl EngineError {
    /// True for errors caused by the request (HTTP 400), false for server-side ones.
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::PromptTooLong { .. }
                | EngineError::TooManyTokens { .. }
                | EngineError::DoesNotFit { .. }
                | EngineError::InvalidToken { .. }
                | EngineError::EmptyPrompt
                | EngineError::Unsupported(_)
        )
    }
}
