//! A completion as a request kind: prompt logprobs, the fork into `n` choices, sampling (under a
//! grammar mask for structured outputs and tools), stop tokens and strings, detokenization, logprobs,
//! the finish reason, all streamed as [`Event`]s on the request's channel. The tokens it appends and
//! the choices it ends go into the step's update. A decode chunk with proposed tokens (speculation) is
//! verified row by row through the same sampling, so a choice emits exactly what one token per step
//! would; how many proposals it kept goes into the update too.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tmpsc;
use tracing::warn;

use super::{AdmitEnv, ChunkOut, Outcome, OutputEnv, Progress, RequestKind, StepContext};
use crate::batch::ChunkWant;
use crate::constraint::GuideState;
use crate::error::EngineError;
use crate::layout::PinKind;
use crate::registry::{GroupId, SchedError, SeqId};
use crate::request::{Event, FinishReason, GenerateRequest, Retain, StopMatch, Usage};
use crate::sampling::{log_softmax, Sampler, SamplingParams, TokenLogprob};
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

/// What sampling one row did to a choice.
enum Row {
    /// It goes on, with this token appended (and, when `true`, tokens its grammar forced after it).
    Continue(u32, bool),
    /// It ended (its `Finished` event is sent).
    Ended(FinishReason),
    /// It is not (or no longer) a choice of this completion.
    Gone,
}

/// The choices one chunk's rows left going and those they ended.
#[derive(Default)]
struct Sampled {
    going: Vec<SeqId>,
    ended: Vec<(SeqId, FinishReason)>,
}

/// A completion's output state.
struct GenState {
    tx: tmpsc::UnboundedSender<Event>,
    params: SamplingParams,
    prompt: Vec<u32>,
    choices: HashMap<SeqId, Choice>,
    forked: bool,
    remaining: usize,
    completion_tokens: usize,
    prompt_lps: Vec<Option<TokenLogprob>>,
    last_token: Option<Instant>,
    retain: Option<Retain>,
    /// Prompt-cache breakpoints: prompt prefixes (tokens) to pin, and for how long.
    breakpoints: Vec<(usize, Duration)>,
    /// Tokens per block (a pin holds whole blocks).
    block_size: usize,
}

/// Queues a completion in the scheduler (its blocks keyed by `salt`; on the fast path it also reads the
/// exact path's blocks, keyed by `exact`) and returns its group and state.
pub(crate) fn admit(
    sched: &mut Scheduler,
    env: &AdmitEnv,
    req: GenerateRequest,
    tx: tmpsc::UnboundedSender<Event>,
) -> (GroupId, Box<dyn RequestKind>) {
    // Blocks computed on the backend's fast path are keyed apart: an exact read (a decision) never
    // reads them; a fast completion reads exact blocks first (a decision's warm state) and continues
    // on its own.
    let exact = req.cache_salt.clone().unwrap_or_default();
    let (salt, exact) = match env.fast_path {
        Some(path) => (crate::salts::fast_key(path, &exact), Some(exact)),
        None => (exact, None),
    };
    let all = req.params.prompt_logprobs.is_some();
    let (g, seq) = sched.add_generate(req.prompt.clone(), &salt, all);
    if let Some(exact) = exact.as_deref() {
        // the group was just created: this cannot fail
        let _ = sched.read_exact_blocks(g, exact);
    }
    let mut state = GenState::new(seq, req.prompt, req.params, tx);
    state.retain = req.retain;
    state.breakpoints = req.breakpoints;
    state.block_size = sched.config().block_size.max(1);
    (g, Box::new(state))
}

impl GenState {
    /// A completion of `prompt` (its first sequence is `seq`).
    fn new(seq: SeqId, prompt: Vec<u32>, params: SamplingParams, tx: tmpsc::UnboundedSender<Event>) -> GenState {
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
        GenState {
            tx,
            choices,
            forked: n == 1,
            remaining: n,
            completion_tokens: 0,
            prompt_lps,
            last_token: None,
            params,
            prompt,
            retain: None,
            breakpoints: vec![],
            block_size: 1,
        }
    }

