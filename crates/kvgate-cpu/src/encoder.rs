//! A BERT-family sentence encoder (a Hugging Face / sentence-transformers directory: `config.json` with
//! `model_type: "bert"`, `model.safetensors`, `tokenizer.json`, and sentence-transformers' `modules.json`
//! and `1_Pooling/config.json`): token + position + type embeddings, post-norm layers of bidirectional
//! attention and a GELU MLP, then the pooling the directory names (mean over tokens, or the [CLS]
//! token) and its `Normalize` module. No KV cache: an encoder reads every token of its input at once,
//! so it runs outside the paged engine, one batch of whole inputs at a time.
//!
//! Guarantees: every input is computed on its own (attention never crosses inputs, and the matmuls are
//! kvgate's fixed-order f32 ones), so a vector does not depend on the batch it ran in; inputs longer
//! than the position table or with ids outside the vocabulary are an error, never an out-of-bounds read.

use std::path::Path;

use candle_core::{DType, Device};
use rayon::prelude::*;

use crate::linear::Linear;
use kvgate_model::hf::{read_json, Tensors};
use kvgate_model::{ModelError, Result};

/// A dense layer of a checkpoint for the CPU at once (the encoder models, which only the CPU runs).
fn linear(t: &mut Tensors, prefix: &str) -> Result<Linear> {
    let w = t.take(&format!("{prefix}.weight"))?;
    let b = t.opt_vec(&format!("{prefix}.bias"))?;
    Linear::dense(w, b)
}
use kvgate_model::Tokenizer;

/// How an encoder pools its token states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderPooling {
    /// The mean over every token (sentence-transformers' `pooling_mode_mean_tokens`).
    Mean,
    /// The first ([CLS]) token's state.
    Cls,
}

/// An encoder's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size (the length of an embedding).
    pub hidden_size: usize,
    /// Layers.
    pub num_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Longest input, in tokens: the position table, or sentence-transformers' `max_seq_length` when
    /// shorter.
    pub max_positions: usize,
    /// Layer-norm epsilon.
    pub eps: f32,
    /// The pooling its directory names.
    pub pooling: EncoderPooling,
    /// Whether its directory ends in a `Normalize` module.
    pub normalize: bool,
}

struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

impl Norm {
    fn apply(&self, x: &mut [f32], eps: f32) {
        let d = self.w.len();
        for r in x.chunks_exact_mut(d) {
            let mean = r.iter().map(|&v| v as f64).sum::<f64>() / d as f64;
            let var = r.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (var + eps as f64).sqrt();
            for ((v, w), b) in r.iter_mut().zip(&self.w).zip(&self.b) {
                *v = ((*v as f64 - mean) * inv) as f32 * w + b;
            }
        }
    }
}

struct Layer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// A loaded encoder.
pub struct Encoder {
    cfg: EncoderConfig,
    word: Vec<f32>,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embed_norm: Norm,
    layers: Vec<Layer>,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").field("cfg", &self.cfg).finish()
    }
}

/// Whether `dir` holds an encoder this module loads (`config.json` says `model_type: "bert"`).
pub fn is_encoder_dir(dir: &Path) -> bool {
    dir.is_dir()
        && read_json(&dir.join("config.json"))
            .ok()
            .and_then(|c| c.get("model_type").and_then(|m| m.as_str()).map(|m| m == "bert"))
            .unwrap_or(false)
}

fn usize_of(c: &serde_json::Value, k: &str) -> Result<usize> {
    c.get(k)
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
        .ok_or_else(|| ModelError::Invalid(format!("config.json lacks '{k}'")))
}

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x / std::f32::consts::SQRT_2))
}

