//! Loading a Hugging Face model directory: `config.json` and every `*.safetensors` shard (f32, bf16 or
//! f16), the matrices in their stored dtype ([`crate::stored`]; a device lays them out), norms and
//! biases as f32.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::stored::{StoredLayer, StoredLinear, StoredTensor, StoredWeights};

/// A JSON file, parsed (an error names the file).
pub fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.display().to_string(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))
}

/// A checkpoint's tensors by name, taken out as they are used.
pub struct Tensors(pub HashMap<String, Tensor>);

impl Tensors {
    /// The tensor `name` (an error when it is missing).
    pub fn take(&mut self, name: &str) -> Result<Tensor> {
        self.0
            .remove(name)
            .ok_or_else(|| ModelError::Invalid(format!("tensor '{name}' is missing")))
    }

    /// The tensor `name`, when there is one.
    pub fn opt(&mut self, name: &str) -> Option<Tensor> {
        self.0.remove(name)
    }

    /// The tensor `name` as f32 values.
    pub fn vec(&mut self, name: &str) -> Result<Vec<f32>> {
        Ok(self.take(name)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }

    /// The tensor `name` as f32 values, when there is one.
    pub fn opt_vec(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        self.opt(name)
            .map(|t| Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?))
            .transpose()
    }

    /// A layer as stored.
    pub(crate) fn stored_linear(&mut self, prefix: &str) -> Result<StoredLinear> {
        let w = self.take(&format!("{prefix}.weight"))?;
        Ok(StoredLinear {
            weight: StoredTensor::Dense(w),
            bias: self.opt_vec(&format!("{prefix}.bias"))?,
        })
    }
}

/// Loads the config and weights of a Hugging Face directory.
/// Per-layer `(k_scale, v_scale)` of an FP8-KV checkpoint (vLLM's `self_attn.k_scale` /
/// `self_attn.v_scale`, or `k_proj.output_scale` / `v_proj.output_scale`), when every layer has them.
pub type KvScales = Vec<(f32, f32)>;

fn scalar(t: Tensor) -> Result<f32> {
    Ok(t.to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?
        .first()
        .copied()
        .unwrap_or(1.0))
}

fn kv_scales(t: &mut Tensors, layers: usize) -> Result<Option<KvScales>> {
    let mut out = Vec::with_capacity(layers);
    for i in 0..layers {
        let p = format!("model.layers.{i}.self_attn");
        let k = t
            .opt(&format!("{p}.k_scale"))
            .or_else(|| t.opt(&format!("{p}.k_proj.output_scale")));
        let v = t
            .opt(&format!("{p}.v_scale"))
            .or_else(|| t.opt(&format!("{p}.v_proj.output_scale")));
        match (k, v) {
            (Some(k), Some(v)) => out.push((scalar(k)?, scalar(v)?)),
            _ => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Loads the config, weights and (if present) KV scales of a Hugging Face directory.
pub fn load_hf_dir_with_scales(
    dir: &Path,
) -> Result<(ModelConfig, StoredWeights, serde_json::Value, Option<KvScales>)> {
    let (cfg, w, raw, scales) = load_inner(dir)?;
    Ok((cfg, w, raw, scales))
}

/// Loads the config and weights of a Hugging Face directory.
pub fn load_hf_dir(dir: &Path) -> Result<(ModelConfig, StoredWeights, serde_json::Value)> {
    let (cfg, w, raw, _) = load_inner(dir)?;
    Ok((cfg, w, raw))
}

fn load_inner(dir: &Path) -> Result<(ModelConfig, StoredWeights, serde_json::Value, Option<KvScales>)> {
    let raw = read_json(&dir.join("config.json"))?;
    let cfg = ModelConfig::from_hf_json(&raw)?;
    let mut shards: Vec<_> = std::fs::read_dir(dir)
        .map_err(|source| ModelError::Io {
            path: dir.display().to_string(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    shards.sort();
    if shards.is_empty() {
        return Err(ModelError::Invalid(format!(
            "{} has no *.safetensors file",
            dir.display()
        )));
    }
    let mut all = HashMap::new();
    for s in &shards {
        for (name, t) in candle_core::safetensors::load(s, &Device::Cpu)? {
            let name = name.strip_prefix("language_model.").unwrap_or(&name).to_string();
            all.insert(name, t);
        }
    }
    let mut t = Tensors(all);
    let scales = kv_scales(&mut t, cfg.num_layers)?;
    let embed = t.take("model.embed_tokens.weight")?;
    let (vocab, _) = embed.dims2()?;
    let lm_head = match t.opt("lm_head.weight") {
        Some(w) if !cfg.tie_word_embeddings => Some(StoredLinear {
            weight: StoredTensor::Dense(w),
            bias: None,
        }),
        _ => None,
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let p = format!("model.layers.{i}");
        let (post_attn_norm, ffn_norm, post_ffn_norm) = if cfg.sandwich_norms {
            (
                Some(t.vec(&format!("{p}.post_attention_layernorm.weight"))?),
                t.vec(&format!("{p}.pre_feedforward_layernorm.weight"))?,
                Some(t.vec(&format!("{p}.post_feedforward_layernorm.weight"))?),
            )
        } else {
            (None, t.vec(&format!("{p}.post_attention_layernorm.weight"))?, None)
        };
        layers.push(StoredLayer {
            attn_norm: t.vec(&format!("{p}.input_layernorm.weight"))?,
            q: t.stored_linear(&format!("{p}.self_attn.q_proj"))?,
            k: t.stored_linear(&format!("{p}.self_attn.k_proj"))?,
            v: t.stored_linear(&format!("{p}.self_attn.v_proj"))?,
            o: t.stored_linear(&format!("{p}.self_attn.o_proj"))?,
            q_norm: t.opt_vec(&format!("{p}.self_attn.q_norm.weight"))?,
            k_norm: t.opt_vec(&format!("{p}.self_attn.k_norm.weight"))?,
            post_attn_norm,
            ffn_norm,
            post_ffn_norm,
            gate: t.stored_linear(&format!("{p}.mlp.gate_proj"))?,
            up: t.stored_linear(&format!("{p}.mlp.up_proj"))?,
            down: t.stored_linear(&format!("{p}.mlp.down_proj"))?,
        });
    }
    let weights = StoredWeights {
        embed: StoredTensor::Dense(embed),
        layers,
        final_norm: t.vec("model.norm.weight")?,
        lm_head,
    };
    if vocab != cfg.vocab_size {
        return Err(ModelError::Invalid(format!(
            "embedding has {vocab} rows but config.json says vocab_size {}",
            cfg.vocab_size
        )));
    }
    Ok((cfg, weights, raw, scales))
}
