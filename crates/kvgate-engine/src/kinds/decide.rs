//! A decision as a request kind: reads forked from a shared prefix, each asking, at its last row, for
//! the log-probs of its labels' alias ids only; their probabilities summed per label; the shared
//! prefix pinned for `keep_alive` (else retained for the session window), and each prompt-cache
//! breakpoint's prefix pinned for its own lifetime; one result sent once every read is in — a one-shot
//! reply, not an event stream.

use std::time::Duration;

use super::{AdmitEnv, ChunkOut, Outcome, Progress, RequestKind, StepContext};
use crate::batch::ChunkWant;
use crate::error::EngineError;
use crate::inference::DecisionOutcome;
use crate::layout::PinKind;
use crate::registry::{GroupId, SchedError};
use crate::request::{DecideRequest, DecisionRead, ReadResult, Usage};
use crate::scheduler::{Chunk, Logits, Scheduler};

/// Where a decision's one result goes.
pub(crate) type Reply = crate::inference::Reply<DecisionOutcome>;

/// A decision's state.
struct DecState {
    reply: Option<Reply>,
    reads: Vec<DecisionRead>,
    results: Vec<Option<ReadResult>>,
    /// How the shared prefix is pinned after the first read: `keep_alive`, else session retention.
    pin: Option<(Duration, PinKind)>,
    tenant: Option<u32>,
    shared_len: usize,
    /// Breakpoints: tokens of the first read's prefix to pin, and for how long.
    breakpoints: Vec<(usize, Duration)>,
    /// Tokens per block (a pin holds whole blocks).
    block_size: usize,
    pinned: bool,
}

/// Queues a decision in the scheduler (its blocks keyed by `salt`) and returns its group and state.
/// Without a `keep_alive` its state is retained for `session_window` (when set) for the follow-up.
pub(crate) fn admit(
    sched: &mut Scheduler,
    req: DecideRequest,
    env: &AdmitEnv,
    reply: Reply,
) -> (GroupId, Box<dyn RequestKind>) {
    env.rec.decision_request();
    let session_window = env.session_window;
    let prompts: Vec<Vec<u32>> = req.reads.iter().map(|r| r.prompt.clone()).collect();
    let plain = req
        .reads
        .iter()
        .map(|r| r.tree.as_ref().map_or(usize::MAX, |t| t.start))
        .collect();
    let g = sched.add_decision_reads(prompts, plain, req.cache_salt.as_deref().unwrap_or(""));
    let shared_len = sched.decision_layout(g).map_or(0, |l| l.shared);
    let n = req.reads.len();
    let state = DecState {
        reply: Some(reply),
        reads: req.reads,
        results: vec![None; n],
        pin: match req.keep_alive {
            Some(k) => Some((k, PinKind::KeepAlive)),
            None if req.breakpoints_only => None,
            None => session_window.map(|w| (w, PinKind::Session)),
        },
        tenant: req.tenant,
        shared_len,
        breakpoints: req.breakpoints,
        block_size: sched.config().block_size.max(1),
        pinned: false,
    };
    (g, Box::new(state))
}

impl RequestKind for DecState {
    fn tree(&self, c: &Chunk) -> Option<&crate::request::ReadTree> {
        c.read.and_then(|qi| self.reads.get(qi)).and_then(|r| r.tree.as_ref())
    }

    fn want(&self, c: &Chunk) -> ChunkWant {
        if !c.at_end || c.logits == Logits::None {
            return ChunkWant::Nothing;
        }
        match c.read.and_then(|qi| self.reads.get(qi)) {
            Some(r) => ChunkWant::Logprobs(r.labels.iter().flatten().copied().collect()),
            None => ChunkWant::Nothing,
        }
    }

    /// A read's label probabilities from the log-probs of its aliases (flattened in label order).
    fn on_output(
        &mut self,
        cx: &mut StepContext,
        progress: Progress,
        c: &Chunk,
        out: ChunkOut,
    ) -> Result<Outcome, SchedError> {
        let (ChunkOut::Logprobs(lps), true, Some(qi)) = (out, c.at_end, c.read) else {
            return Ok(Outcome::Continue);
        };
        let Some(read) = self.reads.get(qi) else {
            return Ok(Outcome::Continue);
        };
        let mut lps = lps.iter();
        let probs: Vec<f64> = read
            .labels
            .iter()
            .map(|aliases| aliases.iter().zip(&mut lps).map(|(_, &lp)| (lp as f64).exp()).sum())
            .collect();
        let mass = probs.iter().sum();
        self.results[qi] = Some(ReadResult {
            label_probs: probs,
            label_mass: mass,
        });
        if !self.pinned {
            self.pinned = true;
            if let Some((k, kind)) = self.pin {
                cx.update
                    .pin(c.seq, self.shared_len, (cx.pin_until)(k), self.tenant, kind);
            }
            // A breakpoint inside the shared prefix is a prefix of every read, so of this one.
            for &(tokens, ttl) in &self.breakpoints {
                cx.update.pin(
                    c.seq,
                    tokens.min(self.shared_len),
                    (cx.pin_until)(ttl),
                    self.tenant,
                    PinKind::KeepAlive,
                );
            }
        }
        cx.update.finish(c.seq);
        if !self.results.iter().all(Option::is_some) {
            return Ok(Outcome::Continue);
        }
        let reads: Vec<ReadResult> = self.results.iter_mut().filter_map(Option::take).collect();
        let prompt_tokens: usize = self.reads.iter().map(|r| r.prompt.len()).sum();
        let usage = Usage {
            cache_write_tokens: 0,
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: prompt_tokens.saturating_sub(progress.computed_tokens),
        };
        // The shared prefix found in the cache: what was computed, less the reads' own suffixes.
        let suffixes: usize = self
            .reads
            .iter()
            .map(|r| r.prompt.len().saturating_sub(self.shared_len))
            .sum();
        let hit = self
            .shared_len
            .saturating_sub(progress.computed_tokens.saturating_sub(suffixes));
        let longest = self.breakpoints.iter().map(|b| b.0.min(self.shared_len)).max();
        let whole = |t: usize| t / self.block_size * self.block_size;
        let written_tokens = longest.map_or(0, |b| whole(b).saturating_sub(hit));
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Ok(DecisionOutcome {
                reads,
                usage,
                written_tokens,
            }));
        }
        cx.rec.decision_done(progress.arrival, prompt_tokens);
        Ok(Outcome::Done("stop"))
    }

    fn fail(&mut self, e: EngineError) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Err(e));
        }
    }

    fn is_abandoned(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_closed())
    }
}