impl Encoder {
    /// Loads an encoder directory and its tokenizer.
    pub fn load(dir: &Path) -> Result<(Encoder, Tokenizer)> {
        let c = read_json(&dir.join("config.json"))?;
        if let Some(act) = c.get("hidden_act").and_then(|a| a.as_str()).filter(|a| *a != "gelu") {
            return Err(ModelError::Invalid(format!(
                "encoder activation '{act}' is not supported (gelu is)"
            )));
        }
        if let Some(p) = c
            .get("position_embedding_type")
            .and_then(|a| a.as_str())
            .filter(|p| *p != "absolute")
        {
            return Err(ModelError::Invalid(format!(
                "position embeddings '{p}' are not supported (absolute are)"
            )));
        }
        let pool = read_json(&dir.join("1_Pooling/config.json")).ok();
        let flag = |k: &str| {
            pool.as_ref()
                .and_then(|p| p.get(k))
                .and_then(|v| v.as_bool())
                .unwrap_or(false)
        };
        let pooling = if flag("pooling_mode_cls_token") && !flag("pooling_mode_mean_tokens") {
            EncoderPooling::Cls
        } else {
            EncoderPooling::Mean
        };
        let table_len = usize_of(&c, "max_position_embeddings")?;
        let normalize = std::fs::read_to_string(dir.join("modules.json")).is_ok_and(|m| m.contains("Normalize"));
        let cfg = EncoderConfig {
            vocab_size: usize_of(&c, "vocab_size")?,
            hidden_size: usize_of(&c, "hidden_size")?,
            num_layers: usize_of(&c, "num_hidden_layers")?,
            num_heads: usize_of(&c, "num_attention_heads")?,
            max_positions: read_json(&dir.join("sentence_bert_config.json"))
                .ok()
                .and_then(|s| s.get("max_seq_length")?.as_u64())
                .map_or(table_len, |m| (m as usize).min(table_len)),
            eps: c.get("layer_norm_eps").and_then(|v| v.as_f64()).unwrap_or(1e-12) as f32,
            pooling,
            normalize,
        };
        if cfg.num_heads == 0 || !cfg.hidden_size.is_multiple_of(cfg.num_heads) {
            return Err(ModelError::Invalid(
                "hidden_size is not a multiple of num_attention_heads".into(),
            ));
        }
        let mut all = std::collections::HashMap::new();
        for (name, t) in candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)? {
            all.insert(name.strip_prefix("bert.").unwrap_or(&name).to_string(), t);
        }
        let mut t = Tensors(all);
        let mut table = |name: &str, rows: usize| -> Result<Vec<f32>> {
            let v: Vec<f32> = t.take(name)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
            if v.len() != rows * cfg.hidden_size {
                return Err(ModelError::Invalid(format!(
                    "'{name}' has {} values, not {rows} rows",
                    v.len()
                )));
            }
            Ok(v)
        };
        let word = table("embeddings.word_embeddings.weight", cfg.vocab_size)?;
        let position = table("embeddings.position_embeddings.weight", table_len)?;
        let token_type = table(
            "embeddings.token_type_embeddings.weight",
            usize_of(&c, "type_vocab_size")?,
        )?;
        let mut norm = |p: &str| -> Result<Norm> {
            Ok(Norm {
                w: t.vec(&format!("{p}.weight"))?,
                b: t.vec(&format!("{p}.bias"))?,
            })
        };
        let embed_norm = norm("embeddings.LayerNorm")?;
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for i in 0..cfg.num_layers {
            let p = format!("encoder.layer.{i}");
            layers.push(Layer {
                q: linear(&mut t, &format!("{p}.attention.self.query"))?,
                k: linear(&mut t, &format!("{p}.attention.self.key"))?,
                v: linear(&mut t, &format!("{p}.attention.self.value"))?,
                o: linear(&mut t, &format!("{p}.attention.output.dense"))?,
                attn_norm: Norm {
                    w: t.vec(&format!("{p}.attention.output.LayerNorm.weight"))?,
                    b: t.vec(&format!("{p}.attention.output.LayerNorm.bias"))?,
                },
                up: linear(&mut t, &format!("{p}.intermediate.dense"))?,
                down: linear(&mut t, &format!("{p}.output.dense"))?,
                out_norm: Norm {
                    w: t.vec(&format!("{p}.output.LayerNorm.weight"))?,
                    b: t.vec(&format!("{p}.output.LayerNorm.bias"))?,
                },
            });
        }
        // the file may pad and truncate (to 128 here); inputs are whole and unpadded, their length
        // checked against the model's limit instead
        let path = dir.join("tokenizer.json");
        let mut inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let tok = Tokenizer::from_inner(inner);
        let enc = Encoder {
            cfg,
            word,
            position,
            token_type,
            embed_norm,
            layers,
        };
        Ok((enc, tok))
    }

    /// Its shape.
    pub fn config(&self) -> &EncoderConfig {
        &self.cfg
    }

    /// The pooled (not yet normalized) vector of each input, in input order.
    pub fn embed(&self, inputs: &[&[u32]]) -> Result<Vec<Vec<f32>>> {
        let (c, d) = (&self.cfg, self.cfg.hidden_size);
        for ids in inputs {
            if ids.is_empty() || ids.len() > c.max_positions {
                return Err(ModelError::Invalid(format!(
                    "an encoder input has {} tokens; 1 to {} are allowed",
                    ids.len(),
                    c.max_positions
                )));
            }
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(ModelError::Invalid(format!(
                    "token id {t} is outside the vocabulary of {}",
                    c.vocab_size
                )));
            }
        }
        let n: usize = inputs.iter().map(|i| i.len()).sum();
        let mut x = Vec::with_capacity(n * d);
        for ids in inputs {
            for (p, &t) in ids.iter().enumerate() {
                let (w, pos, ty) = (t as usize * d, p * d, 0);
                x.extend((0..d).map(|j| self.word[w + j] + self.position[pos + j] + self.token_type[ty + j]));
            }
        }
        self.embed_norm.apply(&mut x, c.eps);
        let spans: Vec<(usize, usize)> = inputs
            .iter()
            .scan(0, |at, i| {
                let s = (*at, i.len());
                *at += i.len();
                Some(s)
            })
            .collect();
        for l in &self.layers {
            let q = l.q.forward_rows(&x, n, &[])?;
            let k = l.k.forward_rows(&x, n, &[])?;
            let v = l.v.forward_rows(&x, n, &[])?;
            let ctx = self.attend(&q, &k, &v, &spans);
            let mut a = l.o.forward_rows(&ctx, n, &[])?;
            a.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
            l.attn_norm.apply(&mut a, c.eps);
            let mut h = l.up.forward_rows(&a, n, &[])?;
            h.iter_mut().for_each(|v| *v = gelu(*v));
            let mut y = l.down.forward_rows(&h, n, &[])?;
            y.iter_mut().zip(&a).for_each(|(y, a)| *y += a);
            l.out_norm.apply(&mut y, c.eps);
            x = y;
        }
        Ok(spans
            .iter()
            .map(|&(start, len)| match c.pooling {
                EncoderPooling::Cls => x[start * d..(start + 1) * d].to_vec(),
                EncoderPooling::Mean => {
                    let mut sum = vec![0f64; d];
                    for r in x[start * d..(start + len) * d].chunks_exact(d) {
                        sum.iter_mut().zip(r).for_each(|(s, &v)| *s += v as f64);
                    }
                    sum.iter().map(|s| (s / len as f64) as f32).collect()
                }
            })
            .collect())
    }

    /// Bidirectional attention of every input over its own tokens (no mask within an input, nothing
    /// across inputs); `q`, `k`, `v` are `rows × hidden`.
    fn attend(&self, q: &[f32], k: &[f32], v: &[f32], spans: &[(usize, usize)]) -> Vec<f32> {
        let (d, h) = (self.cfg.hidden_size, self.cfg.num_heads);
        let hd = d / h;
        let scale = 1.0 / (hd as f32).sqrt();
        let jobs: Vec<(usize, usize, usize)> = spans
            .iter()
            .flat_map(|&(s, len)| (0..h).map(move |head| (s, len, head)))
            .collect();
        let parts: Vec<(usize, usize, usize, Vec<f32>)> = jobs
            .into_par_iter()
            .map(|(s, len, head)| {
                let off = head * hd;
                let mut out = vec![0f32; len * hd];
                let mut w = vec![0f32; len];
                for i in 0..len {
                    let qi = &q[(s + i) * d + off..(s + i) * d + off + hd];
                    for (j, wj) in w.iter_mut().enumerate() {
                        let kj = &k[(s + j) * d + off..(s + j) * d + off + hd];
                        *wj = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    let max = w.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                    let mut z = 0f32;
                    w.iter_mut().for_each(|x| {
                        *x = (*x - max).exp();
                        z += *x;
                    });
                    let o = &mut out[i * hd..(i + 1) * hd];
                    for (j, &wj) in w.iter().enumerate() {
                        let vj = &v[(s + j) * d + off..(s + j) * d + off + hd];
                        o.iter_mut().zip(vj).for_each(|(o, &x)| *o += wj / z * x);
                    }
                }
                (s, len, head, out)
            })
            .collect();
        let mut ctx = vec![0f32; q.len()];
        for (s, len, head, out) in parts {
            for i in 0..len {
                ctx[(s + i) * d + head * hd..(s + i) * d + (head + 1) * hd].copy_from_slice(&out[i * hd..(i + 1) * hd]);
            }
        }
        ctx
    }
}

impl kvgate_backend::EncoderBackend for Encoder {
    fn device(&self) -> kvgate_backend::Device {
        kvgate_backend::Device::Cpu
    }

    fn max_positions(&self) -> usize {
        self.cfg.max_positions
    }

    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }

    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }

    fn embed(&self, inputs: &[&[u32]]) -> std::result::Result<Vec<Vec<f32>>, kvgate_backend::BackendError> {
        Encoder::embed(self, inputs).map_err(|e| kvgate_backend::BackendError::Compute {
            device: kvgate_backend::Device::Cpu,
            message: e.to_string(),
        })
    }
}
