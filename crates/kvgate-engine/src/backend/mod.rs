//! The backend seam: the object that owns the KV storage and runs the forward pass (the model's layers
//! plus attention over its own cache). The engine talks to it only in device-neutral terms — a flat
//! [`Batch`] of token ids, positions, cache slots and block tables as integers, block copies as pairs of
//! ids — so a GPU backend implements the same trait over device memory (`kernels/kv_cache.cu` for
//! store and paged attention) without the engine changing.
//!
//! Guarantees every implementation gives: block ids and slots are checked against the cache it owns
//! (a bad id is a [`BackendError`], never an out-of-bounds access); `forward` writes every row's K/V
//! before any row attends; a row's logits do not depend on the other rows of the batch.

mod cpu;

pub use cpu::CpuBackend;

use kvgate_kv::CacheShape;
use kvgate_model::{Batch, KvAmax};
use thiserror::Error;

use crate::kv_manager::BlockCopy;

/// What a backend can fail with.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum BackendError {
    /// A block id beyond the cache.
    #[error("block {block} is outside the KV cache of {num_blocks} blocks")]
    BlockOutOfRange {
        /// The block.
        block: usize,
        /// Blocks in the cache.
        num_blocks: usize,
    },
    /// A slot beyond the cache.
    #[error("cache slot {slot} is outside the KV cache of {num_slots} slots")]
    SlotOutOfRange {
        /// The slot.
        slot: usize,
        /// Slots in the cache.
        num_slots: usize,
    },
    /// A batch whose parts disagree (row counts, table indices, logit rows).
    #[error("malformed batch: {0}")]
    Batch(String),
    /// The forward pass failed.
    #[error("forward pass failed: {0}")]
    Forward(String),
}

/// Storage plus compute for one model on one device.
pub trait Backend: Send {
    /// The device, for logs and metrics ("cpu", "cuda:0").
    fn device(&self) -> String;

    /// The shape of the cache it owns.
    fn cache_shape(&self) -> CacheShape;

    /// Blocks in the cache.
    fn num_blocks(&self) -> usize;

    /// Vocabulary size (the width of a logits row).
    fn vocab_size(&self) -> usize;

    /// Positions the model can run (the longest sequence).
    fn max_positions(&self) -> usize;

    /// How far back any layer reads when every layer's attention is windowed (sliding window in all
    /// layers): the scheduler gives back blocks past it. `None` when some layer reads the whole context.
    fn attention_span(&self) -> Option<usize>;

    /// Copies block `src` over block `dst` in every layer (copy-on-write), for each copy in order.
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError>;

    /// Runs one step: writes every row's K/V into the cache at its slot, returns
    /// `batch.logit_rows.len() × vocab` logits.
    fn forward(&mut self, batch: &Batch) -> Result<Vec<f32>, BackendError>;

    /// Runs `batch` without touching the cache (on scratch f32 storage) and reports the per-layer amax
    /// of K and V (`--calculate-kv-scales`) and their per-channel means (`smooth` methods).
    fn measure_kv(&mut self, batch: &Batch) -> Result<KvStats, BackendError>;

    /// Sets each layer's (k_scale, v_scale) (before anything is written with them).
    fn set_kv_scales(&mut self, scales: &[(f32, f32)]) -> Result<(), BackendError>;

    /// Sets each layer's K and V offsets for a `smooth` cache method (before anything is written).
    fn set_kv_offsets(&mut self, offsets: &[(Vec<f32>, Vec<f32>)]) -> Result<(), BackendError>;
}

/// What [`Backend::measure_kv`] saw in one forward pass.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvStats {
    /// Per-layer amax of K and V.
    pub amax: KvAmax,
    /// Per layer, the mean of K and of V over the batch's rows, per (KV head, channel)
    /// (`num_kv_heads × head_dim` each).
    pub means: Vec<(Vec<f32>, Vec<f32>)>,
}

/// Checks a batch against a cache of `num_blocks` blocks of `block_size` tokens: every table entry and
/// slot in range, every row's table index and every logit row valid.
pub(crate) fn check_batch(
    b: &Batch,
    num_blocks: usize,
    block_size: usize,
    window: Option<usize>,
) -> Result<(), BackendError> {
    let n = b.tokens.len();
    if b.positions.len() != n || b.slots.len() != n || b.seq_of_row.len() != n {
        return Err(BackendError::Batch(format!(
            "{n} tokens but {} positions, {} slots, {} table indices",
            b.positions.len(),
            b.slots.len(),
            b.seq_of_row.len()
        )));
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
            .find(|&(i, &x)| x as usize >= num_blocks && !(x == kvgate_model::RELEASED_BLOCK && released_ok(i)))
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
    for (r, (&t, &p)) in b.seq_of_row.iter().zip(&b.positions).enumerate() {
        let Some(table) = b.tables.get(t as usize) else {
            return Err(BackendError::Batch(format!(
                "row {r} names table {t} of {}",
                b.tables.len()
            )));
        };
        if (p as usize) >= table.len() * block_size {
            return Err(BackendError::Batch(format!(
                "row {r} at position {p} is beyond its table of {} blocks",
                table.len()
            )));
        }
    }
    if let Some(&r) = b.logit_rows.iter().find(|&&r| r >= n) {
        return Err(BackendError::Batch(format!("logit row {r} of {n} rows")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_batch_refuses_out_of_range_ids() {
        let ok = Batch::single_sequence(&[1, 2, 3, 4, 5], 4);
        assert_eq!(check_batch(&ok, 2, 4, None), Ok(()));
        assert_eq!(
            check_batch(&ok, 1, 4, None),
            Err(BackendError::BlockOutOfRange {
                block: 1,
                num_blocks: 1
            })
        );
        let mut bad = ok.clone();
        bad.slots[4] = 99;
        assert_eq!(
            check_batch(&bad, 2, 4, None),
            Err(BackendError::SlotOutOfRange { slot: 99, num_slots: 8 })
        );
        let mut bad = ok.clone();
        bad.seq_of_row[0] = 3;
        assert!(matches!(check_batch(&bad, 2, 4, None), Err(BackendError::Batch(_))));
        let mut bad = ok;
        bad.logit_rows.push(5);
        assert!(matches!(check_batch(&bad, 2, 4, None), Err(BackendError::Batch(_))));
    }

    #[test]
    fn released_entries_only_where_no_row_reads() {
        use kvgate_model::RELEASED_BLOCK;
        // one row at position 12 with a window of 5 reads positions 8..=12: blocks 0 and 1 are done
        let b = Batch {
            tokens: vec![1],
            positions: vec![12],
            slots: vec![4 * 4],
            seq_of_row: vec![0],
            tables: vec![vec![RELEASED_BLOCK, RELEASED_BLOCK, 2, 4]],
            logit_rows: vec![0],
            int8: vec![],
        };
        assert_eq!(check_batch(&b, 5, 4, Some(5)), Ok(()));
        assert!(check_batch(&b, 5, 4, None).is_err(), "no window: every entry is read");
        assert!(
            check_batch(&b, 5, 4, Some(6)).is_err(),
            "a window of 6 reads position 7"
        );
        let mut early = b.clone();
        early.tokens.push(1);
        early.positions.push(7);
        early.slots.push(3 * 4);
        early.seq_of_row.push(0);
        assert!(check_batch(&early, 5, 4, Some(5)).is_err(), "a row at 7 reads block 0");
    }
}
