//! The device-neutral batch one step runs: token rows with their positions and cache slots, one block
//! table per sequence, what each output row needs back, and how exactly each sequence must be computed;
//! plus the block copies a step makes first, and the one check every backend runs before it computes.

use kvgate_kv::RowMask;

use crate::error::{BackendError, BatchError};

/// A block-table entry of a block that lies outside every layer's attention window (released by a
/// sliding-window model): never read.
pub const RELEASED_BLOCK: u32 = u32::MAX;

/// What a row needs back from the forward pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Want {
    /// The full-vocabulary logits row (sampling, logprobs, prompt logprobs).
    Logits,
    /// The log-probabilities of these token ids only, in this order (decision reads): computed on the
    /// backend's side, so no full-vocabulary row crosses the seam.
    Logprobs(Vec<u32>),
    /// The row's final hidden state after the model's output norm (the input of the LM head,
    /// [`crate::Backend::hidden_size`] values): what embeddings are pooled from. No head is run for it.
    Hidden,
}

/// One output of a batch: a row and what it needs back. Rows not named by any output return nothing
/// (prefill chunks).
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    /// The row.
    pub row: usize,
    /// What it needs.
    pub want: Want,
}

/// How exactly a sequence's rows must be computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Precision {
    /// The backend's reference arithmetic (decisions always; completions unless the backend has a
    /// fast path switched on).
    #[default]
    Exact,
    /// The backend's relaxed-precision path when it has one ([`crate::Backend::fast_path`]), exact
    /// otherwise.
    Fast,
}

/// One step's rows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Token id of each row.
    pub tokens: Vec<u32>,
    /// Position of each row within its sequence.
    pub positions: Vec<u32>,
    /// Cache slot (`block · block_size + offset`) each row's K/V is written to.
    pub slots: Vec<usize>,
    /// Index into `tables` of each row's sequence.
    pub seq_of_row: Vec<u32>,
    /// Block table of each sequence in the batch ([`RELEASED_BLOCK`] for a block outside every
    /// layer's window).
    pub tables: Vec<Vec<u32>>,
    /// The rows that return something, in the order the results come back.
    pub outputs: Vec<Output>,
    /// Per sequence (index as `tables`): how exactly its rows are computed; empty for all exact.
    pub precision: Vec<Precision>,
    /// Per row, its RoPE position when it is not `positions` (a tree row's: the options of a `set`
    /// decision all start at one position); empty when every row's is its position.
    pub rope: Vec<u32>,
    /// Per row, the tree mask of a tree row (the positions of its sequence it sees); empty when every
    /// row is causal. Only for a backend with [`crate::Backend::tree_attention`].
    pub masks: Vec<Option<RowMask>>,
}

impl Batch {
    /// The RoPE position of each row.
    pub fn rope_positions(&self) -> &[u32] {
        if self.rope.is_empty() {
            &self.positions
        } else {
            &self.rope
        }
    }

    /// Number of token rows.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when there are no rows.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The rows that return something, in output order.
    pub fn output_rows(&self) -> impl Iterator<Item = usize> + '_ {
        self.outputs.iter().map(|o| o.row)
    }

    /// Per row: whether it takes the fast path (empty when no sequence does).
    pub fn fast_rows(&self) -> Vec<bool> {
        if !self.precision.contains(&Precision::Fast) {
            return Vec::new();
        }
        self.seq_of_row
            .iter()
            .map(|&s| self.precision.get(s as usize) == Some(&Precision::Fast))
            .collect()
    }

    /// A batch holding one whole sequence laid out in blocks `0, 1, 2, …` with the logits of every
    /// row (for tests, reports and perplexity).
    pub fn single_sequence(tokens: &[u32], block_size: usize) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens.to_vec(),
            positions: (0..n as u32).collect(),
            slots: (0..n).collect(),
            seq_of_row: vec![0; n],
            tables: vec![(0..n.div_ceil(block_size) as u32).collect()],
            outputs: (0..n)
                .map(|row| Output {
                    row,
                    want: Want::Logits,
                })
                .collect(),
            precision: Vec::new(),
            rope: Vec::new(),
            masks: Vec::new(),
        }
    }
}

