//! An embedding as a request kind: a prompt prefilled like any other, asking the backend for final
//! hidden states instead of logits — the last row (last-token pooling; the prefix cache may serve every
//! block before it) or every row (mean pooling; nothing is taken from the cache, every row is
//! computed) — pooled in f64, optionally L2-normalised, and answered once. No token is sampled.
//!
//! Guarantees: a preempted and recomputed prompt adds each position to the mean exactly once (rows are
//! counted by position); the result does not depend on what else ran in the batch (the backend's rows
//! are batch-invariant).

use super::{ChunkOut, Outcome, Progress, RequestKind, StepContext};
use crate::batch::ChunkWant;
use crate::error::EngineError;
use crate::registry::{GroupId, SchedError};
use crate::request::{EmbedOutcome, EmbedRequest, Pooling, Usage};
use crate::scheduler::{Chunk, Logits, Scheduler};

/// Where an embedding's one result goes.
pub(crate) type EmbedReply = crate::inference::Reply<EmbedOutcome>;

/// An embedding's state.
struct EmbedState {
    reply: Option<EmbedReply>,
    pooling: Pooling,
    normalize: bool,
    prompt_len: usize,
    /// Σ of the hidden rows of positions `0..pooled` (mean pooling).
    sum: Vec<f64>,
    pooled: usize,
}

/// Queues an embedding in the scheduler (its blocks keyed by `salt`) and returns its group and state.
pub(crate) fn admit(sched: &mut Scheduler, req: EmbedRequest, reply: EmbedReply) -> (GroupId, Box<dyn RequestKind>) {
    let every_row = req.pooling == Pooling::Mean;
    let prompt_len = req.prompt.len();
    let (g, _) = sched.add_generate(req.prompt, req.cache_salt.as_deref().unwrap_or(""), every_row);
    let state = EmbedState {
        reply: Some(reply),
        pooling: req.pooling,
        normalize: req.normalize,
        prompt_len,
        sum: Vec::new(),
        pooled: 0,
    };
    (g, Box::new(state))
}

impl EmbedState {
    /// Adds the rows of chunk `c` not yet counted; the pooled vector once the prompt's end is in.
    fn pool(&mut self, c: &Chunk, rows: &[f32], width: usize) -> Option<Vec<f32>> {
        let width = width.max(1);
        match self.pooling {
            Pooling::Last => {
                let last = rows.chunks_exact(width).last()?;
                c.at_end.then(|| last.to_vec())
            }
            Pooling::Mean => {
                if self.sum.len() != width {
                    self.sum = vec![0.0; width];
                }
                for (i, row) in rows.chunks_exact(width).enumerate() {
                    if c.start + i < self.pooled {
                        continue; // recomputed after a preemption: already counted
                    }
                    for (s, &v) in self.sum.iter_mut().zip(row) {
                        *s += v as f64;
                    }
                }
                self.pooled = self.pooled.max(c.start + c.len);
                let n = self.pooled.max(1) as f64;
                c.at_end.then(|| self.sum.iter().map(|s| (s / n) as f32).collect())
            }
        }
    }
}

/// Scales `v` to unit L2 norm (a zero vector stays zero).
pub(crate) fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    }
}

impl RequestKind for EmbedState {
    fn want(&self, c: &Chunk) -> ChunkWant {
        match c.logits {
            Logits::None => ChunkWant::Nothing,
            l => ChunkWant::Hidden(l),
        }
    }

    fn on_output(
        &mut self,
        cx: &mut StepContext,
        progress: Progress,
        c: &Chunk,
        out: ChunkOut,
    ) -> Result<Outcome, SchedError> {
        let ChunkOut::Hidden { rows, width } = out else {
            return Ok(Outcome::Continue);
        };
        let Some(mut embedding) = self.pool(c, rows, width) else {
            return Ok(Outcome::Continue);
        };
        if self.normalize {
            l2_normalize(&mut embedding);
        }
        cx.update.finish(c.seq);
        let usage = Usage {
            cache_write_tokens: 0,
            prompt_tokens: self.prompt_len,
            completion_tokens: 0,
            cached_tokens: self.prompt_len.saturating_sub(progress.computed_tokens),
        };
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(Ok(EmbedOutcome { embedding, usage }));
        }
        cx.rec.embedding_done(progress.arrival, self.prompt_len);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalising_gives_unit_length_and_keeps_zero() {
        let mut v = vec![3.0, 4.0];
        l2_normalize(&mut v);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        let mut z = vec![0.0; 3];
        l2_normalize(&mut z);
        assert_eq!(z, [0.0; 3]);
    }
}
