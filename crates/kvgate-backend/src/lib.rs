//! The backend seam: the object that owns the KV storage and runs the forward pass (the model's layers
//! plus attention over its own cache), and every type that crosses it. The engine talks to a backend
//! only in device-neutral terms — a flat [`Batch`] of token ids, positions, cache slots and block
//! tables as integers, what each output row needs back ([`Want`]), block copies as pairs of indices, one
//! typed [`KvCalibration`] — so the CPU backend (`kvgate_cpu::CpuBackend`) and a GPU one implement the
//! same trait over their own memory without the engine changing.
//!
//! Guarantees every implementation gives: block ids, slots, table indices, tokens and output rows are
//! checked against the cache and model it owns before anything runs (a bad id is a [`BackendError`],
//! never an out-of-bounds access); `forward` writes every row's K/V before any row attends; a row's
//! outputs do not depend on the other rows of the batch; log-probabilities asked with
//! [`Want::Logprobs`] are computed on the backend's side (no full-vocabulary row crosses the seam); a
//! [`Want::Hidden`] row is the final hidden state the head would read, bitwise the same whatever else
//! the batch asks for.

mod batch;
mod calibrate;
mod capacity;
mod encoder;
mod error;
mod output;

pub use batch::{check_batch, Batch, BlockCopy, Output, Precision, Want, RELEASED_BLOCK};
pub use calibrate::{
    dtype_range, kv_scale, scales_from_amax, CalibrationPlan, CalibrationReport, KvAmax, KvCalibration, KvStats, Scales,
};
pub use capacity::{Capacity, Device, KvMemory};
pub use encoder::EncoderBackend;
pub use error::{BackendError, BatchError};
pub use output::{log_sum_exp, logprobs_of, StepOutput};

use kvgate_kv::CacheShape;

mod tree;
pub use kvgate_kv::RowMask;
pub use tree::{splice_slot, SlotCopy, TreeGrain};

/// Storage plus compute for one model on one device.
pub trait Backend: Send {
    /// The device, for logs and metrics.
    fn device(&self) -> Device;

    /// The shape of the cache it owns.
    fn cache_shape(&self) -> CacheShape;

    /// What its cache holds: blocks, and the bytes each takes on the device.
    fn capacity(&self) -> Capacity;

    /// Vocabulary size (the width of a [`Want::Logits`] row).
    fn vocab_size(&self) -> usize;

    /// The model's hidden size (the width of a [`Want::Hidden`] row).
    fn hidden_size(&self) -> usize;

    /// Positions the model can run (the longest sequence).
    fn max_positions(&self) -> usize;

    /// Rows of one sequence a forward pass computes per read of the weights (the CPU's kernels take up
    /// to 8 rows at once with AVX-512, 4 with AVX2): rows past a multiple of it read every weight
    /// again, so speculation trims a proposal that would spill a row or two into another read.
    /// `None` (the default) when extra rows cost no extra read of the weights.
    fn rows_per_weight_read(&self) -> Option<usize> {
        None
    }

    /// How far back any layer reads when every layer's attention is windowed (sliding window in all
    /// layers): the scheduler gives back blocks past it. `None` when some layer reads the whole context.
    fn attention_span(&self) -> Option<usize>;

    /// The name of the backend's relaxed-precision path for [`Precision::Fast`] rows (for example
    /// `"int8-activations"`), or `None` when it computes every row exactly. Blocks computed on that
    /// path must never be shared with exactly computed ones, so the engine keys them apart by it.
    fn fast_path(&self) -> Option<&'static str>;

    /// Whether it computes tree rows ([`Batch::rope`], [`Batch::masks`]): the engine sends a tree only
    /// to a backend that does (a decision's `set` read falls back to option orders otherwise).
    fn tree_attention(&self) -> bool {
        false
    }

    /// Copies block `src` over block `dst` in every layer (copy-on-write), for each copy in order.
    fn copy_blocks(&mut self, copies: &[BlockCopy]) -> Result<(), BackendError>;

    /// Where a token tree's rows may sit so that each computes bitwise what it would compute laid out
    /// as a plain sequence (speculation verifies several candidates in one pass and keeps the longest
    /// accepted path: [`TreeGrain`]); `None` (the default) when the backend promises no such layout
    /// and speculation keeps to one path.
    fn token_trees(&self) -> Option<TreeGrain> {
        None
    }

    /// Copies token slot `src` over slot `dst` in every layer, bitwise, for each move in order (a kept
    /// tree path moved to where its sequence reads it). The default goes through
    /// [`Backend::read_block`] and [`Backend::write_block`] with the cache's layout; a slot outside
    /// the cache is an error with nothing written for it.
    fn copy_slots(&mut self, moves: &[SlotCopy]) -> Result<(), BackendError> {
        let shape = self.cache_shape();
        let (bs, num_blocks) = (shape.block_size(), self.capacity().num_blocks);
        for m in moves {
            for slot in [m.src, m.dst] {
                if slot / bs >= num_blocks {
                    return Err(BackendError::SlotOutOfRange {
                        slot,
                        num_slots: num_blocks * bs,
                    });
                }
            }
            let (mut from, mut to) = (vec![], vec![]);
            self.read_block((m.src / bs) as u32, &mut from)?;
            self.read_block((m.dst / bs) as u32, &mut to)?;
            splice_slot(&shape, &from, m.src % bs, &mut to, m.dst % bs);
            self.write_block((m.dst / bs) as u32, &to)?;
        }
        Ok(())
    }

    /// Appends the bytes of block `block` to `out`: every layer's K then V, in the cache's own encoding
    /// (exactly [`Capacity::bytes_per_block`] bytes). With [`Backend::write_block`] this is the copy
    /// interface a second KV tier sits behind: what is written back is bitwise what was read.
    fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), BackendError>;

    /// Overwrites block `block` with bytes [`Backend::read_block`] gave (of a cache with the same
    /// [`Backend::kv_fingerprint`]); a wrong length is an error, nothing written.
    fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), BackendError>;

    /// A fingerprint of everything a block's bytes depend on besides its tokens: the model's weights,
    /// the cache's dtype, method, block size and per-layer scales. Blocks kept outside the cache (a
    /// spill file) are served back only to a cache with the same fingerprint.
    fn kv_fingerprint(&self) -> u64;

    /// Runs one step: writes every row's K/V into the cache at its slot and returns what each of
    /// `batch.outputs` asked for.
    fn forward(&mut self, batch: &Batch) -> Result<StepOutput, BackendError>;

    /// Sets the quantized cache's per-layer parameters, once, before anything is written with them.
    /// When `how` measures ([`KvCalibration::needs_batch`]) it runs `first` (the first batch the engine
    /// will run) without touching the cache; otherwise `first` may be `None`.
    fn calibrate(&mut self, how: &KvCalibration, first: Option<&Batch>) -> Result<CalibrationReport, BackendError>;
}
