//! kvgate's engine: one thread that owns the backend (KV storage + forward pass), the scheduler with
//! the block pool and prefix cache, the sequences and every request's state (one request kind each: completion or decision), and
//! runs one flat batch per step. The world talks to it through an [`EngineHandle`] and per-request
//! channels; it knows nothing of HTTP.
//!
//! The rooms: [`engine`](crate::start) (the loop), `scheduler` (what runs next) over `registry`
//! (sequences and groups under typed ids), `layout` (how a group's reads share a prefix, keep-alive pins), `kv_manager`
//! and `block_pool` (block tables, prefix cache), `batch` (plan → device-neutral batch), the
//! [`Backend`] seam (its own crate, `kvgate-backend`: the engine is handed a backend and opens none —
//! `serve` chooses the device at its edge), `constraint` (the grammar seam: masks computed alongside the forward pass),
//! `kinds` (the request kinds behind one trait, fed by `request`'s types and the [`Inference`] seam: completions sample, stop, detokenize and stream;
//! decisions read label log-probs and answer once; embeddings pool hidden states), [`tier`] (the second KV tier: evicted blocks kept by
//! content in host memory and a spill file, restored through the backend's copy interface), [`metrics`];
//! and apart from all of it `encoder` ([`start_encoder`]: a sentence encoder's own thread over an
//! [`EncoderBackend`], no KV cache, embeddings only, behind the same [`Inference`] seam).

mod batch;
mod block_pool;
mod config;
mod constraint;
mod draft;
mod encoder;
mod engine;
mod error;
mod handle;
mod inference;
mod kinds;
mod kv_events;
mod kv_manager;
mod layout;
pub mod metrics;
mod pacing;
mod registry;
mod request;
mod salts;
mod sampling;
mod scheduler;
pub mod speculation;
mod text;
pub mod tier;
mod token_tree;

#[cfg(test)]
mod scheduler_cases;
#[cfg(test)]
mod scheduler_fuzz;

pub use block_pool::{BlockId, PoolCounts};
pub use config::EngineConfig;
pub use constraint::{ConstraintFactory, Guide, TokenConstraint, TokenMask};
pub use draft::DraftStats;
pub use encoder::{start_encoder, EncoderHandle};
pub use engine::{start, start_with_draft};
pub use error::EngineError;
pub use handle::{EngineHandle, EngineStats};
pub use inference::{DecisionOutcome, Inference, Limits, Pending, PendingDecision, PendingEmbedding, RequestStream};
pub use kv_events::{block_hash, KvEvent, KvEventBatch, KvEventSink};
pub use kvgate_backend::{kv_scale, Backend, BackendError, BlockCopy, Device, EncoderBackend, KvMemory, KvStats};
pub use registry::SchedError;
pub use request::{
    DecideRequest, DecisionRead, EmbedOutcome, EmbedRequest, Event, FinishReason, GenerateRequest, Pooling, ReadResult,
    ReadTree, RequestId, Retain, StopMatch, TreeRow, Usage,
};
pub use sampling::{log_softmax, top_k_of, SamplingParams, TokenLogprob};
pub use scheduler::Admission;
pub use speculation::{
    draft_start, SpecConfig, SpecConfigError, SpecMethod, SpecStats, DEFAULT_DRAFT_P_MIN, DEFAULT_DRAFT_WINDOW,
    DEFAULT_TREE_BRANCHES, DRAFT_PROMPT_SHARE, MAX_TREE_BRANCHES,
};
pub use tier::{SharedConfig, SharedStats, TierConfig, TierStats};
