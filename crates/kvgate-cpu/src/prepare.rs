//! The CPU's preparation of stored weights: each matrix repacked into the packed kernels' panels (or
//! widened to f32 for the reference path), projections of one input stacked, the embedding table as
//! stored; and [`load`], a model file
//! loaded and laid out for the CPU at once (what tests, benches and tools that want a [`Model`] use;
//! `serve` loads the stored weights and lets the backend it opens prepare them).
//!
//! Guarantee: the same stored weights always give the same [`Weights`] (the golden-logit and
//! real-weight tests hold the layouts to the reference arithmetic).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use kvgate_model::{
    load_unprepared, LoadOptions, LoadedModel, Result, StoredLayer, StoredLinear, StoredModel, StoredTensor,
    StoredWeights,
};
use rayon::prelude::*;

use crate::linear::{Linear, StackPart};
use crate::model::Model;
use crate::weights::{Embedding, Layer, Stack, Weights};

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
        StoredTensor::Gguf(q) if layout.f32_weights => {
            let (rows, cols) = q.dims2()?;
            Linear::dense(Tensor::from_vec(q.dequantize()?, (rows, cols), &Device::Cpu)?, l.bias)
        }
        StoredTensor::Gguf(q) => {
            let lin = Linear::quantized_for(&q, l.bias, layout.five_bit);
            q.release_pages();
            lin
        }
        StoredTensor::Dense(t) => Linear::dense(t, l.bias),
    }
}

/// Projections that read the same input as one matrix: GGUF tensors of one format repacked once from
/// their blocks side by side (no part is held twice), other weights prepared apart and stacked when
/// their layouts allow ([`Stack::of`]).
fn stack(parts: Vec<StoredLinear>, layout: CpuLayout) -> Result<Stack> {
    let gguf: Option<Vec<StackPart<'_>>> = parts
        .iter()
        .map(|l| match &l.weight {
            StoredTensor::Gguf(q) => Some((q.as_ref(), l.bias.as_deref())),
            StoredTensor::Dense(_) => None,
        })
        .collect();
    if let Some(g) = gguf.filter(|_| !layout.f32_weights) {
        if let Some(w) = Linear::stacked_gguf(&g, layout.five_bit)? {
            let widths = g.iter().map(|(t, _)| t.dims2().map(|d| d.0)).collect::<Result<_>>()?;
            g.iter().for_each(|(t, _)| t.release_pages());
            return Ok(Stack::One { w, widths });
        }
    }
    let parts = parts
        .into_iter()
        .map(|l| linear(l, layout))
        .collect::<Result<Vec<_>>>()?;
    Ok(Stack::of(parts))
}

fn layer(l: StoredLayer, layout: CpuLayout) -> Result<Layer> {
    Ok(Layer {
        attn_norm: l.attn_norm,
        qkv: stack(vec![l.q, l.k, l.v], layout)?,
        o: linear(l.o, layout)?,
        q_norm: l.q_norm,
        k_norm: l.k_norm,
        post_attn_norm: l.post_attn_norm,
        ffn_norm: l.ffn_norm,
        post_ffn_norm: l.post_ffn_norm,
        gate_up: stack(vec![l.gate, l.up], layout)?,
        down: linear(l.down, layout)?,
    })
}

/// The CPU's weights: each matrix repacked (or widened) as `layout` says — the layers and the output
/// projection in parallel, each stored tensor dropped as it is prepared — and the embedding table as
/// stored (a GGUF's, in place in the file's map) or as f32 rows; a tied output projection is the
/// embedding matrix in the layout its stored format takes (GGUF blocks repacked, a safetensors table
/// as f32).
pub fn weights(w: StoredWeights, layout: CpuLayout) -> Result<Weights> {
    let (_, dim) = w.embed.dims()?;
    let head = match w.lm_head {
        Some(l) => l,
        None => StoredLinear {
            weight: match &w.embed {
                StoredTensor::Dense(t) => StoredTensor::Dense(t.to_dtype(DType::F32)?),
                gguf => gguf.clone(),
            },
            bias: None,
        },
    };
    let (lm_head, layers) = rayon::join(
        || linear(head, layout),
        || {
            w.layers
                .into_par_iter()
                .map(|l| layer(l, layout))
                .collect::<Result<Vec<_>>>()
        },
    );
    let embed = match w.embed {
        StoredTensor::Gguf(q) => Embedding::Stored(q),
        dense => Embedding::Rows {
            rows: dense.f32_rows()?,
            dim,
        },
    };
    Ok(Weights {
        embed,
        layers: layers?,
        final_norm: w.final_norm,
        lm_head: lm_head?,
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
