//! Weights as the file stores them, before any device lays them out: what the loaders return (GGUF
//! quant blocks as stored, safetensors tensors in their stored dtype, norms and biases as f32), and the
//! CPU's preparation of them ([`StoredWeights::into_cpu`]: packed panels, 5-bit or widened layouts, or
//! plain f32 for the reference path).
//!
//! Guarantee: the loaders take no device decision — no panel layout, no int8 choice, no
//! dequantization of a matrix — so a GPU backend can upload exactly what the file holds;
//! [`StoredWeights::into_cpu`] gives the same [`Weights`] the loaders used to build (the golden-logit
//! and real-weight tests hold it to that).

use std::sync::Arc;

use candle_core::quantized::QTensor;
use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::linear::Linear;
use crate::weights::{Embedding, LayerWeights, Weights};

/// One matrix as stored, shape `(rows, cols)` (a linear layer's `(out, in)`).
#[derive(Debug, Clone)]
pub enum StoredTensor {
    /// GGUF blocks, any ggml type, as in the file.
    Gguf(Arc<QTensor>),
    /// A safetensors tensor in its stored dtype (f32, f16 or bf16).
    Dense(Tensor),
}

impl StoredTensor {
    /// `(rows, cols)`.
    pub fn dims(&self) -> Result<(usize, usize)> {
        Ok(match self {
            StoredTensor::Gguf(q) => q.shape().dims2()?,
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

    /// Every element as f32, row-major (an embedding table for the CPU's row lookups).
    fn f32_rows(&self) -> Result<Vec<f32>> {
        Ok(match self {
            StoredTensor::Gguf(q) => q.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?,
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

/// How the CPU lays matrices out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuLayout {
    /// 5-bit GGUF formats stay 5-bit (the layout 8-bit activations stream best; see
    /// [`Linear::quantized_for`]).
    pub five_bit: bool,
    /// Every matrix dequantized to f32 and multiplied in plain f32 (the reference path).
    pub f32_weights: bool,
}

impl StoredLinear {
    fn into_cpu(self, layout: CpuLayout) -> Result<Linear> {
        match self.weight {
            StoredTensor::Gguf(q) if layout.f32_weights => Linear::dense(q.dequantize(&Device::Cpu)?, self.bias),
            StoredTensor::Gguf(q) => Linear::quantized_for(q, self.bias, layout.five_bit),
            StoredTensor::Dense(t) => Linear::dense(t, self.bias),
        }
    }
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

    /// The CPU's weights: each matrix repacked (or widened) as `layout` says, the embedding table as f32
    /// rows; a tied output projection is the embedding matrix in the layout its stored format takes
    /// (GGUF blocks repacked, a safetensors table as f32). Each layer's stored tensors are dropped as it
    /// is prepared.
    pub fn into_cpu(self, layout: CpuLayout) -> Result<Weights> {
        let (_, dim) = self.embed.dims()?;
        let rows = self.embed.f32_rows()?;
        let lm_head = match self.lm_head {
            Some(l) => l.into_cpu(layout)?,
            None => match &self.embed {
                StoredTensor::Gguf(q) => StoredLinear {
                    weight: StoredTensor::Gguf(q.clone()),
                    bias: None,
                }
                .into_cpu(layout)?,
                StoredTensor::Dense(t) => Linear::dense(t.to_dtype(DType::F32)?, None)?,
            },
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in self.layers {
            layers.push(LayerWeights {
                attn_norm: l.attn_norm,
                q: l.q.into_cpu(layout)?,
                k: l.k.into_cpu(layout)?,
                v: l.v.into_cpu(layout)?,
                o: l.o.into_cpu(layout)?,
                q_norm: l.q_norm,
                k_norm: l.k_norm,
                post_attn_norm: l.post_attn_norm,
                ffn_norm: l.ffn_norm,
                post_ffn_norm: l.post_ffn_norm,
                gate: l.gate.into_cpu(layout)?,
                up: l.up.into_cpu(layout)?,
                down: l.down.into_cpu(layout)?,
            });
        }
        Ok(Weights {
            embed: Embedding { rows, dim },
            layers,
            final_norm: self.final_norm,
            lm_head,
        })
    }
}

/// A model as loaded, not yet laid out for any device: its config, its weights as stored, and the
/// positions it serves. A backend prepares it ([`StoredModel::into_cpu`] for the CPU).
#[derive(Debug, Clone)]
pub struct StoredModel {
    /// The architecture's config.
    pub config: ModelConfig,
    /// The weights as the file stores them.
    pub weights: StoredWeights,
    /// Positions per sequence it serves.
    pub max_positions: usize,
}

impl StoredModel {
    /// The CPU's model: the weights laid out as `layout` says.
    pub fn into_cpu(self, layout: CpuLayout) -> Result<crate::model::Model> {
        crate::model::Model::new(self.config, self.weights.into_cpu(layout)?, self.max_positions)
    }
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

impl Configured for crate::model::Model {
    fn config(&self) -> &ModelConfig {
        crate::model::Model::config(self)
    }
}
