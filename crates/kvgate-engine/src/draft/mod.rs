//! The draft model of speculative decoding (vLLM's `draft_model` method): a second, smaller model
//! with the target's vocabulary proposes each speculating sequence's next tokens, one forward pass of
//! the draft per proposed token, batched over the sequences, before the target's step is planned.
//!
//! The drafter keeps its own paged cache with the target's machinery — a [`KvManager`] over a
//! [`BlockPool`], prefix caching included — so the draft computes a prompt once: the `n` choices of a
//! completion, a conversation's next turn and a sequence the target preempted find its blocks again.
//! A sequence's draft state follows the target's: before drafting again, what the draft holds past
//! the longest common prefix with the sequence's tokens (its rejected proposals) is given back, and
//! full blocks of the sequence's own tokens are registered under its group's key (tenants never
//! share draft blocks either). Entries of sequences not asked this step are released.
//!
//! Proposals are the draft's argmax tokens: a deterministic proposal, for which "sample from the
//! target, keep the proposal while they agree" (the verifier, [`crate::kinds`]) is the standard
//! rejection rule with a one-hot draft distribution, so what a sequence emits is what decoding without
//! speculation emits (greedy: token for token; sampled: the same distribution). A proposal ends where
//! the draft's own probability of all of it — the product of its tokens' softmax probabilities —
//! would fall below `draft_p_min`: each further token costs a draft pass and a verified row, and pays
//! only when the whole proposal up to it is kept (the chance of that is what the product estimates).
//! A draft that cannot propose (its pool full, its backend failing) proposes nothing; it never fails a
//! request.
//!
//! The draft reads a sequence from a start fixed when it first sees it: the end of its prompt, its
//! window ([`speculation::draft_start`]), at positions from 0 — so a long prompt costs the draft a
//! small share of what it costs the target, and the time to the first token stays near decoding
//! without speculation.

use std::collections::HashMap;

use kvgate_backend::{Backend, BackendError, Batch, Output, Precision, Want};

use crate::block_pool::BlockPool;
use crate::kv_manager::{KvManager, SeqBlocks};
use crate::registry::SeqId;
use crate::salts::Salts;
use crate::sampling::argmax;
use crate::scheduler::DraftAsk;
use crate::speculation;

mod confidence;
#[cfg(test)]
mod tests;

use confidence::top_probability;

/// The draft model and its cache.
pub(crate) struct Drafter {
    backend: Box<dyn Backend>,
    kv: KvManager,
    block_size: usize,
    /// Ids a proposal may hold (the target's vocabulary).
    target_vocab: usize,
    /// Most rows one draft forward pass computes.
    max_rows: usize,
    /// A proposal ends at a token the draft gives less probability than this.
    p_min: f32,
    /// Most tokens of a prompt's end the draft reads, and at most how many tenths of it.
    window: usize,
    share: usize,
    seqs: HashMap<SeqId, DraftSeq>,
    stats: DraftStats,
}

/// What the drafter did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Forward passes of the draft model.
    pub forwards: u64,
    /// Token rows the draft computed (prompts caught up and proposals).
    pub rows: u64,
    /// Prompt tokens the draft's prefix cache already held.
    pub cached_tokens: u64,
    /// Blocks of the draft's cache its sequences hold now (cached blocks no sequence holds are free).
    pub held_blocks: usize,
    /// Blocks in the draft's cache.
    pub total_blocks: usize,
    /// Proposals ended early because the draft doubted a token (below `draft_p_min`).
    pub doubted: u64,
}

/// One sequence's state in the draft's cache.
struct DraftSeq {
    blocks: SeqBlocks,
    /// The index of the sequence's first token the draft reads (its window's start; the draft's
    /// position 0).
    start: usize,
    /// Tokens whose K/V the draft holds for it, in position order: its own tokens from `start`, then
    /// what the draft proposed last.
    held: Vec<u32>,
    salt: String,
}

/// A sequence being drafted this step.
struct Job<'a> {
    seq: SeqId,
    /// Its tokens the draft is to hold (from its window's start).
    tokens: &'a [u32],
    k: usize,
    /// Whether it was asked for a proposal (a decode step), even if it proposes nothing.
    asked: bool,
    proposal: Vec<u32>,
    /// The draft's probability of the proposal so far.
    sure: f32,
}

impl Drafter {
    /// A drafter over `backend` (the draft model and its cache) for a target of `target_vocab` ids,
    /// computing at most `max_rows` rows a pass, ending proposals below `p_min`, reading at most
    /// `window` tokens and `share` tenths of a prompt's end ([`speculation::draft_start`]).
    pub(crate) fn new(
        backend: Box<dyn Backend>,
        target_vocab: usize,
        max_rows: usize,
        p_min: f32,
        (window, share): (usize, usize),
    ) -> Drafter {
        let block_size = backend.cache_shape().block_size();
        let pool = BlockPool::new(backend.capacity().num_blocks);
        Drafter {
            backend,
            kv: KvManager::new(pool, block_size, true),
            block_size,
            target_vocab,
            max_rows: max_rows.max(1),
            p_min,
            window: window.max(1),
            share,
            seqs: HashMap::new(),
            stats: DraftStats::default(),
        }
    }