    /// Prompt logprobs, then at the chunk's end: the fork into `n` choices (first sample), one
    /// sampled (or grammar-forced) token per choice — or the verification of a proposal — its event,
    /// and the finishes.
    fn on_logits(
        &mut self,
        cx: &mut StepContext,
        progress: Progress,
        c: &Chunk,
        rows: &[f32],
        vocab: usize,
    ) -> Result<Outcome, SchedError> {
        if c.logits == Logits::All && c.draft == 0 {
            self.prompt_logprobs(c, rows, vocab);
        }
        if !c.at_end {
            return Ok(Outcome::Continue);
        }
        let targets = self.fork_once(cx, c.seq)?;
        if !self.prompt_lps.is_empty() {
            let lps = std::mem::take(&mut self.prompt_lps);
            let _ = self.tx.send(Event::PromptLogprobs(lps));
        }
        let now = Instant::now();
        cx.rec.token_timing(progress.arrival, self.last_token, now);
        self.last_token = Some(now);
        let mut stop_ids: Vec<u32> = self.params.stop_token_ids.clone();
        if !self.params.ignore_eos {
            stop_ids.extend(&cx.env.eos);
        }
        let sampled = if c.draft > 0 {
            self.verify(cx, c, rows, vocab, &stop_ids)
        } else {
            let last = &rows[rows.len() - vocab..];
            self.sample_each(cx, targets, last, &stop_ids)
        };
        if cx.env.speculates {
            for t in sampled.going {
                if let Some(ch) = self.choices.get(&t) {
                    cx.update.spec_limit(t, self.spec_limit(ch));
                }
            }
        }
        let last_reason = self.end_choices(cx, sampled.ended);
        if self.remaining > 0 {
            return Ok(Outcome::Continue);
        }
        self.done(cx, progress);
        Ok(Outcome::Done(last_reason.map_or("stop", FinishReason::as_str)))
    }

    /// Records the prompt logprobs a chunk's rows give: row i predicts the token at position
    /// start + i + 1.
    fn prompt_logprobs(&mut self, c: &Chunk, rows: &[f32], vocab: usize) {
        let k = self.params.prompt_logprobs.unwrap_or(0);
        for i in 0..c.len {
            let p = c.start + i + 1;
            let (Some(&t), Some(slot)) = (self.prompt.get(p), self.prompt_lps.get_mut(p)) else {
                break;
            };
            let ls = log_softmax(&rows[i * vocab..(i + 1) * vocab]);
            *slot = Some(TokenLogprob::of(&ls, t, k));
        }
    }

    /// The choices the prompt's last row is sampled for: `seq` alone, or — the first time — `seq`
    /// and the `n - 1` forks it makes (each with its parent's grammar state).
    fn fork_once(&mut self, cx: &mut StepContext, seq: SeqId) -> Result<Vec<SeqId>, SchedError> {
        let mut targets = vec![seq];
        if self.forked {
            return Ok(targets);
        }
        self.forked = true;
        let children = cx.fork(seq, self.params.n.max(1) - 1)?;
        if let Some(g) = self.choices.get_mut(&seq).and_then(|p| p.guide.as_mut()) {
            cx.rec.grammar_mask(g.prepare());
        }
        let forks: Vec<Choice> = match self.choices.get(&seq) {
            Some(parent) => (0..children.len())
                .map(|i| Choice::forked(i + 1, &self.params, &self.prompt, parent))
                .collect(),
            None => vec![],
        };
        for (ch, choice) in children.iter().zip(forks) {
            self.choices.insert(*ch, choice);
        }
        targets.extend(children);
        Ok(targets)
    }

    /// Speculation: row i verifies proposed token i (`c.tokens[1 + i]`); each row is sampled as a
    /// one-token step would sample it (under the grammar's mask for the tokens emitted so far: only
    /// sampled tokens are ever committed to it), and a proposal is kept while it is what was
    /// sampled. Tokens a grammar forces after a kept one end the verification: the next rows were
    /// computed for the proposal's positions, not theirs.
    ///
    /// A token tree ([`Chunk::tree`]) is walked the same way from its first row: each sampled token
    /// that is a child of the current row moves there, and the path walked is what is kept.
    fn verify(&mut self, cx: &mut StepContext, c: &Chunk, rows: &[f32], vocab: usize, stop_ids: &[u32]) -> Sampled {
        let mut out = Sampled::default();
        let mut path = vec![];
        let mut at = 0;
        while let Some(row) = rows.get(at * vocab..(at + 1) * vocab) {
            match self.sample_choice(cx, c.seq, row, stop_ids) {
                Row::Continue(tok, forced) => match c.next_row(at, tok) {
                    Some(r) => {
                        path.push(r);
                        at = r;
                        if forced {
                            out.going.push(c.seq);
                            break;
                        }
                    }
                    None => {
                        out.going.push(c.seq);
                        break;
                    }
                },
                Row::Ended(reason) => {
                    out.ended.push((c.seq, reason));
                    break;
                }
                Row::Gone => break,
            }
        }
        cx.update.accept_path(c.seq, path);
        out
    }

