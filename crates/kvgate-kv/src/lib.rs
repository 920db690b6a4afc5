//! KV-cache storage for kvgate: the block layout, the cache dtypes and their codecs, and the CPU paged
//! attention that reads K/V through block tables.
//!
//! This crate knows tensors only as flat `f32` slices and blocks only as integer ids: which blocks a
//! sequence owns is decided by the engine's block pool, never here. What it guarantees:
//! - a block's size is accounted in bytes ([`CacheShape::bytes_per_block`]), so 4-bit formats with
//!   scales size correctly;
//! - attention reads each dtype straight from its blocks (decoding in the inner loop, no dequantized
//!   copy of the cache);
//! - every query row is computed on its own, in a fixed order, so the result of a row does not depend on
//!   what else is in the batch (batch-invariant reads).

mod attention;
pub mod codec;
mod dtype;
mod error;
mod layout;
pub mod quant;
mod storage;

pub use attention::{
    dot, dot_fused, exp_in_place, AttentionBackend, AttnParams, AttnQuery, AttnRow, CpuAttention, RowMask, LANES,
    PARTITION,
};
pub use dtype::{KvDtype, NVFP4_GROUP};
pub use error::KvError;
pub use layout::CacheShape;
pub use quant::{KvQuant, Rotation, Scales};
pub use storage::{Buf, KvCache, LayerCache, Which};
