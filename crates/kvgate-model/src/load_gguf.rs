//! Loading a GGUF file: the architecture from its metadata, the weights as stored ([`crate::stored`]:
//! quant blocks untouched — Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K…Q6_K, F16, F32 all load; a device lays
//! them out), read in place from a read-only memory map of the file ([`GgufTensor`]: the header is
//! parsed by candle's GGUF reader, no tensor is copied), and the metadata the tokenizer and chat
//! template are built from.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file::{Content, Value};

use crate::config::{Activation, Arch, ModelConfig, RopeScaling, RopeStyle};
use crate::error::{ModelError, Result};
use crate::gguf_tensor::GgufTensor;
use crate::stored::{StoredLayer, StoredLinear, StoredTensor, StoredWeights};

/// The GGUF metadata kvgate uses after loading (tokenizer vocabulary, template, special ids).
#[derive(Debug, Clone, Default)]
pub struct GgufMeta {
    /// All metadata values that are strings, numbers or string/number arrays.
    pub values: HashMap<String, Value>,
}

impl GgufMeta {
    /// A string value.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.values
            .get(key)
            .and_then(|v| v.to_string().ok())
            .map(|s| s.as_str())
    }

    /// An unsigned value.
    pub fn u32(&self, key: &str) -> Option<u32> {
        self.values
            .get(key)
            .and_then(|v| v.to_u32().ok().or_else(|| v.to_u64().ok().map(|x| x as u32)))
    }

    /// A float value.
    pub fn f32(&self, key: &str) -> Option<f32> {
        self.values.get(key).and_then(|v| v.to_f32().ok())
    }

    /// A bool value.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.values.get(key).and_then(|v| v.to_bool().ok())
    }

    /// A string array.
    pub fn strings(&self, key: &str) -> Option<Vec<String>> {
        let a = self.values.get(key)?.to_vec().ok()?;
        a.iter().map(|v| v.to_string().ok().cloned()).collect()
    }

    /// A float array.
    pub fn floats(&self, key: &str) -> Option<Vec<f32>> {
        let a = self.values.get(key)?.to_vec().ok()?;
        a.iter().map(|v| v.to_f32().ok()).collect()
    }

    /// An integer array.
    pub fn ints(&self, key: &str) -> Option<Vec<i64>> {
        let a = self.values.get(key)?.to_vec().ok()?;
        a.iter()
            .map(|v| {
                v.to_i32()
                    .map(|x| x as i64)
                    .or_else(|_| v.to_u32().map(|x| x as i64))
                    .ok()
            })
            .collect()
    }
}

struct Reader {
    content: Content,
    map: Arc<memmap2::Mmap>,
}

impl Reader {
    fn q(&mut self, name: &str) -> Result<GgufTensor> {
        let Some(info) = self.content.tensor_infos.get(name) else {
            return Err(ModelError::Invalid(format!("GGUF tensor '{name}' is missing")));
        };
        let at = usize::try_from(self.content.tensor_data_offset + info.offset)
            .map_err(|_| ModelError::Invalid(format!("GGUF tensor '{name}' lies past the address space")))?;
        GgufTensor::mapped(&self.map, at, info.ggml_dtype, info.shape.dims().to_vec(), name)
    }

    fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    fn vec(&mut self, name: &str) -> Result<Vec<f32>> {
        self.q(name)?.dequantize()
    }

    fn opt_vec(&mut self, name: &str) -> Result<Option<Vec<f32>>> {
        if self.has(name) {
            self.vec(name).map(Some)
        } else {
            Ok(None)
        }
    }

    fn linear(&mut self, name: &str) -> Result<StoredLinear> {
        let w = Arc::new(self.q(&format!("{name}.weight"))?);
        Ok(StoredLinear {
            weight: StoredTensor::Gguf(w),
            bias: self.opt_vec(&format!("{name}.bias"))?,
        })
    }
}

