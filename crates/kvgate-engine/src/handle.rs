//! The handle through which the rest of the process talks to the engine thread: submit a request (the
//! limits are checked here, synchronously, so a bad request is refused before it queues), read its
//! events, abort it (dropping the stream aborts it), ask for statistics, check liveness.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use tokio::sync::{mpsc as tmpsc, oneshot};

use crate::error::EngineError;
use crate::inference::{Inference, Limits, PendingDecision, PendingEmbedding, RequestStream};
use crate::kinds::{decide, embed, generate, Admit};
use crate::kv_manager::{blocks_for_choices, blocks_for_reads};
use crate::layout::DecisionLayout;
use crate::request::{DecideRequest, EmbedRequest, Event, GenerateRequest, RequestId};

/// A snapshot of the engine's state, for tests and `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Pool counts.
    pub pool: crate::block_pool::PoolCounts,
    /// Running requests.
    pub running: usize,
    /// Waiting requests.
    pub waiting: usize,
    /// Prefix-cache queries (tokens).
    pub prefix_queries: u64,
    /// Prefix-cache hits (tokens).
    pub prefix_hits: u64,
    /// Preemptions so far.
    pub preemptions: u64,
    /// Requests with live state in the engine.
    pub active_requests: usize,
    /// Blocks pinned by keep_alive.
    pub pins: usize,
    /// Pins released before their deadline (the cap, or blocks needed for real work).
    pub pins_released_early: u64,
    /// The second tier's counters (`None`: no tier). Asking waits for the spill file's writer.
    pub tier: Option<crate::tier::TierStats>,
    /// The shared store's counters (`None`: no shared store).
    pub shared: Option<crate::tier::SharedStats>,
    /// Speculation's counters (zero without it).
    pub spec: crate::speculation::SpecStats,
    /// What the draft model computed (`None` without one).
    pub draft: Option<crate::draft::DraftStats>,
}

/// What the handle sends the engine thread. Every request kind comes as an [`Admit`] built by its
/// handle method below (its registration).
pub(crate) enum Command {
    /// A request of any kind: its admission (see [`Admit`]).
    Admit(RequestId, Admit),
    Abort(RequestId),
    Stats(oneshot::Sender<EngineStats>),
    /// Releases the retained states an owner holds (its connection closed).
    ReleaseOwned(u64),
    /// Test hook: the next step panics (checks that a panic fails requests instead of the process).
    InjectPanic,
    /// Fail everything in flight and stop the engine thread.
    Shutdown,
}

pub(crate) struct Shared {
    pub queued: AtomicUsize,
    pub alive: AtomicBool,
    pub next_id: AtomicU64,
    pub limits: Limits,
}

/// A cloneable handle to the engine thread.
#[derive(Clone)]
pub struct EngineHandle {
    tx: mpsc::Sender<Command>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHandle")
            .field("limits", &self.shared.limits)
            .finish()
    }
}

impl EngineHandle {
    pub(crate) fn new(tx: mpsc::Sender<Command>, shared: Arc<Shared>) -> EngineHandle {
        EngineHandle { tx, shared }
    }