/// The tree parts of a batch: `rope` and `masks` empty or one per row; a mask decides no position
/// past its row's and sees the row's own.
fn check_tree(b: &Batch) -> Result<(), BackendError> {
    let n = b.tokens.len();
    for (what, len) in [("rope", b.rope.len()), ("masks", b.masks.len())] {
        if len != 0 && len != n {
            return Err(BatchError::Tree(format!("{what} has {len} entries for {n} rows")).into());
        }
    }
    for (row, m) in b.masks.iter().enumerate() {
        let Some(m) = m else { continue };
        let pos = b.positions[row] as usize;
        if m.base as usize > pos || !m.sees(pos) {
            return Err(BatchError::Tree(format!(
                "row {row} (position {pos}): its mask from {} must see its own position",
                m.base
            ))
            .into());
        }
    }
    Ok(())
}

/// Copy block `src` over block `dst` in every layer (copy-on-write), as plain block indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopy {
    /// Source block.
    pub src: u32,
    /// Destination block.
    pub dst: u32,
}

/// Checks a batch against a cache of `num_blocks` blocks of `block_size` tokens and a vocabulary of
/// `vocab` ids: part lengths agree, every table entry and slot is in range (a [`RELEASED_BLOCK`] only
/// where no row of its sequence reads, given the attention `window`), every row's table index and
/// position valid, every token and asked id inside the vocabulary, every output row a row.
pub fn check_batch(
    b: &Batch,
    num_blocks: usize,
    block_size: usize,
    vocab: usize,
    window: Option<usize>,
) -> Result<(), BackendError> {
    let n = b.tokens.len();
    if b.positions.len() != n || b.slots.len() != n || b.seq_of_row.len() != n {
        return Err(BatchError::Lengths {
            tokens: n,
            positions: b.positions.len(),
            slots: b.slots.len(),
            table_indices: b.seq_of_row.len(),
        }
        .into());
    }
    if let Some(&token) = b.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(BatchError::Token { token, vocab }.into());
    }
    // A released entry is allowed only before the first position any of its rows reads.
    // (Without a window nothing is ever released: no pass over the rows.)
    let mut first_read = vec![usize::MAX; b.tables.len()];
    if let Some(w) = window {
        for (&t, &p) in b.seq_of_row.iter().zip(&b.positions) {
            if let Some(f) = first_read.get_mut(t as usize) {
                *f = (*f).min((p as usize + 1).saturating_sub(w));
            }
        }
    }
    for (ti, t) in b.tables.iter().enumerate() {
        let released_ok = |i: usize| first_read[ti] != usize::MAX && (i + 1) * block_size <= first_read[ti];
        if let Some((_, &blk)) = t
            .iter()
            .enumerate()
            .find(|&(i, &x)| x as usize >= num_blocks && !(x == RELEASED_BLOCK && released_ok(i)))
        {
            return Err(BackendError::BlockOutOfRange {
                block: blk as usize,
                num_blocks,
            });
        }
    }
    let num_slots = num_blocks * block_size;
    if let Some(&slot) = b.slots.iter().find(|&&s| s >= num_slots) {
        return Err(BackendError::SlotOutOfRange { slot, num_slots });
    }
    for (row, (&t, &p)) in b.seq_of_row.iter().zip(&b.positions).enumerate() {
        let Some(table) = b.tables.get(t as usize) else {
            return Err(BatchError::Table {
                row,
                table: t as usize,
                tables: b.tables.len(),
            }
            .into());
        };
        if (p as usize) >= table.len() * block_size {
            return Err(BatchError::Position {
                row,
                position: p as usize,
                blocks: table.len(),
            }
            .into());
        }
    }
    check_tree(b)?;
    for o in &b.outputs {
        if o.row >= n {
            return Err(BatchError::OutputRow { row: o.row, rows: n }.into());
        }
        if let Want::Logprobs(ids) = &o.want {
            if let Some(&token) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(BatchError::Token { token, vocab }.into());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_batch_refuses_out_of_range_ids() {
        let ok = Batch::single_sequence(&[1, 2, 3, 4, 5], 4);
        assert_eq!(check_batch(&ok, 2, 4, 10, None), Ok(()));
        assert_eq!(
            check_batch(&ok, 1, 4, 10, None),
            Err(BackendError::BlockOutOfRange {
                block: 1,
                num_blocks: 1
            })
        );
        let mut bad = ok.clone();
        bad.slots[4] = 99;
        assert_eq!(
            check_batch(&bad, 2, 4, 10, None),
            Err(BackendError::SlotOutOfRange { slot: 99, num_slots: 8 })
        );
        let mut bad = ok.clone();
        bad.seq_of_row[0] = 3;
        assert_eq!(
            check_batch(&bad, 2, 4, 10, None),
            Err(BatchError::Table {
                row: 0,
                table: 3,
                tables: 1
            }
            .into())
        );
        let mut bad = ok.clone();
        bad.outputs.push(Output {
            row: 5,
            want: Want::Logits,
        });
        assert_eq!(
            check_batch(&bad, 2, 4, 10, None),
            Err(BatchError::OutputRow { row: 5, rows: 5 }.into())
        );
        assert_eq!(
            check_batch(&ok, 2, 4, 5, None),
            Err(BatchError::Token { token: 5, vocab: 5 }.into())
        );
        let mut bad = ok.clone();
        bad.outputs[0].want = Want::Logprobs(vec![1, 12]);
        assert_eq!(
            check_batch(&bad, 2, 4, 10, None),
            Err(BatchError::Token { token: 12, vocab: 10 }.into())
        );
        let mut bad = ok;
        bad.positions.pop();
        assert!(matches!(
            check_batch(&bad, 2, 4, 10, None),
            Err(BackendError::Batch(BatchError::Lengths { positions: 4, .. }))
        ));
    }

    #[test]
    fn released_entries_only_where_no_row_reads() {
        // one row at position 12 with a window of 5 reads positions 8..=12: blocks 0 and 1 are done
        let b = Batch {
            tokens: vec![1],
            positions: vec![12],
            slots: vec![4 * 4],
            seq_of_row: vec![0],
            tables: vec![vec![RELEASED_BLOCK, RELEASED_BLOCK, 2, 4]],
            outputs: vec![Output {
                row: 0,
                want: Want::Logits,
            }],
            precision: vec![],
            rope: Vec::new(),
            masks: Vec::new(),
        };
        assert_eq!(check_batch(&b, 5, 4, 10, Some(5)), Ok(()));
        assert!(
            check_batch(&b, 5, 4, 10, None).is_err(),
            "no window: every entry is read"
        );
        assert!(
            check_batch(&b, 5, 4, 10, Some(6)).is_err(),
            "a window of 6 reads position 7"
        );
        let mut early = b.clone();
        early.tokens.push(1);
        early.positions.push(7);
        early.slots.push(3 * 4);
        early.seq_of_row.push(0);
        assert!(
            check_batch(&early, 5, 4, 10, Some(5)).is_err(),
            "a row at 7 reads block 0"
        );
    }

    #[test]
    fn fast_rows_follow_their_sequence() {
        let mut b = Batch::single_sequence(&[1, 2, 3], 4);
        assert!(b.fast_rows().is_empty());
        b.tokens.push(4);
        b.positions.push(0);
        b.slots.push(4);
        b.seq_of_row.push(1);
        b.tables.push(vec![1]);
        b.precision = vec![Precision::Exact, Precision::Fast];
        assert_eq!(b.fast_rows(), [false, false, false, true]);
    }
}
