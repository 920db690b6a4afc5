//! The seam between HTTP and the engine: the one trait every handler talks to. The real engine
//! ([`kvgate_engine::EngineHandle`]) implements it; tests put the tiny in-memory model or a scripted
//! fake behind it, so the whole HTTP surface (CORS, auth, limits, validation, error shapes) is tested
//! in process without the binary or any weights.

use kvgate_engine::{DecideRequest, EngineError, EngineHandle, GenerateRequest, Limits, RequestStream};

/// What the HTTP layer needs from an engine.
pub trait Inference: Send + Sync + 'static {
    /// The limits submissions are checked against.
    fn limits(&self) -> Limits;

    /// Whether the engine can still take requests.
    fn is_alive(&self) -> bool;

    /// Submits a completion (`params.max_tokens` resolved).
    fn generate(&self, req: GenerateRequest) -> Result<RequestStream, EngineError>;

    /// Submits a decision.
    fn decide(&self, req: DecideRequest) -> Result<RequestStream, EngineError>;

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

    fn decide(&self, req: DecideRequest) -> Result<RequestStream, EngineError> {
        EngineHandle::decide(self, req)
    }

    fn shutdown(&self) {
        EngineHandle::shutdown(self)
    }
}