fn config_from_meta(m: &GgufMeta, vocab: usize) -> Result<ModelConfig> {
    let a = m
        .str("general.architecture")
        .ok_or_else(|| ModelError::Invalid("GGUF lacks general.architecture".into()))?
        .to_string();
    let arch = match a.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        "gemma3" => Arch::Gemma3,
        other => {
            return Err(ModelError::Unsupported(format!(
                "GGUF architecture '{other}' (kvgate supports llama, qwen2, qwen3, gemma3)"
            )))
        }
    };
    let need = |k: &str| {
        m.u32(&format!("{a}.{k}"))
            .map(|x| x as usize)
            .ok_or_else(|| ModelError::Invalid(format!("GGUF lacks {a}.{k}")))
    };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    let layers = need("block_count")?;
    let kv_heads = m
        .u32(&format!("{a}.attention.head_count_kv"))
        .map(|x| x as usize)
        .unwrap_or(heads);
    let head_dim = m
        .u32(&format!("{a}.attention.key_length"))
        .map(|x| x as usize)
        .unwrap_or(hidden / heads);
    let gemma = arch == Arch::Gemma3;
    let sliding_window = m
        .u32(&format!("{a}.attention.sliding_window"))
        .map(|x| x as usize)
        .filter(|_| gemma);
    let rope_scaling = match (
        m.str(&format!("{a}.rope.scaling.type")),
        m.f32(&format!("{a}.rope.scaling.factor")),
    ) {
        (Some("linear"), Some(f)) => RopeScaling::Linear(f),
        (None | Some("none"), _) => RopeScaling::None,
        (Some(other), _) => return Err(ModelError::Unsupported(format!("GGUF rope scaling '{other}'"))),
    };
    Ok(ModelConfig {
        arch,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: need("feed_forward_length")?,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_eps: m.f32(&format!("{a}.attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
        rope_theta: m
            .f32(&format!("{a}.rope.freq_base"))
            .unwrap_or(if gemma { 1e6 } else { 1e4 }),
        rope_local_theta: if gemma { Some(10_000.0) } else { None },
        rope_scaling,
        // llama.cpp permutes Llama q/k rows on export so that interleaved pairs are right; the others
        // keep Hugging Face's layout (NeoX-style pairs).
        rope_style: if arch == Arch::Llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Half
        },
        max_position_embeddings: m
            .u32(&format!("{a}.context_length"))
            .map(|x| x as usize)
            .unwrap_or(2048),
        tie_word_embeddings: true,
        qkv_bias: false,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        // llama.cpp's converter already adds 1 to Gemma's norm weights.
        norm_plus_one: false,
        scale_embeddings: gemma,
        sandwich_norms: gemma,
        activation: if gemma { Activation::GeluTanh } else { Activation::Silu },
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window,
        sliding_layers: (0..layers)
            .map(|i| sliding_window.is_some() && (i + 1) % 6 != 0)
            .collect(),
        final_logit_softcap: m.f32(&format!("{a}.final_logit_softcapping")),
        attn_logit_softcap: m.f32(&format!("{a}.attn_logit_softcapping")),
        bos_token_id: m.u32("tokenizer.ggml.bos_token_id"),
        eos_token_ids: m.u32("tokenizer.ggml.eos_token_id").into_iter().collect(),
    })
}

/// Reads only the metadata of a GGUF file (no tensors).
pub fn read_meta(path: &Path) -> Result<GgufMeta> {
    let f = File::open(path).map_err(|source| ModelError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let content =
        Content::read(&mut BufReader::new(f)).map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    Ok(GgufMeta {
        values: content.metadata,
    })
}

/// Loads config, weights (as stored, in place in a map of the file) and metadata from a GGUF file.
pub fn load_gguf(path: &Path) -> Result<(ModelConfig, StoredWeights, GgufMeta)> {
    let io = |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    };
    let f = File::open(path).map_err(io)?;
    let content =
        Content::read(&mut BufReader::new(&f)).map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    // SAFETY: the map is read-only and private to this process; like every reader of a model file
    // (llama.cpp maps its GGUFs the same way) it assumes the file is not truncated or rewritten while
    // it is served — replacing it with a new file (a rename) leaves this map on the old one.
    let map = Arc::new(unsafe { memmap2::Mmap::map(&f) }.map_err(io)?);
    let meta = GgufMeta {
        values: content.metadata.clone(),
    };
    let mut r = Reader { content, map };
    let embed = r.q("token_embd.weight")?;
    let (vocab, _) = embed.dims2()?;
    let cfg = config_from_meta(&meta, vocab)?;
    let lm_head = if r.has("output.weight") {
        Some(r.linear("output")?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for i in 0..cfg.num_layers {
        let p = format!("blk.{i}");
        layers.push(StoredLayer {
            attn_norm: r.vec(&format!("{p}.attn_norm.weight"))?,
            q: r.linear(&format!("{p}.attn_q"))?,
            k: r.linear(&format!("{p}.attn_k"))?,
            v: r.linear(&format!("{p}.attn_v"))?,
            o: r.linear(&format!("{p}.attn_output"))?,
            q_norm: r.opt_vec(&format!("{p}.attn_q_norm.weight"))?,
            k_norm: r.opt_vec(&format!("{p}.attn_k_norm.weight"))?,
            post_attn_norm: r.opt_vec(&format!("{p}.post_attention_norm.weight"))?,
            ffn_norm: r.vec(&format!("{p}.ffn_norm.weight"))?,
            post_ffn_norm: r.opt_vec(&format!("{p}.post_ffw_norm.weight"))?,
            gate: r.linear(&format!("{p}.ffn_gate"))?,
            up: r.linear(&format!("{p}.ffn_up"))?,
            down: r.linear(&format!("{p}.ffn_down"))?,
        });
    }
    let mut cfg = cfg;
    cfg.qkv_bias = layers.first().is_some_and(|l| l.q.bias.is_some());
    let weights = StoredWeights {
        embed: StoredTensor::Gguf(Arc::new(embed)),
        layers,
        final_norm: r.vec("output_norm.weight")?,
        lm_head,
    };
    Ok((cfg, weights, meta))
}
