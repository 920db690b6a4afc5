//! The architecture description every model is reduced to. Architectures differ only here (flags and
//! numbers), never in copies of layer code: Llama, Qwen2 (qkv biases), Qwen3 (q/k norms) and Gemma 3
//! (sliding + full layers, q/k norms, sandwich norms, `1 + w` norms, scaled embeddings, GELU).
//!
//! A config comes from a Hugging Face `config.json` (with either the older top-level `rope_theta` or
//! transformers 5's `rope_parameters`) or from GGUF metadata.

use serde_json::Value;

use crate::error::{ModelError, Result};

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama (and SmolLM2, Mistral-style without sliding window).
    Llama,
    /// Qwen2 / Qwen2.5: biases on q, k, v.
    Qwen2,
    /// Qwen3: RMS norms on q and k per head.
    Qwen3,
    /// Gemma 3 text.
    Gemma3,
}

/// How rotary embeddings pair dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs (2i, 2i+1): llama.cpp's layout for GGUF Llama weights (q/k rows are permuted on export).
    Interleaved,
    /// Pairs (i, i + d/2): Hugging Face's `rotate_half` (GPT-NeoX style).
    Half,
}

/// MLP activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (swish) gate.
    Silu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
}

/// Everything the forward pass needs to know about an architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Which family (for logs and chat defaults; behaviour comes from the flags below).
    pub arch: Arch,
    /// Vocabulary rows of the embedding / LM head.
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// MLP inner width.
    pub intermediate_size: usize,
    /// Transformer layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base of full-attention layers.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers (Gemma 3's local base), if different.
    pub rope_local_theta: Option<f32>,
    /// RoPE scaling of full-attention layers.
    pub rope_scaling: RopeScaling,
    /// Rotary pairing.
    pub rope_style: RopeStyle,
    /// Context length the model was trained for.
    pub max_position_embeddings: usize,
    /// LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on q, k, v projections.
    pub qkv_bias: bool,
    /// Per-head RMS norms on q and k (before RoPE).
    pub qk_norm: bool,
    /// Norm weights are applied as `1 + w` (Gemma).
    pub norm_plus_one: bool,
    /// Multiply embeddings by `sqrt(hidden_size)` (Gemma).
    pub scale_embeddings: bool,
    /// Extra norms after attention and after the MLP (Gemma 3's sandwich norms).
    pub sandwich_norms: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Attention score multiplier.
    pub attn_scale: f32,
    /// Sliding window size of sliding layers.
    pub sliding_window: Option<usize>,
    /// Per layer: true if it is a sliding-window layer.
    pub sliding_layers: Vec<bool>,
    /// Soft cap of the final logits.
    pub final_logit_softcap: Option<f32>,
    /// Soft cap of attention scores.
    pub attn_logit_softcap: Option<f32>,
    /// Beginning-of-sequence token, if any.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens from the config (more may be added from the tokenizer/generation config).
    pub eos_token_ids: Vec<u32>,
}

fn get_usize(v: &Value, key: &str) -> Option<usize> {
    v.get(key).and_then(Value::as_u64).map(|x| x as usize)
}

fn need_usize(v: &Value, key: &str) -> Result<usize> {
    get_usize(v, key).ok_or_else(|| ModelError::Invalid(format!("config.json lacks the integer '{key}'")))
}

fn get_f32(v: &Value, key: &str) -> Option<f32> {
    v.get(key).and_then(Value::as_f64).map(|x| x as f32)
}

fn id_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|x| x as u32).collect(),
        _ => vec![],
    }
}

/// How RoPE frequencies are scaled for long context.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by a factor.
    Linear(f32),
    /// Llama 3.1's frequency-dependent scaling.
    Llama3 {
        /// Overall factor.
        factor: f32,
        /// Low-frequency factor.
        low_freq_factor: f32,
        /// High-frequency factor.
        high_freq_factor: f32,
        /// Context the base model was trained with.
        original_max_position: f32,
    },
}

/// Reads `rope_theta` and the scaling from one rope section (`rope_parameters` or the config itself
/// for the older layout). Rope types kvgate does not implement are refused.
fn rope_section(sec: &Value, default_theta: f32) -> Result<(f32, RopeScaling)> {
    let theta = get_f32(sec, "rope_theta").unwrap_or(default_theta);
    let scaling = sec.get("rope_scaling").filter(|s| !s.is_null()).unwrap_or(sec);
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = get_f32(scaling, "factor").unwrap_or(1.0);
    match kind {
        "default" => Ok((theta, RopeScaling::None)),
        "linear" => Ok((theta, RopeScaling::Linear(factor))),
        "llama3" => Ok((
            theta,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: get_f32(scaling, "low_freq_factor").unwrap_or(1.0),
                high_freq_factor: get_f32(scaling, "high_freq_factor").unwrap_or(4.0),
                original_max_position: get_f32(scaling, "original_max_position_embeddings").unwrap_or(8192.0),
            },
        )),
        other => Err(ModelError::Unsupported(format!(
            "rope type '{other}' (kvgate implements 'default', 'linear' and 'llama3')"
        ))),
    }
}

