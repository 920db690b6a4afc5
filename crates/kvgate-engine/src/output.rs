//! The output processor: what becomes of a chunk's logits. For a completion: prompt logprobs, the fork
//! into `n` choices, sampling, stop tokens and strings, detokenization, logprobs, the finish reason; for
//! a decision: the label probabilities of each read, the keep-alive pin, the answer once every read is
//! in. It talks to the scheduler only through its operations (fork, append, finish, pin) and reads
//! everything else from the [`Chunk`] and the request's own state.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use kvgate_model::Tokenizer;
use tokio::sync::mpsc as tmpsc;
use tracing::warn;

use crate::constraint::GuideState;
use crate::handle::Limits;
use crate::metrics::Recorder;
use crate::registry::{SchedError, SeqId};
use crate::request::{DecisionRead, Event, FinishReason, ReadResult, RequestId, StopMatch, Usage};
use crate::sampling::{log_softmax, top_k_of, Sampler, SamplingParams, TokenLogprob};
use crate::scheduler::{Chunk, Logits, Scheduler};
use crate::text::TextState;

/// Tokens of the prompt's tail the detokenizer starts from.
const DECODE_CONTEXT: usize = 6;

/// One choice of a completion.
struct Choice {
    index: usize,
    sampler: Sampler,
    text: TextState,
    guide: Option<GuideState>,
}

impl Choice {
    fn new(index: usize, p: &SamplingParams, prompt: &[u32]) -> Choice {
        let tail = &prompt[prompt.len().saturating_sub(DECODE_CONTEXT)..];
        Choice {
            index,
            sampler: Sampler::new(p, prompt, index),
            text: TextState::new(
                tail,
                p.stop.clone(),
                p.include_stop_str_in_output,
                p.skip_special_tokens,
            ),
            guide: p.guide.as_ref().map(GuideState::new),
        }
    }

    /// A forked choice: same constraint state and prepared mask as `parent`, its own sampler.
    fn forked(index: usize, p: &SamplingParams, prompt: &[u32], parent: &Choice) -> Choice {
        let mut c = Choice::new(index, p, prompt);
        c.guide = parent.guide.as_ref().map(GuideState::fork);
        c
    }
}

/// A completion's output state.
pub(crate) struct GenState {
    tx: tmpsc::UnboundedSender<Event>,
    params: SamplingParams,
    prompt: Vec<u32>,
    choices: HashMap<SeqId, Choice>,
    forked: bool,
    remaining: usize,
    completion_tokens: usize,
    prompt_lps: Vec<Option<TokenLogprob>>,
    last_token: Option<Instant>,
}

/// A decision's output state.
pub(crate) struct DecState {
    tx: tmpsc::UnboundedSender<Event>,
    reads: Vec<DecisionRead>,
    results: Vec<Option<ReadResult>>,
    keep_alive: Option<Duration>,
    tenant: Option<u32>,
    shared_len: usize,
    pinned: bool,
}

impl DecState {
    /// Read `qi`.
    pub(crate) fn read(&self, qi: usize) -> Option<&DecisionRead> {
        self.reads.get(qi)
    }
}

/// What a request is.
pub(crate) enum Kind {
    Gen(Box<GenState>),
    Dec(Box<DecState>),
}

/// A request with live state in the engine.
pub(crate) struct Active {
    pub(crate) id: RequestId,
    pub(crate) kind: Kind,
    pub(crate) arrival: Instant,
    pub(crate) admitted: Option<Instant>,
    pub(crate) cached_tokens: usize,
    pub(crate) computed_tokens: usize,
}

impl Active {
    /// A completion of `prompt` (its first sequence is `seq`).
    pub(crate) fn generate(
        id: RequestId,
        seq: SeqId,
        prompt: Vec<u32>,
        params: SamplingParams,
        tx: tmpsc::UnboundedSender<Event>,
    ) -> Active {
        let n = params.n.max(1);
        let mut choices = HashMap::new();
        choices.insert(seq, Choice::new(0, &params, &prompt));
        let prompt_lps = vec![
            None;
            if params.prompt_logprobs.is_some() {
                prompt.len()
            } else {
                0
            }
        ];
        Active::new(
            id,
            Kind::Gen(Box::new(GenState {
                tx,
                choices,
                forked: n == 1,
                remaining: n,
                completion_tokens: 0,
                prompt_lps,
                last_token: None,
                params,
                prompt,
            })),
        )
    }

