//! The decision service's errors: what the model cannot answer (a field named, a 400 at HTTP), and
//! what the engine refused or failed. The HTTP layer maps them in its one error-to-response place.

use kvgate_engine::EngineError;

/// Every error of a decision.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecideError {
    /// The spec cannot be answered by this model: `field` is at fault, the message says why (a label
    /// set the tokenizer lacks, a prompt over the context length, a state the template refuses).
    #[error("{message}")]
    Unanswerable {
        /// The field at fault (`questions`, `state`, `messages`).
        field: &'static str,
        /// Why, naming the limit and the value.
        message: String,
    },
    /// The model has no chat template to render a read with.
    #[error("this model has no chat template: serve it with --chat-template, or use /v1/completions")]
    NoChatTemplate,
    /// The engine refused or failed the reads.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl DecideError {
    pub(crate) fn field(field: &'static str, message: impl Into<String>) -> DecideError {
        DecideError::Unanswerable {
            field,
            message: message.into(),
        }
    }
}
