//! kvgate's engine: one thread that owns the scheduler, the block pool and prefix cache, the sequences,
//! the sampler and the decision reads, and runs the model one flat batch per step. The world talks to it
//! through an [`EngineHandle`] and per-request channels; it knows nothing of HTTP.

pub mod block_pool;
pub mod engine;
pub mod error;
pub mod handle;
pub mod kv_manager;
pub mod metrics;
pub mod request;
pub mod sampling;
pub mod scheduler;
pub mod text;

#[cfg(test)]
mod scheduler_fuzz;

pub use engine::{start, EngineConfig};
pub use error::EngineError;
pub use handle::{EngineHandle, EngineStats, Limits, RequestStream};
pub use request::{
    DecideRequest, DecisionRead, Event, FinishReason, GenerateRequest, ReadResult, RequestId, StopMatch, Usage,
};
pub use sampling::{SamplingParams, TokenLogprob};
