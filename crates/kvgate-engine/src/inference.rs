//! The seam between the engine and its callers (the HTTP layer, the decision service): the one trait
//! they talk to, and the types on it — the [`Limits`] submissions are checked against, a completion's
//! [`RequestStream`], the one-shot [`Pending`] result of a decision or an embedding. The real engine ([`EngineHandle`]) implements it; tests put the tiny in-memory model
//! or a scripted fake behind it. A completion is a stream of events; a decision and an embedding are
//! one result each.

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::error::EngineError;
use crate::request::{DecideRequest, EmbedOutcome, EmbedRequest, Event, GenerateRequest, ReadResult, RequestId, Usage};

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

    /// Releases the states retained for `owner` ([`crate::Retain::owner`]) before their window ends:
    /// their blocks stay cached, now evictable. Nothing by default (a seam with no retention).
    fn release_retained(&self, _owner: u64) {}
}

/// What a decision's reads found.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionOutcome {
    /// One result per read, in read order.
    pub reads: Vec<ReadResult>,
    /// Prompt tokens over all reads, cached ones, no output tokens.
    pub usage: Usage,
    /// Tokens of the longest breakpoint prefix this request computed itself (not found in the
    /// cache) and pinned: what it wrote to the prompt cache.
    pub written_tokens: usize,
}

/// A submitted request with one result to wait for (a decision, an embedding). Dropping it before
/// the result aborts the request in the engine (its blocks are freed at the next step).
#[derive(Debug)]
pub struct Pending<T>(oneshot::Receiver<Result<T, EngineError>>);

/// The sending half of a [`Pending`] result.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

impl<T> From<oneshot::Receiver<Result<T, EngineError>>> for Pending<T> {
    /// A result that arrives on `rx` (engines other than this crate's, such as the scripted fakes of
    /// HTTP tests, make one from their own channel).
    fn from(rx: oneshot::Receiver<Result<T, EngineError>>) -> Pending<T> {
        Pending(rx)
    }
}

impl<T> Pending<T> {
    /// Waits for the result (the engine going away without one is [`EngineError::EngineDead`]).
    pub async fn outcome(self) -> Result<T, EngineError> {
        self.0.await.unwrap_or(Err(EngineError::EngineDead))
    }
}

/// A submitted decision.
pub type PendingDecision = Pending<DecisionOutcome>;

/// A submitted embedding.
pub type PendingEmbedding = Pending<EmbedOutcome>;

/// Limits the handle enforces at submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Prompt + output tokens per sequence.
    pub max_model_len: usize,
    /// Waiting requests before 429.
    pub max_queue: usize,
    /// KV blocks in the pool.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Vocabulary size (token ids must be below it).
    pub vocab_size: usize,
    /// The model's hidden size (the length of an embedding).
    pub hidden_size: usize,
    /// Blocks one sequence holds at most when every layer's attention is windowed (the window plus a
    /// step's chunk; slid-out blocks are given back), `None` when a sequence keeps all its blocks.
    pub window_blocks: Option<usize>,
    /// Whether the backend computes tree rows (a decision read's [`crate::ReadTree`]).
    pub tree_attention: bool,
}

impl Limits {
    /// The one context rule: a sequence holds at most `max_model_len` tokens (prompt and output).
    pub fn fits(&self, tokens: usize) -> bool {
        tokens <= self.max_model_len
    }

    /// Output tokens a completion of `prompt_tokens` may still generate (at least one, or the prompt is
    /// too long).
    pub fn room_after(&self, prompt_tokens: usize) -> Result<usize, EngineError> {
        if !self.fits(prompt_tokens + 1) {
            return Err(EngineError::PromptTooLong {
                prompt_tokens,
                max_model_len: self.max_model_len,
            });
        }
        Ok(self.max_model_len - prompt_tokens)
    }

    /// Checks a decision read's prompt (a read computes its prompt and nothing more).
    pub fn check_read(&self, prompt_tokens: usize) -> Result<(), EngineError> {
        if !self.fits(prompt_tokens) {
            return Err(EngineError::PromptTooLong {
                prompt_tokens,
                max_model_len: self.max_model_len,
            });
        }
        Ok(())
    }
}

/// The events of one request. Dropping it before the request ends aborts the request in the engine
/// (its blocks are freed at the next step).
pub struct RequestStream {
    id: RequestId,
    rx: tmpsc::UnboundedReceiver<Event>,
    /// What aborts the request in its engine (called once, on a drop before the request ended).
    abort: Option<Box<dyn FnOnce() + Send + Sync>>,
    ended: bool,
}

impl std::fmt::Debug for RequestStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestStream")
            .field("id", &self.id)
            .field("ended", &self.ended)
            .finish()
    }
}

impl RequestStream {
    /// A stream fed by `rx` and attached to no engine (for engines other than this crate's, such as the
    /// scripted fakes of HTTP tests): dropping it only closes the channel.
    pub fn detached(id: RequestId, rx: tmpsc::UnboundedReceiver<Event>) -> RequestStream {
        RequestStream {
            id,
            rx,
            abort: None,
            ended: false,
        }
    }

    /// A stream fed by `rx` whose drop before the request ends calls `abort` (the engine's handle
    /// sends its thread an abort).
    pub(crate) fn attached(
        id: RequestId,
        rx: tmpsc::UnboundedReceiver<Event>,
        abort: Box<dyn FnOnce() + Send + Sync>,
    ) -> RequestStream {
        RequestStream {
            id,
            rx,
            abort: Some(abort),
            ended: false,
        }
    }

    /// The request id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event; `None` once the engine dropped the request (after its last event).
    pub async fn next(&mut self) -> Option<Event> {
        let e = self.rx.recv().await;
        match &e {
            Some(Event::Done(_)) | Some(Event::Error(_)) | None => self.ended = true,
            _ => {}
        }
        if e.is_none() {
            return Some(Event::Error(EngineError::EngineDead));
        }
        e
    }

    /// The next event without waiting (tests).
    pub fn try_next(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if let (false, Some(abort)) = (self.ended, self.abort.take()) {
            abort();
        }
    }
}