    /// A decision over `reads`, whose reads share `shared_len` prompt tokens.
    pub(crate) fn decide(
        id: RequestId,
        reads: Vec<DecisionRead>,
        shared_len: usize,
        keep_alive: Option<Duration>,
        tenant: Option<u32>,
        tx: tmpsc::UnboundedSender<Event>,
    ) -> Active {
        let n = reads.len();
        Active::new(
            id,
            Kind::Dec(Box::new(DecState {
                tx,
                reads,
                results: vec![None; n],
                keep_alive,
                tenant,
                shared_len,
                pinned: false,
            })),
        )
    }

    fn new(id: RequestId, kind: Kind) -> Active {
        Active {
            id,
            kind,
            arrival: Instant::now(),
            admitted: None,
            cached_tokens: 0,
            computed_tokens: 0,
        }
    }

    /// The request's event channel.
    pub(crate) fn tx(&self) -> &tmpsc::UnboundedSender<Event> {
        match &self.kind {
            Kind::Gen(g) => &g.tx,
            Kind::Dec(d) => &d.tx,
        }
    }

    /// Whether it is a completion.
    pub(crate) fn is_generate(&self) -> bool {
        matches!(self.kind, Kind::Gen(_))
    }
}

/// The grammar states of `a`'s choices among `seqs` (the ones that sample after this step's forward
/// pass), for computing their masks alongside it.
pub(crate) fn guides_of<'a>(a: &'a mut Active, seqs: &[SeqId], out: &mut Vec<&'a mut GuideState>) {
    if let Kind::Gen(g) = &mut a.kind {
        for (s, c) in g.choices.iter_mut() {
            if let (true, Some(gd)) = (seqs.contains(s), c.guide.as_mut()) {
                out.push(gd);
            }
        }
    }
}

/// What processing a chunk's logits did to its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The request goes on.
    Continue,
    /// The request is complete (its last event was sent) with this finish reason.
    Done(&'static str),
}

/// What the output processor may use of the engine while it handles a step's logits.
pub(crate) struct StepContext<'a> {
    /// The scheduler (fork, append, finish, pin).
    pub(crate) sched: &'a mut Scheduler,
    /// The metrics.
    pub(crate) rec: &'a Recorder,
    /// The clock value a keep-alive pin of this duration taken now expires at.
    pub(crate) pin_until: &'a dyn Fn(Duration) -> u64,
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
}

/// Turns logits into events.
pub(crate) struct OutputProcessor {
    tok: std::sync::Arc<Tokenizer>,
    eos: Vec<u32>,
    limits: Limits,
}

impl OutputProcessor {
    pub(crate) fn new(tok: std::sync::Arc<Tokenizer>, eos: Vec<u32>, limits: Limits) -> OutputProcessor {
        OutputProcessor { tok, eos, limits }
    }

    /// Processes what chunk `c` got back for request `a`.
    pub(crate) fn on_output(
        &self,
        cx: &mut StepContext,
        a: &mut Active,
        c: &Chunk,
        out: ChunkOut,
    ) -> Result<Outcome, SchedError> {
        let (arrival, computed, cached) = (a.arrival, a.computed_tokens, a.cached_tokens);
        match (&mut a.kind, out) {
            (Kind::Dec(d), ChunkOut::Logprobs(lps)) => self.on_read(cx, d, c, lps, arrival, computed),
            (Kind::Gen(g), ChunkOut::Logits { rows, vocab }) => {
                self.on_generate(cx, g, c, rows, vocab, arrival, cached)
            }
            // the engine asks each kind only for its own output
            _ => Ok(Outcome::Continue),
        }
    }

    /// A read's label probabilities from the log-probs of its aliases (flattened in label order).
    fn on_read(
        &self,
        cx: &mut StepContext,
        d: &mut DecState,
        c: &Chunk,
        lps: &[f32],
        arrival: Instant,
        computed: usize,
    ) -> Result<Outcome, SchedError> {
        let (true, Some(qi)) = (c.at_end, c.read) else {
            return Ok(Outcome::Continue);
        };
        let Some(read) = d.reads.get(qi) else {
            return Ok(Outcome::Continue);
        };
        let mut lps = lps.iter();
        let probs: Vec<f64> = read
            .labels
            .iter()
            .map(|aliases| aliases.iter().zip(&mut lps).map(|(_, &lp)| (lp as f64).exp()).sum())
            .collect();
        let mass = probs.iter().sum();
        d.results[qi] = Some(ReadResult {
            label_probs: probs,
            label_mass: mass,
        });
        if let (Some(k), false) = (d.keep_alive, d.pinned) {
            d.pinned = true;
            cx.sched.pin_prefix(c.seq, d.shared_len, (cx.pin_until)(k), d.tenant)?;
        }
        cx.sched.finish_seq(c.seq)?;
        if !d.results.iter().all(Option::is_some) {
            return Ok(Outcome::Continue);
        }
        let reads: Vec<ReadResult> = d.results.iter_mut().filter_map(Option::take).collect();
        let prompt_tokens: usize = d.reads.iter().map(|r| r.prompt.len()).sum();
        let usage = Usage {
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: prompt_tokens.saturating_sub(computed),
        };
        let _ = d.tx.send(Event::Decision { reads, usage });
        cx.rec.decision_done(arrival, prompt_tokens);
        Ok(Outcome::Done("stop"))
    }

