//! The seam of an encoder model (a BERT-family sentence encoder): no KV cache, no sampling — token ids
//! in, one pooled vector per input out. The engine's encoder thread runs whatever implements it, as the
//! engine's main loop runs a [`crate::Backend`]; the CPU's encoder is one.

use crate::{BackendError, Device};

/// An encoder's forward pass.
pub trait EncoderBackend: Send + Sync {
    /// Where it runs.
    fn device(&self) -> Device;
    /// The longest input, in tokens.
    fn max_positions(&self) -> usize;
    /// Its vocabulary's size.
    fn vocab_size(&self) -> usize;
    /// The length of a vector.
    fn hidden_size(&self) -> usize;
    /// The pooled (not yet normalized) vector of each input, in input order; each input is computed
    /// on its own, so a vector never depends on its batch.
    fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>, BackendError>;
}
