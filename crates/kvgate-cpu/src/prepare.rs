//! The CPU's preparation of stored weights: each matrix repacked into the packed kernels' panels (or
//! widened to f32 for the reference path), the embedding table as f32 rows; and [`load`], a model file
//! loaded and laid out for the CPU at once (what tests, benches and tools that want a [`Model`] use;
//! `serve` loads the stored weights and lets the backend it opens prepare them).
//!
//! Guarantee: the same stored weights always give the same [`Weights`] (the golden-logit and
//! real-weight tests hold the layouts to the reference arithmetic).

use std::path::Path;

use candle_core::{DType, Device};
use kvgate_model::{
    load_unprepared, LayerWeights, LoadOptions, LoadedModel, Result, StoredLinear, StoredModel, StoredTensor,
    StoredWeights,
};

use crate::linear::Linear;
use crate::model::Model;
use crate::weights::{Embedding, Weights};

/// How the CPU lays matrices out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuLayout {
    /// 5-bit GGUF formats stay 5-bit (the layout 8-bit activations stream best; see
    /// [`Linear::quantized_for`]).
    pub five_bit: bool,
    /// Every matrix dequantized to f32 and multiplied in plain f32 (the reference path).
    pub f32_weights: bool,
}

fn linear(l: StoredLinear, layout: CpuLayout) -> Result<Linear> {
    match l.weight {
        StoredTensor::Gguf(q) if layout.f32_weights => Linear::dense(q.dequantize(&Device::Cpu)?, l.bias),
        StoredTensor::Gguf(q) => Linear::quantized_for(q, l.bias, layout.five_bit),
        StoredTensor::Dense(t) => Linear::dense(t, l.bias),
    }
}

/// The CPU's weights: each matrix repacked (or widened) as `layout` says, the embedding table as f32
/// rows; a tied output projection is the embedding matrix in the layout its stored format takes (GGUF
/// blocks repacked, a safetensors table as f32). Each layer's stored tensors are dropped as it is
/// prepared.
pub fn weights(w: StoredWeights, layout: CpuLayout) -> Result<Weights> {
    let (_, dim) = w.embed.dims()?;
    let rows = w.embed.f32_rows()?;
    let lm_head = match w.lm_head {
        Some(l) => linear(l, layout)?,
        None => match &w.embed {
            StoredTensor::Gguf(q) => linear(
                StoredLinear {
                    weight: StoredTensor::Gguf(q.clone()),
                    bias: None,
                },
                layout,
            )?,
            StoredTensor::Dense(t) => Linear::dense(t.to_dtype(DType::F32)?, None)?,
        },
    };
    let mut layers = Vec::with_capacity(w.layers.len());
    for l in w.layers {
        layers.push(LayerWeights {
            attn_norm: l.attn_norm,
            q: linear(l.q, layout)?,
            k: linear(l.k, layout)?,
            v: linear(l.v, layout)?,
            o: linear(l.o, layout)?,
            q_norm: l.q_norm,
            k_norm: l.k_norm,
            post_attn_norm: l.post_attn_norm,
            ffn_norm: l.ffn_norm,
            post_ffn_norm: l.post_ffn_norm,
            gate: linear(l.gate, layout)?,
            up: linear(l.up, layout)?,
            down: linear(l.down, layout)?,
        });
    }
    Ok(Weights {
        embed: Embedding { rows, dim },
        layers,
        final_norm: w.final_norm,
        lm_head,
    })
}

/// The CPU's model: the stored weights laid out as `layout` says.
pub fn model(m: StoredModel, layout: CpuLayout) -> Result<Model> {
    Model::new(m.config, weights(m.weights, layout)?, m.max_positions)
}

/// Loads the model at `path` (a `.gguf` file or a Hugging Face directory) for the CPU: the stored
/// weights ([`load_unprepared`]) laid out as `opts` says.
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel<Model>> {
    let l = load_unprepared(path, opts)?;
    let layout = CpuLayout {
        five_bit: opts.int8_activations,
        f32_weights: opts.f32_weights,
    };
    Ok(LoadedModel {
        model: model(l.model, layout)?,
        tokenizer: l.tokenizer,
        chat_template: l.chat_template,
        eos_token_ids: l.eos_token_ids,
        defaults: l.defaults,
        name: l.name,
        max_model_len: l.max_model_len,
        source: l.source,
        kv_scales: l.kv_scales,
    })
}

impl kvgate_model::Configured for Model {
    fn config(&self) -> &kvgate_model::ModelConfig {
        Model::config(self)
    }
}