    /// What it did so far.
    pub(crate) fn stats(&self) -> DraftStats {
        let pool = self.kv.pool();
        DraftStats {
            held_blocks: pool.total() - pool.num_free(),
            total_blocks: pool.total(),
            ..self.stats
        }
    }

    /// Forgets the sequences `alive` says are gone (their blocks go back; full ones stay cached).
    pub(crate) fn retain(&mut self, alive: impl Fn(SeqId) -> bool) {
        let gone: Vec<SeqId> = self.seqs.keys().filter(|&&s| !alive(s)).copied().collect();
        for sid in gone {
            self.release(sid);
        }
    }

    /// Gives back every sequence's blocks (the engine reset; cached blocks stay cached).
    pub(crate) fn reset(&mut self) {
        for (_, mut s) in self.seqs.drain() {
            self.kv.release(&mut s.blocks);
        }
    }

    /// Computes what each ask's sequence lacks up to `ask.upto` (from its window's start) and proposes
    /// up to `ask.k` tokens for those that decode next (in ask order, where it could): one entry per
    /// sequence asked to propose, empty when the draft doubted its first token.
    pub(crate) fn propose(&mut self, asks: &[DraftAsk<'_>]) -> Result<Vec<(SeqId, Vec<u32>)>, BackendError> {
        let mut jobs = vec![];
        let mut copies = vec![];
        for a in asks {
            if let Some(job) = self.prepare(a, &mut copies) {
                jobs.push(job);
            }
        }
        let out = self.run(&mut jobs, &copies);
        if out.is_err() {
            self.reset();
        }
        out?;
        Ok(jobs
            .into_iter()
            .filter(|j| j.asked)
            .map(|j| (j.seq, j.proposal))
            .collect())
    }

    fn release(&mut self, sid: SeqId) {
        if let Some(mut s) = self.seqs.remove(&sid) {
            self.kv.release(&mut s.blocks);
        }
    }

    /// Brings `a`'s draft state in line with its tokens and reserves the slots its drafting writes
    /// (`None`: it cannot be drafted this step, or a prompt's chunk lies before the draft's window).
    fn prepare<'a>(&mut self, a: &DraftAsk<'a>, copies: &mut Vec<kvgate_backend::BlockCopy>) -> Option<Job<'a>> {
        let bs = self.block_size;
        if self.seqs.get(&a.seq).is_some_and(|s| s.salt != a.salt) {
            self.release(a.seq);
        }
        let start = match self.seqs.get(&a.seq) {
            Some(s) => s.start,
            None => speculation::draft_start(a.tokens.len(), self.window, self.share),
        };
        let tokens = &a.tokens[start.min(a.tokens.len())..];
        let len = a.upto.saturating_sub(start).min(tokens.len());
        if a.k == 0 && (len == 0 || tokens.len() * 10 > a.tokens.len() * self.share.max(1)) {
            // a prompt chunk before the window, or a short prompt read whole (more than its share):
            // nothing for the draft yet — the short prompt's few rows are computed when it first
            // drafts, after the first token, so the time to it is the target's alone
            return None;
        }
        // the draft writes positions up to len + k − 2 (the last proposal is not fed back)
        let k = a.k.min((self.backend.max_positions() + 1).saturating_sub(len));
        if (a.k > 0 && k == 0) || len == 0 || len > self.backend.max_positions() {
            self.release(a.seq);
            return None;
        }
        // a sequence that decodes recomputes its last token: that row gives the first proposal
        let cap = if k > 0 { len - 1 } else { len };
        let mut s = match self.seqs.remove(&a.seq) {
            Some(mut s) => {
                let p = s.held.iter().zip(tokens).take_while(|(x, y)| x == y).count();
                // (registered blocks hold its own tokens, so they lie inside the common prefix)
                let p = p.min(cap);
                self.kv.commit(&mut s.blocks, tokens, p, &s.salt, false);
                self.kv.truncate(&mut s.blocks, p.div_ceil(bs));
                s.held.truncate(p);
                s
            }
            None => {
                let salts = Salts {
                    own: a.salt,
                    exact: None,
                };
                let blocks = self.kv.match_prefix(&tokens[..len], cap / bs, salts, false);
                let found = blocks.len() * bs;
                self.stats.cached_tokens += found as u64;
                DraftSeq {
                    blocks,
                    start,
                    held: tokens[..found].to_vec(),
                    salt: a.salt.to_string(),
                }
            }
        };
        if !self
            .kv
            .reserve(&mut s.blocks, s.held.len(), len + k.saturating_sub(1), copies)
        {
            self.kv.release(&mut s.blocks);
            return None;
        }
        self.seqs.insert(a.seq, s);
        Some(Job {
            seq: a.seq,
            tokens: &tokens[..len],
            k,
            asked: k > 0,
            proposal: Vec::with_capacity(k),
            sure: 1.0,
        })
    }

    /// Runs the draft: first every sequence's tokens not yet in its cache (the last row of each gives
    /// its first proposal), then one row per sequence and pass until each has its `k`.
    fn run(&mut self, jobs: &mut [Job<'_>], copies: &[kvgate_backend::BlockCopy]) -> Result<(), BackendError> {
        if jobs.is_empty() {
            return Ok(());
        }
        self.backend.copy_blocks(copies)?;
        // catch up: rows `held..len` of each sequence, in passes of at most `max_rows`
        loop {
            let mut b = Batch::default();
            let mut wants: Vec<usize> = vec![];
            let mut rows_of: Vec<(usize, usize)> = vec![];
            for (j, job) in jobs.iter().enumerate() {
                let Some(s) = self.seqs.get(&job.seq) else { continue };
                let (from, to) = (s.held.len(), job.tokens.len());
                let room = self.max_rows - b.len();
                if from >= to || room == 0 {
                    continue;
                }
                let n = (to - from).min(room);
                self.add_rows(&mut b, job.seq, &job.tokens[from..from + n], from);
                if from + n == to && job.k > 0 {
                    b.outputs.push(Output {
                        row: b.len() - 1,
                        want: Want::Logits,
                    });
                    wants.push(j);
                }
                rows_of.push((j, n));
            }
            if b.is_empty() {
                break;
            }
            let out = self.forward(b)?;
            for &(j, n) in &rows_of {
                let job = &jobs[j];
                if let Some(s) = self.seqs.get_mut(&job.seq) {
                    let from = s.held.len();
                    s.held.extend_from_slice(&job.tokens[from..from + n]);
                    // the sequence's own tokens: their full blocks join the draft's prefix cache at
                    // once (a request that ends right after its prompt leaves it for the next)
                    self.kv.commit(&mut s.blocks, job.tokens, from + n, &s.salt, false);
                }
            }
            for (i, &j) in wants.iter().enumerate() {
                let row = &out.logits[i * out.vocab..(i + 1) * out.vocab];
                self.push_proposal(&mut jobs[j], row);
            }
        }
        // one proposed token per sequence and pass
        loop {
            let mut b = Batch::default();
            let mut fed = vec![];
            for (j, job) in jobs.iter().enumerate() {
                let Some(&last) = job.proposal.last() else { continue };
                if job.proposal.len() >= job.k {
                    continue;
                }
                let Some(s) = self.seqs.get(&job.seq) else { continue };
                let pos = s.held.len();
                self.add_rows(&mut b, job.seq, &[last], pos);
                b.outputs.push(Output {
                    row: b.len() - 1,
                    want: Want::Logits,
                });
                fed.push(j);
            }
            if b.is_empty() {
                return Ok(());
            }
            let out = self.forward(b)?;
            for (i, &j) in fed.iter().enumerate() {
                let job = &mut jobs[j];
                if let (Some(s), Some(&last)) = (self.seqs.get_mut(&job.seq), job.proposal.last()) {
                    s.held.push(last);
                }
                let row = &out.logits[i * out.vocab..(i + 1) * out.vocab];
                self.push_proposal(job, row);
            }
        }
    }

    /// Appends the argmax of `row` to the job's proposal, unless it is outside the target's
    /// vocabulary or the proposal with it is less sure than `p_min` (then the proposal ends there).
    fn push_proposal(&mut self, job: &mut Job<'_>, row: &[f32]) {
        let best = argmax(row);
        let sure = if self.p_min > 0.0 {
            job.sure * top_probability(row, best)
        } else {
            1.0
        };
        let doubted = sure < self.p_min;
        if (best as usize) < self.target_vocab && !doubted {
            job.proposal.push(best);
            job.sure = sure;
        } else {
            // shorter than asked: it is not fed again
            self.stats.doubted += u64::from(doubted);
            job.k = job.proposal.len();
        }
    }

    /// Adds `tokens` of sequence `seq` at (draft) positions `from..` to the batch as one table.
    fn add_rows(&self, b: &mut Batch, seq: SeqId, tokens: &[u32], from: usize) {
        let Some(s) = self.seqs.get(&seq) else { return };
        let bs = self.block_size;
        let table: Vec<u32> = s.blocks.live().iter().map(|&blk| u32::from(blk)).collect();
        let t = b.tables.len() as u32;
        for (i, &tok) in tokens.iter().enumerate() {
            let p = from + i;
            b.tokens.push(tok);
            b.positions.push(p as u32);
            b.slots.push(table[p / bs] as usize * bs + p % bs);
            b.seq_of_row.push(t);
        }
        b.tables.push(table);
    }

    fn forward(&mut self, mut b: Batch) -> Result<kvgate_backend::StepOutput, BackendError> {
        if self.backend.fast_path().is_some() {
            b.precision = vec![Precision::Fast; b.tables.len()];
        }
        self.stats.forwards += 1;
        self.stats.rows += b.len() as u64;
        self.backend.forward(&b)
    }
}
