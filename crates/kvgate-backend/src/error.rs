//! What a backend can fail with: one typed enum, so the engine and its tests tell a bad batch from a
//! bad block id from a failed device without reading strings.

use kvgate_kv::KvError;
use thiserror::Error;

use crate::capacity::Device;

/// A batch whose parts disagree (found by [`crate::check_batch`] before anything runs).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// The per-row parts have different lengths.
    #[error("{tokens} tokens but {positions} positions, {slots} slots, {table_indices} table indices")]
    Lengths {
        /// Rows by token count.
        tokens: usize,
        /// Positions given.
        positions: usize,
        /// Slots given.
        slots: usize,
        /// Table indices given.
        table_indices: usize,
    },
    /// A row names a table the batch does not have.
    #[error("row {row} names table {table} of {tables}")]
    Table {
        /// The row.
        row: usize,
        /// The table it names.
        table: usize,
        /// Tables in the batch.
        tables: usize,
    },
    /// A row's position lies beyond its table.
    #[error("row {row} at position {position} is beyond its table of {blocks} blocks")]
    Position {
        /// The row.
        row: usize,
        /// Its position.
        position: usize,
        /// Blocks in its table.
        blocks: usize,
    },
    /// A tree part (`rope`, `masks`) does not fit the rows.
    #[error("tree rows: {0}")]
    Tree(String),
    /// An output names a row the batch does not have.
    #[error("output row {row} of {rows} rows")]
    OutputRow {
        /// The row named.
        row: usize,
        /// Rows in the batch.
        rows: usize,
    },
    /// A token id (of a row, or asked for in [`crate::Want::Logprobs`]) outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    Token {
        /// The id.
        token: u32,
        /// Vocabulary size.
        vocab: usize,
    },
    /// A position beyond what the model can run.
    #[error("position {position} is beyond the model's {max} positions")]
    Beyond {
        /// The position.
        position: usize,
        /// Positions the model runs.
        max: usize,
    },
}

/// Everything a backend reports.
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
    /// A batch whose parts disagree.
    #[error("malformed batch: {0}")]
    Batch(#[from] BatchError),
    /// The cache refused a setting (scales after a write, a layer it does not have, a dtype).
    #[error("KV cache: {0}")]
    Cache(#[from] KvError),
    /// A calibration that measures the first batch, called without one.
    #[error("the KV calibration measures the first batch, and none was given")]
    CalibrationNeedsBatch,
    /// The device failed to compute (a kernel launch, a driver call, the tensor library).
    #[error("{device} forward pass failed: {message}")]
    Compute {
        /// The device.
        device: Device,
        /// What the device or library said.
        message: String,
    },
    /// The device could not lay out or upload the model's weights.
    #[error("{device}: preparing the model's weights failed: {message}")]
    Weights {
        /// The device.
        device: Device,
        /// What went wrong.
        message: String,
    },
    /// The device cannot be used by this build or on this machine.
    #[error("--device {device}: {reason}")]
    Unavailable {
        /// The device asked for.
        device: Device,
        /// Why not.
        reason: String,
    },
}