    /// One token per choice in `targets`, all from the same row.
    fn sample_each(&mut self, cx: &mut StepContext, targets: Vec<SeqId>, row: &[f32], stop_ids: &[u32]) -> Sampled {
        let mut out = Sampled::default();
        for t in targets {
            match self.sample_choice(cx, t, row, stop_ids) {
                Row::Continue(..) => out.going.push(t),
                Row::Ended(reason) => out.ended.push((t, reason)),
                Row::Gone => {}
            }
        }
        out
    }

    /// Ends the choices that finished: the last one's conversation is retained for the next turn
    /// and each breakpoint's prompt prefix pinned for its own lifetime. Returns the last reason.
    fn end_choices(&mut self, cx: &mut StepContext, ended: Vec<(SeqId, FinishReason)>) -> Option<FinishReason> {
        let mut last_reason = None;
        for (t, reason) in ended {
            self.choices.remove(&t);
            self.remaining -= 1;
            if let (0, Some(r)) = (self.remaining, self.retain) {
                let until = (cx.pin_until)(r.window);
                cx.update
                    .pin_owned(t, usize::MAX, until, r.tenant, PinKind::Session, r.owner);
            }
            if self.remaining == 0 {
                let tenant = self.retain.and_then(|r| r.tenant);
                for &(tokens, ttl) in &self.breakpoints {
                    cx.update.pin(
                        t,
                        tokens.min(self.prompt.len()),
                        (cx.pin_until)(ttl),
                        tenant,
                        PinKind::KeepAlive,
                    );
                }
            }
            cx.update.finish(t);
            last_reason = Some(reason);
        }
        last_reason
    }

    /// The completion's usage (`Done`) once every choice ended.
    fn done(&mut self, cx: &mut StepContext, progress: Progress) {
        let longest = self.breakpoints.iter().map(|b| b.0.min(self.prompt.len())).max();
        let whole = |t: usize| t / self.block_size * self.block_size;
        let cached_tokens = progress.cached_tokens;
        let usage = Usage {
            prompt_tokens: self.prompt.len(),
            completion_tokens: self.completion_tokens,
            cached_tokens,
            cache_write_tokens: longest.map_or(0, |b| whole(b).saturating_sub(cached_tokens)),
        };
        let _ = self.tx.send(Event::Done(usage));
        cx.rec.request_done(progress.arrival, self.prompt.len());
    }

    /// Samples choice `t`'s next token from `row` (under its grammar's mask), appends and emits it
    /// (and what its grammar forces after it), and says whether the choice goes on.
    fn sample_choice(&mut self, cx: &mut StepContext, t: SeqId, row: &[f32], stop_ids: &[u32]) -> Row {
        let gs = self;
        let Some(ch) = gs.choices.get_mut(&t) else {
            return Row::Gone;
        };
        let mask = match ch.guide.as_mut() {
            Some(g) => {
                cx.rec.grammar_mask(g.prepare());
                match g.mask.take() {
                    Some(Ok(m)) => Some(m),
                    Some(Err(e)) => {
                        // The grammar cannot go on (an internal llguidance error): the choice
                        // ends here rather than produce text the grammar does not allow.
                        warn!(error = %e, "grammar mask failed; ending the choice");
                        let tail = ch.text.finish(&cx.env.tok);
                        let _ = gs.tx.send(Event::Finished {
                            choice: ch.index,
                            reason: FinishReason::Stop,
                            text: tail,
                            stop: None,
                        });
                        return Row::Ended(FinishReason::Stop);
                    }
                    None => None,
                }
            }
            None => None,
        };
        let (tok, lp) = ch.sampler.sample(row, &gs.params, stop_ids, mask.as_ref());
        cx.update.append(t, tok);
        gs.completion_tokens += 1;
        cx.rec.generated_token();
        let mut finish = gs.emit(cx.env, t, tok, lp);
        let before = gs.completion_tokens;
        if finish.is_none() {
            finish = gs.follow_grammar(cx, t, tok);
        }
        let Some((reason, stop)) = finish else {
            return Row::Continue(tok, gs.completion_tokens > before);
        };
        let Some(ch) = gs.choices.get_mut(&t) else {
            return Row::Gone;
        };
        let tail = if matches!(stop, Some(StopMatch::Text(_))) {
            String::new()
        } else {
            ch.text.finish(&cx.env.tok)
        };
        let _ = gs.tx.send(Event::Finished {
            choice: ch.index,
            reason,
            text: tail,
            stop,
        });
        Row::Ended(reason)
    }

