//! The seam between the engine and its callers (the HTTP layer, the decision service): the one trait
//! they talk to. The real engine ([`EngineHandle`]) implements it; tests put the tiny in-memory model
//! or a scripted fake behind it. A completion is a stream of events; a decision is one result.

use crate::error::EngineError;
use crate::handle::{EngineHandle, Limits, RequestStream};
use crate::request::{DecideRequest, Event, GenerateRequest, ReadResult, Usage};

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
        EngineHandle::decide(self, req).map(PendingDecision)
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
pub struct PendingDecision(RequestStream);

impl From<RequestStream> for PendingDecision {
    /// A decision whose result arrives on `stream` (as [`Event::Decision`] or [`Event::Error`]).
    fn from(stream: RequestStream) -> PendingDecision {
        PendingDecision(stream)
    }
}

impl PendingDecision {
    /// Waits for the result.
    pub async fn outcome(mut self) -> Result<DecisionOutcome, EngineError> {
        loop {
            match self.0.next().await {
                Some(Event::Decision { reads, usage }) => return Ok(DecisionOutcome { reads, usage }),
                Some(Event::Error(e)) => return Err(e),
                Some(_) => continue,
                None => return Err(EngineError::EngineDead),
            }
        }
    }
}
