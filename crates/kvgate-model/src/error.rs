//! The errors of the model layer: loading files, parsing configs, tokenizing, rendering templates.

use thiserror::Error;

/// Everything that can go wrong in `kvgate-model`.
#[derive(Debug, Error)]
pub enum ModelError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The model's files are not what kvgate can load.
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// The model's files are malformed or inconsistent.
    #[error("invalid model: {0}")]
    Invalid(String),
    /// candle reported an error.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
    /// The tokenizer failed.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// The chat template failed to compile or render (including `raise_exception` from the template).
    #[error("chat template error: {0}")]
    Template(String),
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
