//! The seam between the engine and its callers (the HTTP layer, the decision service): the one trait
//! they talk to. The real engine ([`EngineHandle`]) implements it; tests put the tiny in-memory model
//! or a scripted fake behind it. A completion is a stream of events; a decision and an embedding are
//! one result each.

use tokio::sync::oneshot;

use crate::error::EngineError;
use crate::handle::{EngineHandle, Limits, RequestStream};
use crate::request::{DecideRequest, EmbedOutcome, EmbedRequest, GenerateRequest, ReadResult, Usage};

/// What callers need from an engine.
pub trait Inference: Send + Sync + 'static {
    /// The limits submissions are checked against.
    fn limits(&self) -> Limits;

    /// Whether the engine can still take requests.
    fn is_alive(&self) -> bool;

    /// Submits a completion (`params.max_tokens` resolved).
    fn generate(&self, req: GenerateRequest) -> Result<RequestStream, EngineError>;

    /// Submits a decision.
    fn decide(&self, req: DecideRequest) -> Result<PendingDecision, EngineError>;

    /// Submits one embedding input.
    fn embed(&self, req: EmbedRequest) -> Result<PendingEmbedding, EngineError>;

    /// Whether it generates (completions, decisions); an embedding model does not.
    fn generates(&self) -> bool {
        true
    }

    /// Stops the engine (requests in flight fail, later ones get 503).
    fn shutdown(&self);
}

impl Inference for EngineHandle {
    fn limits(&self) -> Limits {
        EngineHandle::limits(self)
    }

    fn is_alive(&self) -> bool {
        EngineHandle::is_alive(self)
    }

    fn generate(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        EngineHandle::generate(self, req)
    }

    fn decide(&self, req: DecideRequest) -> Result<PendingDecision, EngineError> {
        EngineHandle::decide(self, req)
    }

    fn embed(&self, req: EmbedRequest) -> Result<PendingEmbedding, EngineError> {
        EngineHandle::embed(self, req)
    }

    fn shutdown(&self) {
        EngineHandle::shutdown(self)
    }
}

/// What a decision's reads found.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionOutcome {
    /// One result per read, in read order.
    pub reads: Vec<ReadResult>,
    /// Prompt tokens over all reads, cached ones, no output tokens.
    pub usage: Usage,
}

/// A submitted decision: one result to wait for. Dropping it before the result aborts the decision in
/// the engine (its blocks are freed at the next step).
#[derive(Debug)]
pub struct PendingDecision(oneshot::Receiver<Result<DecisionOutcome, EngineError>>);

impl From<oneshot::Receiver<Result<DecisionOutcome, EngineError>>> for PendingDecision {
    /// A decision whose result arrives on `rx` (engines other than this crate's, such as the scripted
    /// fakes of HTTP tests, make one from their own channel).
    fn from(rx: oneshot::Receiver<Result<DecisionOutcome, EngineError>>) -> PendingDecision {
        PendingDecision(rx)
    }
}

impl PendingDecision {
    /// Waits for the result (the engine going away without one is [`EngineError::EngineDead`]).
    pub async fn outcome(self) -> Result<DecisionOutcome, EngineError> {
        self.0.await.unwrap_or(Err(EngineError::EngineDead))
    }
}

/// A submitted embedding: one result to wait for. Dropping it before the result aborts it in the
/// engine.
#[derive(Debug)]
pub struct PendingEmbedding(oneshot::Receiver<Result<EmbedOutcome, EngineError>>);

impl From<oneshot::Receiver<Result<EmbedOutcome, EngineError>>> for PendingEmbedding {
    /// An embedding whose result arrives on `rx`.
    fn from(rx: oneshot::Receiver<Result<EmbedOutcome, EngineError>>) -> PendingEmbedding {
        PendingEmbedding(rx)
    }
}

impl PendingEmbedding {
    /// Waits for the result (the engine going away without one is [`EngineError::EngineDead`]).
    pub async fn outcome(self) -> Result<EmbedOutcome, EngineError> {
        self.0.await.unwrap_or(Err(EngineError::EngineDead))
    }
}
