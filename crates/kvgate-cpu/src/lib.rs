//! kvgate's CPU backend: the architectures' shared layer code ([`Model`]: embeddings → layers of
//! RMSNorm, attention with RoPE over the paged cache, gated MLP → logits for the rows that need them),
//! kvgate's own packed matmul kernels over GGUF formats (AVX-512, AVX2 or scalar chosen at run time,
//! bit-identical; weights stay 4/5/8/16-bit), the compute pool, the BERT-family encoder, and
//! [`CpuBackend`]: the model over a host cache behind the `kvgate_backend` seam.
//!
//! Weights come from `kvgate-model` as stored; [`prepare`] lays them out for these kernels (packed
//! panels, 5-bit or widened layouts, or plain f32 for the reference path). The model never allocates
//! KV blocks: it is handed a [`Batch`] whose rows already carry their cache slots and block tables.

mod cpu_backend;
mod dense;
pub mod encoder;
mod linear;
mod model;
mod ops;
mod pool;
pub mod prepare;
mod qmatmul;
mod repack;
#[cfg(any(test, feature = "test-utils"))]
pub mod tiny;
mod weights;

pub use cpu_backend::{CpuBackend, CpuCache, CpuSettings};
pub use kvgate_backend::{Batch, KvAmax, Output, Precision, Want, RELEASED_BLOCK};
pub use model::{ForwardOut, Model};
pub use prepare::{load, CpuLayout};
pub use qmatmul::{QKind, QMatrix};