    /// The limits.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// Whether the engine thread is running.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Requests submitted and not yet admitted.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    fn check_tokens(&self, prompt: &[u32]) -> Result<(), EngineError> {
        let l = self.shared.limits;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if let Some(&id) = prompt.iter().find(|&&t| t as usize >= l.vocab_size) {
            return Err(EngineError::InvalidToken {
                id,
                vocab: l.vocab_size,
            });
        }
        Ok(())
    }

    fn enqueue(&self) -> Result<RequestId, EngineError> {
        let l = self.shared.limits;
        if !self.is_alive() {
            return Err(EngineError::EngineDead);
        }
        let prev = self.shared.queued.fetch_add(1, Ordering::SeqCst);
        if prev >= l.max_queue {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            return Err(EngineError::QueueFull { max_queue: l.max_queue });
        }
        Ok(self.shared.next_id.fetch_add(1, Ordering::SeqCst))
    }

    fn send(&self, cmd: Command) -> Result<(), EngineError> {
        self.tx.send(cmd).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            EngineError::EngineDead
        })
    }

    /// Submits a completion. `params.max_tokens` must already be resolved (the server fills "until the
    /// context ends" in).
    pub fn generate(&self, req: GenerateRequest) -> Result<RequestStream, EngineError> {
        let l = self.shared.limits;
        self.check_tokens(&req.prompt)?;
        let p = &req.params;
        l.room_after(req.prompt.len())?;
        if !l.fits(req.prompt.len() + p.max_tokens) {
            return Err(EngineError::TooManyTokens {
                prompt_tokens: req.prompt.len(),
                max_tokens: p.max_tokens,
                max_model_len: l.max_model_len,
            });
        }
        let mut needed = blocks_for_choices(l.block_size, req.prompt.len(), p.n, req.prompt.len() + p.max_tokens);
        if let Some(per_seq) = l.window_blocks {
            // each choice holds at most its window (+1 for a copy-on-write), however long it runs
            needed = needed.min(p.n.max(1) * (per_seq + 1));
        }
        if needed > l.num_blocks {
            return Err(EngineError::DoesNotFit {
                needed,
                available: l.num_blocks,
            });
        }
        self.submit(|id, tx| Command::Admit(id, Box::new(move |s, env| generate::admit(s, env, req, tx))))
    }

    /// Takes a queue slot, sends the command, returns the request's stream.
    fn submit(
        &self,
        cmd: impl FnOnce(RequestId, tmpsc::UnboundedSender<Event>) -> Command,
    ) -> Result<RequestStream, EngineError> {
        let id = self.enqueue()?;
        let (tx, rx) = tmpsc::unbounded_channel();
        self.send(cmd(id, tx))?;
        let engine = self.tx.clone();
        let abort = Box::new(move || {
            let _ = engine.send(Command::Abort(id));
        });
        Ok(RequestStream::attached(id, rx, abort))
    }

    /// Submits a decision: one result to wait for.
    pub fn decide(&self, req: DecideRequest) -> Result<PendingDecision, EngineError> {
        let l = self.shared.limits;
        if req.reads.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        for r in &req.reads {
            self.check_tokens(&r.prompt)?;
            l.check_read(r.prompt.len())?;
            if let Some(t) = &r.tree {
                if !l.tree_attention {
                    return Err(EngineError::Unsupported(
                        "this backend does not compute tree rows (a set read)".into(),
                    ));
                }
                t.check(r.prompt.len()).map_err(EngineError::Unsupported)?;
            }
        }
        let prompts: Vec<&[u32]> = req.reads.iter().map(|r| r.prompt.as_slice()).collect();
        let plain: Vec<usize> = req
            .reads
            .iter()
            .map(|r| r.tree.as_ref().map_or(usize::MAX, |t| t.start))
            .collect();
        let layout = DecisionLayout::of_reads(&prompts, &plain);
        let lens = prompts.iter().map(|p| p.len());
        let needed = if layout.forks {
            blocks_for_reads(l.block_size, layout.shared, lens)
        } else {
            lens.map(|n| n.div_ceil(l.block_size)).sum()
        };
        if needed > l.num_blocks {
            return Err(EngineError::DoesNotFit {
                needed,
                available: l.num_blocks,
            });
        }
        let id = self.enqueue()?;
        let (tx, rx) = oneshot::channel();
        self.send(Command::Admit(
            id,
            Box::new(move |s, env| decide::admit(s, req, env, tx)),
        ))?;
        Ok(PendingDecision::from(rx))
    }

    /// Submits one embedding input: one result to wait for.
    pub fn embed(&self, req: EmbedRequest) -> Result<PendingEmbedding, EngineError> {
        let l = self.shared.limits;
        self.check_tokens(&req.prompt)?;
        l.check_read(req.prompt.len())?;
        let needed = req.prompt.len().div_ceil(l.block_size);
        if needed > l.num_blocks {
            return Err(EngineError::DoesNotFit {
                needed,
                available: l.num_blocks,
            });
        }
        let id = self.enqueue()?;
        let (tx, rx) = oneshot::channel();
        self.send(Command::Admit(id, Box::new(move |s, _| embed::admit(s, req, tx))))?;
        Ok(PendingEmbedding::from(rx))
    }

    /// A snapshot of the engine's state.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Stats(tx)).map_err(|_| EngineError::EngineDead)?;
        rx.await.map_err(|_| EngineError::EngineDead)
    }

    /// Test hook: makes the engine's next step panic.
    pub fn inject_panic(&self) {
        let _ = self.tx.send(Command::InjectPanic);
    }

    /// Stops the engine thread: requests in flight fail, later submissions get `EngineDead`.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }

    /// Releases the retained states `owner` holds (their blocks stay cached, now evictable).
    pub fn release_retained(&self, owner: u64) {
        let _ = self.tx.send(Command::ReleaseOwned(owner));
    }
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

    fn release_retained(&self, owner: u64) {
        EngineHandle::release_retained(self, owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_context_rule() {
        let l = Limits {
            max_model_len: 10,
            max_queue: 1,
            num_blocks: 4,
            block_size: 4,
            vocab_size: 100,
            hidden_size: 8,
            window_blocks: None,
            tree_attention: false,
        };
        assert!(l.fits(10) && !l.fits(11));
        // a completion needs room for one output token; a decision read only for its prompt
        assert_eq!(l.room_after(9), Ok(1));
        assert!(matches!(
            l.room_after(10),
            Err(EngineError::PromptTooLong { prompt_tokens: 10, .. })
        ));
        assert_eq!(l.check_read(10), Ok(()));
        assert!(l.check_read(11).is_err());
    }
}