    #[allow(clippy::too_many_arguments)]
    fn on_generate(
        &self,
        cx: &mut StepContext,
        gs: &mut GenState,
        c: &Chunk,
        rows: &[f32],
        vocab: usize,
        arrival: Instant,
        cached_tokens: usize,
    ) -> Result<Outcome, SchedError> {
        if c.logits == Logits::All {
            // Prompt logprobs: row i predicts the token at position start + i + 1.
            let k = gs.params.prompt_logprobs.unwrap_or(0);
            for i in 0..c.len {
                let p = c.start + i + 1;
                let (Some(&t), Some(slot)) = (gs.prompt.get(p), gs.prompt_lps.get_mut(p)) else {
                    break;
                };
                let ls = log_softmax(&rows[i * vocab..(i + 1) * vocab]);
                *slot = Some(TokenLogprob {
                    token: t,
                    logprob: ls[t as usize],
                    top: top_k_of(&ls, k),
                });
            }
        }
        if !c.at_end {
            return Ok(Outcome::Continue);
        }
        let last = &rows[rows.len() - vocab..];
        let mut targets = vec![c.seq];
        if !gs.forked {
            gs.forked = true;
            let n = gs.params.n.max(1);
            let children = cx.sched.fork(c.seq, n - 1)?;
            if let Some(parent) = gs.choices.get_mut(&c.seq) {
                if let Some(g) = parent.guide.as_mut() {
                    cx.rec.grammar_mask(g.prepare());
                }
            }
            let forks: Vec<Choice> = match gs.choices.get(&c.seq) {
                Some(parent) => (0..children.len())
                    .map(|i| Choice::forked(i + 1, &gs.params, &gs.prompt, parent))
                    .collect(),
                None => vec![],
            };
            for (ch, choice) in children.iter().zip(forks) {
                gs.choices.insert(*ch, choice);
            }
            targets.extend(children);
        }
        if !gs.prompt_lps.is_empty() {
            let lps = std::mem::take(&mut gs.prompt_lps);
            let _ = gs.tx.send(Event::PromptLogprobs(lps));
        }
        let now = Instant::now();
        cx.rec.token_timing(arrival, gs.last_token, now);
        gs.last_token = Some(now);
        let mut stop_ids: Vec<u32> = gs.params.stop_token_ids.clone();
        if !gs.params.ignore_eos {
            stop_ids.extend(&self.eos);
        }
        let mut ended = vec![];
        for t in targets {
            let Some(ch) = gs.choices.get_mut(&t) else { continue };
            let mask = match ch.guide.as_mut() {
                Some(g) => {
                    cx.rec.grammar_mask(g.prepare());
                    match g.mask.take() {
                        Some(Ok(m)) => Some(m),
                        Some(Err(e)) => {
                            // The grammar cannot go on (an internal llguidance error): the choice
                            // ends here rather than produce text the grammar does not allow.
                            warn!(error = %e, "grammar mask failed; ending the choice");
                            let tail = ch.text.finish(&self.tok);
                            let _ = gs.tx.send(Event::Finished {
                                choice: ch.index,
                                reason: FinishReason::Stop,
                                text: tail,
                                stop: None,
                            });
                            ended.push((t, FinishReason::Stop));
                            continue;
                        }
                        None => None,
                    }
                }
                None => None,
            };
            let (tok, lp) = ch.sampler.sample(last, &gs.params, &stop_ids, mask.as_ref());
            cx.sched.append_token(t, tok)?;
            gs.completion_tokens += 1;
            cx.rec.generated_token();
            let mut finish = self.emit(gs, t, tok, lp);
            if finish.is_none() {
                finish = self.follow_grammar(cx, gs, t, tok)?;
            }
            if let Some((reason, stop)) = finish {
                let Some(ch) = gs.choices.get_mut(&t) else { continue };
                let tail = if matches!(stop, Some(StopMatch::Text(_))) {
                    String::new()
                } else {
                    ch.text.finish(&self.tok)
                };
                let _ = gs.tx.send(Event::Finished {
                    choice: ch.index,
                    reason,
                    text: tail,
                    stop,
                });
                ended.push((t, reason));
            }
        }
        let mut last_reason = None;
        for (t, reason) in ended {
            gs.choices.remove(&t);
            gs.remaining -= 1;
            cx.sched.finish_seq(t)?;
            last_reason = Some(reason);
        }
        if gs.remaining > 0 {
            return Ok(Outcome::Continue);
        }
        let usage = Usage {
            prompt_tokens: gs.prompt.len(),
            completion_tokens: gs.completion_tokens,
            cached_tokens,
        };
        let _ = gs.tx.send(Event::Done(usage));
        cx.rec.request_done(arrival, gs.prompt.len());
        Ok(Outcome::Done(last_reason.map_or("stop", FinishReason::as_str)))
    }

