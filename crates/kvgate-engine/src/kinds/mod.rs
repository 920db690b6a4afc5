//! The request kinds the engine runs, behind one trait. A kind owns its request's output state and
//! decides, per step, what its chunks need back from the backend ([`ChunkWant`]) and what their
//! outputs do: a completion ([`generate`]) samples, detokenizes, stops and streams [`Event`]s; a
//! decision ([`decide`]) turns its reads' label log-probs into probabilities and answers once; an
//! embedding ([`embed`]) pools final hidden states and answers once. What an
//! output does to the sequences (tokens appended, a prefix pinned, a sequence finished) is recorded in
//! the step's [`StepUpdate`], which the scheduler applies in one call.
//!
//! A new request kind is one file here implementing [`RequestKind`] (plus an `admit` that queues it in
//! the scheduler) and its registration: its `mod` line here and the handle method that sends
//! [`Command::Admit`](crate::handle::Command) with its [`Admit`]; the engine loop needs no change.
//!
//! [`Event`]: crate::request::Event

pub(crate) mod decide;
pub(crate) mod embed;
pub(crate) mod generate;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate_model::Tokenizer;

use crate::batch::ChunkWant;
use crate::constraint::GuideState;
use crate::error::EngineError;
use crate::inference::Limits;
use crate::metrics::Recorder;
use crate::registry::{GroupId, SchedError, SeqId};
use crate::request::RequestId;
use crate::scheduler::{Chunk, Scheduler, StepUpdate};

/// What admitting a request may read of the engine besides the scheduler it queues in.
pub(crate) struct AdmitEnv<'a> {
    /// The backend's fast path, when it has one (its blocks are keyed apart).
    pub(crate) fast_path: Option<&'static str>,
    /// Session retention's window (`None`: off).
    pub(crate) session_window: Option<Duration>,
    /// The metrics.
    pub(crate) rec: &'a Recorder,
}

/// A request's admission, as its handle method sends it to the engine thread: queue it in the
/// scheduler and give back its group and its kind's state. The engine loop runs every kind's the same
/// way, so a new kind edits no engine file but its own and its registration.
pub(crate) type Admit = Box<dyn FnOnce(&mut Scheduler, &AdmitEnv) -> (GroupId, Box<dyn RequestKind>) + Send>;

/// One kind of engine request: its output state and what its chunks' outputs do.
pub(crate) trait RequestKind: Send {
    /// What chunk `c` (one of this request's) needs back from the forward pass.
    fn want(&self, c: &Chunk) -> ChunkWant;

    /// The tree chunk `c`'s rows are part of, if any (a decision's `set` read).
    fn tree(&self, _c: &Chunk) -> Option<&crate::request::ReadTree> {
        None
    }

    /// Whether its rows may take the backend's fast path (completions; decisions never).
    fn may_be_fast(&self) -> bool {
        false
    }

    /// Whether its admission counts the tokens a decision warmed for it (completions).
    fn counts_warmed(&self) -> bool {
        false
    }

    /// Its prompt's length when it carries a session hint (a turn of a session whose next turn is
    /// expected).
    fn session_prompt(&self) -> Option<usize> {
        None
    }

    /// The grammar states of its sequences among `seqs` (those that sample after this step's forward
    /// pass), for computing their masks alongside it.
    fn guides<'a>(&'a mut self, _seqs: &[SeqId], _out: &mut Vec<&'a mut GuideState>) {}

    /// Processes what chunk `c` got back.
    fn on_output(
        &mut self,
        cx: &mut StepContext,
        progress: Progress,
        c: &Chunk,
        out: ChunkOut,
    ) -> Result<Outcome, SchedError>;

    /// Tells the caller the request failed (its last message).
    fn fail(&mut self, e: EngineError);

    /// Whether the caller went away (its stream or pending result was dropped).
    fn is_abandoned(&self) -> bool;
}

/// A request with live state in the engine.
pub(crate) struct Active {
    pub(crate) id: RequestId,
    pub(crate) kind: Box<dyn RequestKind>,
    pub(crate) arrival: Instant,
    pub(crate) admitted: Option<Instant>,
    pub(crate) cached_tokens: usize,
    pub(crate) computed_tokens: usize,
}

impl Active {
    /// A request of `kind` arriving now.
    pub(crate) fn new(id: RequestId, kind: Box<dyn RequestKind>) -> Active {
        Active {
            id,
            kind,
            arrival: Instant::now(),
            admitted: None,
            cached_tokens: 0,
            computed_tokens: 0,
        }
    }

    /// The engine's accounting of it, as the kinds read it.
    pub(crate) fn progress(&self) -> Progress {
        Progress {
            arrival: self.arrival,
            computed_tokens: self.computed_tokens,
            cached_tokens: self.cached_tokens,
        }
    }
}

/// The engine's accounting of a request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Progress {
    /// When it arrived.
    pub(crate) arrival: Instant,
    /// Tokens computed for it so far.
    pub(crate) computed_tokens: usize,
    /// Prompt tokens served from the prefix cache at admission.
    pub(crate) cached_tokens: usize,
}

/// What processing a chunk's output did to its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The request goes on.
    Continue,
    /// The request is complete (its last message was sent) with this finish reason.
    Done(&'static str),
}

/// What one chunk got back from the forward pass.
#[derive(Clone, Copy)]
pub(crate) enum ChunkOut<'a> {
    /// Logits rows of `vocab` values each (the last one predicts the next token).
    Logits {
        /// The rows.
        rows: &'a [f32],
        /// Their width.
        vocab: usize,
    },
    /// The log-probs of a read's label aliases, flattened in label order.
    Logprobs(&'a [f32]),
    /// Final hidden rows of `width` values each (embeddings), in row order.
    Hidden {
        /// The rows.
        rows: &'a [f32],
        /// Their width.
        width: usize,
    },
}

/// What every request kind reads while it processes outputs: the tokenizer, the EOS ids, the limits.
pub(crate) struct OutputEnv {
    pub(crate) tok: Arc<Tokenizer>,
    pub(crate) eos: Vec<u32>,
    pub(crate) limits: Limits,
    /// Whether the engine speculates (`--speculative-config`): only then do completions tell the
    /// scheduler how many tokens each choice may propose.
    pub(crate) speculates: bool,
}

/// The one thing a request kind may do to the scheduler itself while it handles outputs: fork a
/// sequence into `n` more that share its blocks (a completion's `n` choices, at its first sample).
/// Everything else it does to sequences is recorded in the step's [`StepUpdate`].
pub(crate) trait Fork {
    /// Forks `n` new sequences off `seq`.
    fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>, SchedError>;
}

impl Fork for Scheduler {
    fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>, SchedError> {
        Scheduler::fork(self, seq, n)
    }
}

/// What a request kind may do to the engine while it handles a step's outputs: fork a sequence (at a
/// completion's first sample), record sequence changes in the step's update, read the metrics, the
/// clock and the output environment. It never sees the scheduler itself.
pub(crate) struct StepContext<'a> {
    pub(crate) seqs: &'a mut dyn Fork,
    pub(crate) update: &'a mut StepUpdate,
    pub(crate) rec: &'a Recorder,
    pub(crate) env: &'a OutputEnv,
    /// The clock value a keep-alive pin of this duration taken now expires at.
    pub(crate) pin_until: &'a dyn Fn(Duration) -> u64,
}

impl StepContext<'_> {
    /// Forks `n` new sequences off `seq` (sharing its blocks).
    pub(crate) fn fork(&mut self, seq: SeqId, n: usize) -> Result<Vec<SeqId>, SchedError> {
        self.seqs.fork(seq, n)
    }
}
