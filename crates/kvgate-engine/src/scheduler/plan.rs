//! What one scheduling pass produces: the [`Plan`] and its self-contained [`Chunk`]s, plus the
//! per-group accounting.

use std::collections::HashSet;

use crate::block_pool::BlockId;
use crate::registry::{GroupId, SeqId};
use kvgate_backend::BlockCopy;

/// Which rows of a chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None (an intermediate prefill chunk, a decision prefix).
    None,
    /// The chunk's last row (the next-token distribution).
    Last,
    /// Every row (prompt logprobs, mean-pooled embeddings).
    All,
}

impl Logits {
    /// Rows of a chunk of `len` rows it names.
    pub fn rows(self, len: usize) -> usize {
        match self {
            Logits::None => 0,
            Logits::Last => len.min(1),
            Logits::All => len,
        }
    }
}

/// One sequence's share of a step: tokens `start..start + len` of it, with everything needed to run
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// The sequence.
    pub seq: SeqId,
    /// Its group.
    pub group: GroupId,
    /// First token position.
    pub start: usize,
    /// Number of tokens.
    pub len: usize,
    /// Which logits are wanted.
    pub logits: Logits,
    /// For a decision's read: its index.
    pub read: Option<usize>,
    /// Whether the chunk ends at the sequence's last known token (its last row predicts the next one).
    pub at_end: bool,
    /// The tokens `start..start + len`.
    pub tokens: Vec<u32>,
    /// The cache slot (`block · block_size + offset`) of each token.
    pub slots: Vec<usize>,
    /// The sequence's block table (covers `start + len` tokens); `None` for a block given back because
    /// every layer's window has slid past it (the chunk's queries never read it).
    pub table: Vec<Option<BlockId>>,
    /// Of the chunk's rows, the last `draft` run proposed tokens (speculation; logits for every row):
    /// row `i` predicts the token after `tokens[i]`, and the request kind says how many it kept.
    pub draft: usize,
    /// When its proposed tokens are a token tree: one node per proposed row (row `1 + i`), with
    /// its parent row, depth and slot offset; empty for a single path (row `i` at `start + i`).
    pub tree: Vec<crate::token_tree::TreeNode>,
}

impl Chunk {
    /// The position whose slot row `i` writes (a tree row's slot is not its plain position).
    pub fn slot_position(&self, i: usize) -> usize {
        self.start + crate::token_tree::offset(&self.tree, i)
    }

    /// The row holding the proposed token `tok` right after row `at` (the next row of a single path,
    /// a child in a token tree), if any: where a verification that sampled `tok` at row `at` goes on.
    pub fn next_row(&self, at: usize, tok: u32) -> Option<usize> {
        let proposed = self.tokens.get(1..).unwrap_or(&[]);
        if self.tree.is_empty() {
            return (at < self.draft && proposed.get(at) == Some(&tok)).then_some(at + 1);
        }
        crate::token_tree::child(&self.tree, proposed, at, tok)
    }
}

/// A chunk while a pass is still deciding (filled into a [`Chunk`] at the end of the pass).
#[derive(Debug, Clone, Copy)]
pub(super) struct Planned {
    pub(super) seq: SeqId,
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) logits: Logits,
    pub(super) draft: usize,
}

/// The outcome of one scheduling pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// The chunks to run, decode chunks first.
    pub chunks: Vec<Chunk>,
    /// Block copies to perform before running (copy-on-write).
    pub copies: Vec<BlockCopy>,
    /// Groups preempted during this pass (by recompute).
    pub preempted: Vec<GroupId>,
    /// Groups that cannot fit in the pool even alone (the engine fails them), with the blocks they
    /// needed for their next chunk.
    pub failed: Vec<(GroupId, usize)>,
}

impl Plan {
    #[cfg(test)]
    /// Tokens scheduled.
    pub fn num_tokens(&self) -> usize {
        self.chunks.iter().map(|c| c.len).sum()
    }
}

/// Work in progress of one scheduling pass.
pub(super) struct StepState {
    pub(super) chunks: Vec<Planned>,
    pub(super) copies: Vec<(SeqId, BlockCopy)>,
    pub(super) preempted: Vec<GroupId>,
    pub(super) failed: Vec<(GroupId, usize)>,
    pub(super) budget: usize,
    pub(super) planned: HashSet<SeqId>,
    /// Whether decode chunks may carry proposed tokens this step.
    pub(super) speculate: bool,
}

/// Per-group accounting, for usage and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupUsage {
    /// Prompt tokens found in the prefix cache on first admission.
    pub cached_tokens: usize,
    /// Tokens actually computed (prefill chunks and decode tokens, recomputation included).
    pub computed_tokens: usize,
    /// Of the cached prompt tokens, those found in blocks a decision computed.
    pub decision_warmed_tokens: usize,
}