    /// Detokenizes one output token of choice `t`, sends its event, and says whether it ends the
    /// choice (a stop token, a stop string, `max_tokens` or the context length).
    fn emit(
        &self,
        gs: &mut GenState,
        t: SeqId,
        tok: u32,
        lp: Option<TokenLogprob>,
    ) -> Option<(FinishReason, Option<StopMatch>)> {
        let ch = gs.choices.get_mut(&t)?;
        let mut text = String::new();
        let mut finish = self.stop_token_finish(tok, &gs.params);
        if finish.is_none() {
            let d = ch.text.push(&self.tok, tok);
            text = d.text;
            finish = d.stopped_by.map(|s| (FinishReason::Stop, Some(StopMatch::Text(s))));
        }
        let len = gs.prompt.len() + ch.sampler.generated();
        if finish.is_none() && (ch.sampler.generated() >= gs.params.max_tokens || !self.limits.fits(len + 1)) {
            finish = Some((FinishReason::Length, None));
        }
        let _ = gs.tx.send(Event::Token {
            choice: ch.index,
            token: tok,
            text,
            logprob: lp,
        });
        finish
    }

    /// Feeds a sampled token to choice `t`'s grammar: a complete grammar ends the choice (`stop`);
    /// tokens it forces next are appended and emitted without sampling (not when logprobs are asked:
    /// those are sampled under a one-token mask so each has its raw logprob).
    fn follow_grammar(
        &self,
        cx: &mut StepContext,
        gs: &mut GenState,
        t: SeqId,
        tok: u32,
    ) -> Result<Option<(FinishReason, Option<StopMatch>)>, SchedError> {
        let ff_ok = gs.params.logprobs.is_none();
        let Some(g) = gs.choices.get_mut(&t).and_then(|c| c.guide.as_mut()) else {
            return Ok(None);
        };
        let forced = match g.constraint.commit(tok, ff_ok) {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, token = tok, "grammar rejected a sampled token; ending the choice");
                return Ok(Some((FinishReason::Stop, None)));
            }
        };
        for f in forced {
            cx.sched.append_token(t, f)?;
            if let Some(ch) = gs.choices.get_mut(&t) {
                ch.sampler.note_forced(f);
            }
            gs.completion_tokens += 1;
            cx.rec.generated_token();
            cx.rec.forced_token();
            if let Some(end) = self.emit(gs, t, f, None) {
                return Ok(Some(end));
            }
        }
        let stopped = gs
            .choices
            .get(&t)
            .and_then(|c| c.guide.as_ref())
            .is_some_and(|g| g.constraint.is_stopped());
        Ok(stopped.then_some((FinishReason::Stop, None)))
    }

    /// The finish a sampled token causes by itself (EOS or a stop token id).
    fn stop_token_finish(&self, tok: u32, p: &SamplingParams) -> Option<(FinishReason, Option<StopMatch>)> {
        let is_eos = !p.ignore_eos && self.eos.contains(&tok);
        let is_stop_id = p.stop_token_ids.contains(&tok);
        if !(is_eos || is_stop_id) {
            return None;
        }
        let stop = (is_stop_id && !is_eos).then_some(StopMatch::Token(tok));
        Some((FinishReason::Stop, stop))
    }
}