impl ModelConfig {
    /// Parses a Hugging Face `config.json`.
    pub fn from_hf_json(v: &Value) -> Result<ModelConfig> {
        let model_type = v.get("model_type").and_then(Value::as_str).unwrap_or("");
        let arch = match model_type {
            "llama" | "mistral" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "gemma3_text" | "gemma3" => Arch::Gemma3,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "model_type '{other}' (kvgate supports llama, mistral, qwen2, qwen3, gemma3_text)"
                )))
            }
        };
        // Gemma 3 multimodal configs nest the text model.
        let v = if model_type == "gemma3" {
            v.get("text_config").unwrap_or(v)
        } else {
            v
        };
        let hidden_size = need_usize(v, "hidden_size")?;
        let num_heads = need_usize(v, "num_attention_heads")?;
        let num_layers = need_usize(v, "num_hidden_layers")?;
        let head_dim = get_usize(v, "head_dim").unwrap_or(hidden_size / num_heads);
        let num_kv_heads = get_usize(v, "num_key_value_heads").unwrap_or(num_heads);
        let gemma = arch == Arch::Gemma3;
        let rope_params = v.get("rope_parameters").filter(|x| !x.is_null());
        let default_theta = if gemma { 1_000_000.0 } else { 10_000.0 };
        let (rope_theta, rope_scaling, rope_local_theta) = match rope_params {
            Some(rp) if rp.get("full_attention").is_some() => {
                let (t, f) = rope_section(&rp["full_attention"], default_theta)?;
                let local = rp
                    .get("sliding_attention")
                    .map(|s| rope_section(s, 10_000.0))
                    .transpose()?;
                (t, f, local.map(|(t, _)| t))
            }
            Some(rp) => {
                let (t, f) = rope_section(rp, get_f32(v, "rope_theta").unwrap_or(default_theta))?;
                (t, f, None)
            }
            None => {
                let (t, f) = rope_section(v, default_theta)?;
                (t, f, get_f32(v, "rope_local_base_freq"))
            }
        };
        // Which layers slide, as transformers decides it: Gemma 3 always (every 6th layer global);
        // Mistral whenever `sliding_window` is set (7B v0.1: 4096 in every layer); Qwen2/3 only with
        // `use_sliding_window`, from layer `max_window_layers` on; Llama never. `layer_types`, when
        // present, names each layer.
        let qwen = matches!(arch, Arch::Qwen2 | Arch::Qwen3);
        let uses_window = match model_type {
            "mistral" => true,
            _ if gemma => true,
            _ if qwen => v.get("use_sliding_window").and_then(Value::as_bool).unwrap_or(false),
            _ => false,
        };
        let sliding_window = get_usize(v, "sliding_window").filter(|_| uses_window);
        let sliding_layers: Vec<bool> = match v.get("layer_types").and_then(Value::as_array) {
            Some(types) if sliding_window.is_some() => {
                types.iter().map(|t| t.as_str() == Some("sliding_attention")).collect()
            }
            _ if sliding_window.is_none() => vec![false; num_layers],
            _ if gemma => {
                let pattern = get_usize(v, "sliding_window_pattern")
                    .or_else(|| get_usize(v, "_sliding_window_pattern"))
                    .unwrap_or(6);
                (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
            }
            _ if qwen => {
                let from = get_usize(v, "max_window_layers").unwrap_or(28);
                (0..num_layers).map(|i| i >= from).collect()
            }
            _ => vec![true; num_layers],
        };
        if sliding_layers.len() != num_layers {
            return Err(ModelError::Invalid(format!(
                "layer_types has {} entries for {num_layers} layers",
                sliding_layers.len()
            )));
        }
        let activation = match v
            .get("hidden_activation")
            .or_else(|| v.get("hidden_act"))
            .and_then(Value::as_str)
            .unwrap_or("silu")
        {
            "silu" | "swish" => Activation::Silu,
            "gelu_pytorch_tanh" | "gelu_tanh" | "gelu" => Activation::GeluTanh,
            other => return Err(ModelError::Unsupported(format!("activation '{other}'"))),
        };
        let attn_scale = match get_f32(v, "query_pre_attn_scalar") {
            Some(s) if gemma => 1.0 / s.sqrt(),
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        Ok(ModelConfig {
            arch,
            vocab_size: need_usize(v, "vocab_size")?,
            hidden_size,
            intermediate_size: need_usize(v, "intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_eps: get_f32(v, "rms_norm_eps").unwrap_or(1e-6),
            rope_theta,
            rope_local_theta,
            rope_scaling,
            rope_style: RopeStyle::Half,
            max_position_embeddings: get_usize(v, "max_position_embeddings").unwrap_or(2048),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(gemma),
            qkv_bias: arch == Arch::Qwen2 || v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
            qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
            norm_plus_one: gemma,
            scale_embeddings: gemma,
            sandwich_norms: gemma,
            activation,
            attn_scale,
            sliding_window,
            sliding_layers,
            final_logit_softcap: get_f32(v, "final_logit_softcapping"),
            attn_logit_softcap: get_f32(v, "attn_logit_softcapping"),
            bos_token_id: v.get("bos_token_id").and_then(Value::as_u64).map(|x| x as u32),
            eos_token_ids: id_list(v.get("eos_token_id")),
        })
    }

    /// How many tokens back the widest layer reads, when every layer has a sliding window (`None` when
    /// some layer attends to the whole context, as Gemma 3's global layers do).
    pub fn attention_span(&self) -> Option<usize> {
        self.sliding_window
            .filter(|_| !self.sliding_layers.is_empty() && self.sliding_layers.iter().all(|&s| s))
    }

    /// Whether some layer attends within a sliding window (its rows' spans depend on where they sit).
    pub fn any_window(&self) -> bool {
        self.sliding_window.is_some() && self.sliding_layers.iter().any(|&s| s)
    }

    /// The shape of this model's KV cache in blocks of `block_size` tokens stored as `dtype` (refused
    /// when the dtype cannot store it).
    pub fn cache_shape(
        &self,
        block_size: usize,
        dtype: kvgate_kv::KvDtype,
    ) -> std::result::Result<kvgate_kv::CacheShape, kvgate_kv::KvError> {
        kvgate_kv::CacheShape::new(self.num_layers, self.num_kv_heads, self.head_dim, block_size, dtype)
    }

    /// Query rows per KV head.
    pub fn group_size(&self) -> usize {
        self.num_heads / self.num_kv_heads
    }

    /// Checks the numbers are consistent (heads divide, widths positive).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(ModelError::Invalid(m));
        if self.num_kv_heads == 0 || !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return bad(format!(
                "{} attention heads are not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even and positive", self.head_dim));
        }
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_layers == 0 {
            return bad("vocab, hidden size and layer count must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(arch: &str) -> Value {
        let p = format!(
            "{}/../../tests/fixtures/tiny/{arch}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    }

    #[test]
    fn parses_the_fixture_configs() {
        let l = ModelConfig::from_hf_json(&fixture("llama")).unwrap();
        assert_eq!(
            (l.arch, l.head_dim, l.num_kv_heads, l.rope_theta),
            (Arch::Llama, 16, 2, 10000.0)
        );
        assert!(!l.tie_word_embeddings && !l.qkv_bias && !l.qk_norm);
        let q2 = ModelConfig::from_hf_json(&fixture("qwen2")).unwrap();
        assert!(q2.qkv_bias && q2.tie_word_embeddings && q2.sliding_window.is_none());
        let q3 = ModelConfig::from_hf_json(&fixture("qwen3")).unwrap();
        assert!(q3.qk_norm && q3.head_dim == 32);
        let g = ModelConfig::from_hf_json(&fixture("gemma3_text")).unwrap();
        assert_eq!(g.sliding_layers, vec![true, true, false]);
        assert_eq!((g.rope_theta, g.rope_local_theta), (1_000_000.0, Some(10_000.0)));
        assert_eq!(g.sliding_window, Some(8));
        assert!((g.attn_scale - 1.0 / 32f32.sqrt()).abs() < 1e-9);
        assert_eq!(g.activation, Activation::GeluTanh);
    }

    #[test]
    fn which_layers_slide() {
        let g = ModelConfig::from_hf_json(&fixture("gemma3_text")).unwrap();
        assert_eq!(g.attention_span(), None, "Gemma 3's global layer reads everything");
        let mut m = fixture("llama");
        m["model_type"] = serde_json::json!("mistral");
        m["sliding_window"] = serde_json::json!(4096);
        let c = ModelConfig::from_hf_json(&m).unwrap();
        assert_eq!(
            (c.sliding_layers.clone(), c.attention_span()),
            (vec![true; 3], Some(4096))
        );
        m["sliding_window"] = Value::Null;
        assert_eq!(ModelConfig::from_hf_json(&m).unwrap().attention_span(), None);
        let mut l = fixture("llama");
        l["sliding_window"] = serde_json::json!(16);
        assert_eq!(
            ModelConfig::from_hf_json(&l).unwrap().sliding_window,
            None,
            "Llama has none"
        );
        let mut q = fixture("qwen2");
        q["sliding_window"] = serde_json::json!(32);
        assert_eq!(
            ModelConfig::from_hf_json(&q).unwrap().sliding_window,
            None,
            "use_sliding_window off"
        );
        q["use_sliding_window"] = serde_json::json!(true);
        q["max_window_layers"] = serde_json::json!(1);
        q.as_object_mut().unwrap().remove("layer_types");
        let c = ModelConfig::from_hf_json(&q).unwrap();
        assert_eq!(
            (c.sliding_layers, c.sliding_window),
            (vec![false, true, true], Some(32))
        );
        q["max_window_layers"] = serde_json::json!(0);
        assert_eq!(ModelConfig::from_hf_json(&q).unwrap().attention_span(), Some(32));
    }

    #[test]
    fn older_top_level_rope_theta() {
        let mut v = fixture("llama");
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_theta"] = serde_json::json!(500000.0);
        assert_eq!(ModelConfig::from_hf_json(&v).unwrap().rope_theta, 500000.0);
        v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        assert!(matches!(ModelConfig::from_hf_json(&v), Err(ModelError::Unsupported(_))));
    }
}