    /// Most tokens choice `ch` may propose for its next step: never more than it may still emit
    /// after the step's first.
    fn spec_limit(&self, ch: &Choice) -> usize {
        self.params.max_tokens.saturating_sub(ch.sampler.generated() + 1)
    }

    /// Detokenizes one output token of choice `t`, sends its event, and says whether it ends the
    /// choice (a stop token, a stop string, `max_tokens` or the context length).
    fn emit(
        &mut self,
        env: &OutputEnv,
        t: SeqId,
        tok: u32,
        lp: Option<TokenLogprob>,
    ) -> Option<(FinishReason, Option<StopMatch>)> {
        let gs = self;
        let ch = gs.choices.get_mut(&t)?;
        let mut text = String::new();
        let mut finish = stop_token_finish(&env.eos, tok, &gs.params);
        if finish.is_none() {
            let d = ch.text.push(&env.tok, tok);
            text = d.text;
            finish = d.stopped_by.map(|s| (FinishReason::Stop, Some(StopMatch::Text(s))));
        }
        let len = gs.prompt.len() + ch.sampler.generated();
        if finish.is_none() && (ch.sampler.generated() >= gs.params.max_tokens || !env.limits.fits(len + 1)) {
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
        &mut self,
        cx: &mut StepContext,
        t: SeqId,
        tok: u32,
    ) -> Option<(FinishReason, Option<StopMatch>)> {
        let gs = self;
        let ff_ok = gs.params.logprobs.is_none();
        let g = gs.choices.get_mut(&t).and_then(|c| c.guide.as_mut())?;
        let forced = match g.constraint.commit(tok, ff_ok) {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, token = tok, "grammar rejected a sampled token; ending the choice");
                return Some((FinishReason::Stop, None));
            }
        };
        for f in forced {
            cx.update.append(t, f);
            if let Some(ch) = gs.choices.get_mut(&t) {
                ch.sampler.note_forced(f);
            }
            gs.completion_tokens += 1;
            cx.rec.generated_token();
            cx.rec.forced_token();
            if let Some(end) = gs.emit(cx.env, t, f, None) {
                return Some(end);
            }
        }
        let stopped = gs
            .choices
            .get(&t)
            .and_then(|c| c.guide.as_ref())
            .is_some_and(|g| g.constraint.is_stopped());
        stopped.then_some((FinishReason::Stop, None))
    }
}

impl RequestKind for GenState {
    fn want(&self, c: &Chunk) -> ChunkWant {
        match c.logits {
            Logits::None => ChunkWant::Nothing,
            l => ChunkWant::Logits(l),
        }
    }

    fn may_be_fast(&self) -> bool {
        true
    }

    fn counts_warmed(&self) -> bool {
        true
    }

    fn session_prompt(&self) -> Option<usize> {
        self.retain.is_some().then_some(self.prompt.len())
    }

    fn guides<'a>(&'a mut self, seqs: &[SeqId], out: &mut Vec<&'a mut GuideState>) {
        for (s, c) in self.choices.iter_mut() {
            if let (true, Some(gd)) = (seqs.contains(s), c.guide.as_mut()) {
                out.push(gd);
            }
        }
    }

    fn on_output(
        &mut self,
        cx: &mut StepContext,
        progress: Progress,
        c: &Chunk,
        out: ChunkOut,
    ) -> Result<Outcome, SchedError> {
        match out {
            ChunkOut::Logits { rows, vocab } => self.on_logits(cx, progress, c, rows, vocab),
            // the engine asks a completion only for logits
            ChunkOut::Logprobs(_) | ChunkOut::Hidden { .. } => Ok(Outcome::Continue),
        }
    }

    fn fail(&mut self, e: EngineError) {
        let _ = self.tx.send(Event::Error(e));
    }

    fn is_abandoned(&self) -> bool {
        self.tx.is_closed()
    }
}

/// The finish a sampled token causes by itself (EOS or a stop token id).
fn stop_token_finish(eos: &[u32], tok: u32, p: &SamplingParams) -> Option<(FinishReason, Option<StopMatch>)> {
    let is_eos = !p.ignore_eos && eos.contains(&tok);
    let is_stop_id = p.stop_token_ids.contains(&tok);
    if !(is_eos || is_stop_id) {
        return None;
    }
    let stop = (is_stop_id && !is_eos).then_some(StopMatch::Token(tok));
    Some((FinishReason::Stop, stop))
}
