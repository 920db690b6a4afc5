//! The errors of the KV-cache layer.

use thiserror::Error;

/// Everything that can go wrong when configuring or addressing the KV cache.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum KvError {
    /// A `--kv-cache-dtype` value that is not one of the known names.
    #[error("unknown KV-cache dtype '{0}'; expected one of auto, float32, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, nvfp4")]
    UnknownDtype(String),
    /// The model's shape cannot be stored in this dtype (for example nvfp4 needs head_dim % 16 == 0).
    #[error("KV-cache dtype {dtype} cannot store this model: {reason}")]
    Unsupported {
        /// The dtype's name.
        dtype: &'static str,
        /// Why.
        reason: String,
    },
    /// A cache dimension of zero.
    #[error("KV-cache {0} must be at least 1")]
    ZeroSize(&'static str),
    /// Not a single block fits in the memory given.
    #[error("KV-cache memory of {bytes} bytes holds no block; one block needs {block_bytes} bytes")]
    TooSmall {
        /// Bytes offered.
        bytes: u64,
        /// Bytes one block needs (all layers, K and V).
        block_bytes: u64,
    },
    /// Scales changed after something was written: every block must be read with the scales and
    /// transform it was written with.
    #[error("the KV cache's scales are frozen once a block is written (layer {layer})")]
    Frozen {
        /// The layer whose scales were to change.
        layer: usize,
    },
    /// Bytes given for a block do not have the block's size, or name a block beyond the cache.
    #[error("block {block}: {got} bytes given, a block of this cache is {expected} bytes (of {num_blocks} blocks)")]
    BlockBytes {
        /// The block.
        block: usize,
        /// Blocks in the cache.
        num_blocks: usize,
        /// Bytes one block takes.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// A token slot beyond the cache's slots.
    #[error("slot {slot} is outside the cache ({slots} slots)")]
    SlotOutOfRange {
        /// The slot.
        slot: usize,
        /// Slots in the cache.
        slots: usize,
    },
    /// A layer index beyond the cache's layers.
    #[error("the KV cache has no layer {0}")]
    NoLayer(usize),
}
