//! Weights as the file stores them, before any device lays them out: what the loaders return (GGUF
//! quant blocks as stored, safetensors tensors in their stored dtype, norms and biases as f32). Each
//! backend prepares its own layout from them (`kvgate_cpu::prepare` for the CPU's packed panels, the
//! CUDA backend uploads the bytes).
//!
//! Guarantee: the loaders take no device decision — no panel layout, no int8 choice, no
//! dequantization of a matrix — so a GPU backend can upload exactly what the file holds.

use std::sync::Arc;

use candle_core::{DType, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::gguf_tensor::GgufTensor;

/// One matrix as stored, shape `(rows, cols)` (a linear layer's `(out, in)`).
#[derive(Debug, Clone)]
pub enum StoredTensor {
    /// GGUF blocks, any ggml type, as in the file (in place in its map).
    Gguf(Arc<GgufTensor>),
    /// A safetensors tensor in its stored dtype (f32, f16 or bf16).
    Dense(Tensor),
}

impl StoredTensor {
    /// `(rows, cols)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            StoredTensor::Gguf(q) => q.dims2()?,
            StoredTensor::Dense(t) => t.dims2()?,
        })
    }

    /// Bytes as stored.
    pub fn stored_bytes(&self) -> usize {
        match self {
            StoredTensor::Gguf(q) => q.storage_size_in_bytes(),
            StoredTensor::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        }
    }

    /// The stored format's name (`q4_k`, `bf16`, …).
    pub fn format(&self) -> String {
        match self {
            StoredTensor::Gguf(q) => format!("{:?}", q.dtype()).to_lowercase(),
            StoredTensor::Dense(t) => t.dtype().as_str().to_string(),
        }
    }

    /// The matrix's first `n` rows.
    pub fn first_rows(&self, n: usize) -> Result<StoredTensor> {
        Ok(match self {
            StoredTensor::Gguf(q) => StoredTensor::Gguf(Arc::new(q.first_rows(n)?)),
            StoredTensor::Dense(t) => StoredTensor::Dense(t.narrow(0, 0, n)?),
        })
    }

    /// Every element as f32, row-major (an embedding table for the CPU's row lookups).
    pub fn f32_rows(&self) -> Result<Vec<f32>> {
        Ok(match self {
            StoredTensor::Gguf(q) => q.dequantize()?,
            StoredTensor::Dense(t) => t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?,
        })
    }
}

/// A linear layer as stored: its weight and bias.
#[derive(Debug, Clone)]
pub struct StoredLinear {
    /// `(out, in)`.
    pub weight: StoredTensor,
    /// `out` values, when the layer has one.
    pub bias: Option<Vec<f32>>,
}

/// One transformer layer; `L` is how its linear layers are held — as the file stores them
/// ([`StoredLinear`]) or laid out by a backend (the CPU's `Linear`). Optional parts (biases, q/k norms,
/// sandwich norms) are `None` where an architecture has none.
#[derive(Debug, Clone)]
pub struct LayerWeights<L> {
    /// Norm before attention.
    pub attn_norm: Vec<f32>,
    /// Query projection.
    pub q: L,
    /// Key projection.
    pub k: L,
    /// Value projection.
    pub v: L,
    /// Output projection.
    pub o: L,
    /// Per-head query norm (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    /// Per-head key norm (Qwen3, Gemma 3).
    pub k_norm: Option<Vec<f32>>,
    /// Norm of the attention output before the residual add (Gemma 3).
    pub post_attn_norm: Option<Vec<f32>>,
    /// Norm before the MLP.
    pub ffn_norm: Vec<f32>,
    /// Norm of the MLP output before the residual add (Gemma 3).
    pub post_ffn_norm: Option<Vec<f32>>,
    /// MLP gate.
    pub gate: L,
    /// MLP up.
    pub up: L,
    /// MLP down.
    pub down: L,
}

/// One transformer layer as stored.
pub type StoredLayer = LayerWeights<StoredLinear>;

/// All weights as stored.
#[derive(Debug, Clone)]
pub struct StoredWeights {
    /// Token embeddings, `(vocab, dim)`.
    pub embed: StoredTensor,
    /// The layers.
    pub layers: Vec<StoredLayer>,
    /// Final norm.
    pub final_norm: Vec<f32>,
    /// The output projection; `None` when it is the embedding matrix (tied).
    pub lm_head: Option<StoredLinear>,
}

impl StoredWeights {
    /// Bytes of every matrix as stored (norms and biases left out).
    pub fn stored_bytes(&self) -> usize {
        let lin = |l: &StoredLinear| l.weight.stored_bytes();
        self.embed.stored_bytes()
            + self.lm_head.as_ref().map_or(0, lin)
            + self
                .layers
                .iter()
                .map(|l| {
                    [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                        .into_iter()
                        .map(lin)
                        .sum::<usize>()
                })
                .sum::<usize>()
    }

    /// Keeps the output projection's first `n` rows (a tied projection becomes the embedding's first
    /// rows, the embedding itself whole): the model then scores only token ids `0..n` — a draft
    /// model's head over a tokenizer's most frequent ids (FR-Spec's idea; BPE vocabularies list their
    /// merges in training order). `n` at or past the vocabulary keeps the head as it is.
    pub fn keep_head_rows(&mut self, n: usize) -> Result<()> {
        let head = self.lm_head.as_ref().map_or(&self.embed, |l| &l.weight);
        if n >= head.dims()?.0 {
            return Ok(());
        }
        let weight = head.first_rows(n)?;
        let bias = self
            .lm_head
            .as_ref()
            .and_then(|l| l.bias.as_ref())
            .map(|b| b[..n].to_vec());
        self.lm_head = Some(StoredLinear { weight, bias });
        Ok(())
    }
}

/// A model as loaded, not yet laid out for any device: its config, its weights as stored, and the
/// positions it serves. A backend prepares it (`kvgate_cpu::prepare` for the CPU).
#[derive(Debug, Clone)]
pub struct StoredModel {
    /// The architecture's config.
    pub config: ModelConfig,
    /// The weights as the file stores them.
    pub weights: StoredWeights,
    /// Positions per sequence it serves.
    pub max_positions: usize,
}

/// What every form of a loaded model tells: its config.
pub trait Configured {
    /// The architecture's config.
    fn config(&self) -> &ModelConfig;
}

impl Configured for StoredModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }
}
