//! A tiny Llama-architecture model built in memory from a seed (random weights, a byte-level vocabulary
//! of a few hundred tokens), for tests that must run in seconds with no files.
//!
//! Its tokenizer is byte-level BPE with the 256 byte tokens, a handful of merges (so that decision labels
//! such as `yes`, `no`, ` A` are single tokens, as on real models) and ChatML special tokens; its chat
//! template is ChatML. Weights are either f32 or quantized (the MLP to Q4_0, the rest to Q8_0: both integer kernels).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use crate::chat::ChatTemplate;
use crate::config::{Activation, Arch, ModelConfig, RopeScaling, RopeStyle};
use crate::error::Result;
use crate::linear::Linear;
use crate::loader::{GenerationDefaults, LoadedModel};
use crate::model::Model;
use crate::tokenizer::Tokenizer;
use crate::weights::{Embedding, LayerWeights, Weights};

/// ChatML, as SmolLM2 and Qwen use it.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Words merged into single tokens (with and without a leading space, as `Ġ`).
const WORDS: [&str; 8] = ["yes", "no", "Yes", "No", "the", "is", "and", "to"];

fn byte_chars() -> Vec<char> {
    // GPT-2's byte → unicode table.
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec!['\0'; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).unwrap_or('?');
    }
    table
}

/// The tiny byte-level BPE tokenizer (ids 0..3 are `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`).
pub fn tiny_tokenizer() -> Tokenizer {
    let bytes = byte_chars();
    let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_start|>".into(), "<|im_end|>".into()];
    tokens.extend(bytes.iter().map(|c| c.to_string()));
    let mut merges: Vec<(String, String)> = vec![];
    let space = bytes[b' ' as usize];
    for w in WORDS {
        let mut cur = String::new();
        for ch in w.chars() {
            if cur.is_empty() {
                cur.push(ch);
                continue;
            }
            let next = format!("{cur}{ch}");
            if !tokens.contains(&next) {
                merges.push((cur.clone(), ch.to_string()));
                tokens.push(next.clone());
            }
            cur = next;
        }
        // The spaced form merges the space onto the whole word.
        merges.push((space.to_string(), w.to_string()));
        tokens.push(format!("{space}{w}"));
    }
    for c in 'A'..='Z' {
        merges.push((space.to_string(), c.to_string()));
        tokens.push(format!("{space}{c}"));
    }
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .expect("tiny BPE");
    let mut inner = tokenizers::Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    inner.with_decoder(Some(ByteLevel::default()));
    inner
        .add_special_tokens([
            AddedToken::from("<|endoftext|>", true),
            AddedToken::from("<|im_start|>", true),
            AddedToken::from("<|im_end|>", true),
        ])
        .expect("tiny special tokens");
    Tokenizer::from_inner(inner)
}

/// Options of the tiny model.
#[derive(Debug, Clone, Copy)]
pub struct TinySpec {
    /// Seed of the weights.
    pub seed: u64,
    /// Layers.
    pub layers: usize,
    /// Quantize the projection weights: the MLP's to Q4_0, the others to Q8_0.
    pub quantized: bool,
    /// Context length.
    pub max_len: usize,
    /// A sliding window of this many tokens in every layer (Mistral-style), if any.
    pub sliding_window: Option<usize>,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec {
            seed: 42,
            layers: 2,
            quantized: false,
            max_len: 1024,
            sliding_window: None,
        }
    }
}

/// Builds the tiny model, its tokenizer and template.
pub fn tiny_model(spec: TinySpec) -> Result<LoadedModel> {
    let tokenizer = tiny_tokenizer();
    let vocab = tokenizer.vocab_size();
    let (hidden, heads, kv_heads, inter) = (64usize, 4usize, 2usize, 128usize);
    let head_dim = hidden / heads;
    let cfg = ModelConfig {
        arch: Arch::Llama,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: inter,
        num_layers: spec.layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        rms_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_local_theta: None,
        rope_scaling: RopeScaling::None,
        rope_style: RopeStyle::Half,
        max_position_embeddings: spec.max_len,
        tie_word_embeddings: false,
        qkv_bias: false,
        qk_norm: false,
        norm_plus_one: false,
        scale_embeddings: false,
        sandwich_norms: false,
        activation: Activation::Silu,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: spec.sliding_window,
        sliding_layers: vec![spec.sliding_window.is_some(); spec.layers],
        final_logit_softcap: None,
        attn_logit_softcap: None,
        bos_token_id: None,
        eos_token_ids: vec![2],
    };
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let mut mat = |rows: usize, cols: usize, scale: f32| -> Vec<f32> {
        (0..rows * cols).map(|_| rng.random_range(-scale..scale)).collect()
    };
    let lin_as = |w: Vec<f32>, rows: usize, cols: usize, dtype: GgmlDType| -> Result<Linear> {
        let t = Tensor::from_vec(w, (rows, cols), &Device::Cpu)?;
        if spec.quantized {
            Linear::quantized(Arc::new(QTensor::quantize(&t, dtype)?), None)
        } else {
            Linear::dense(t, None)
        }
    };
    let lin = |w: Vec<f32>, rows: usize, cols: usize| lin_as(w, rows, cols, GgmlDType::Q8_0);
    let lin4 = |w: Vec<f32>, rows: usize, cols: usize| lin_as(w, rows, cols, GgmlDType::Q4_0);
    let s_in = 1.0 / (hidden as f32).sqrt() * 1.7;
    let s_mid = 1.0 / (inter as f32).sqrt() * 1.7;
    let mut layers = Vec::new();
    for _ in 0..spec.layers {
        layers.push(LayerWeights {
            attn_norm: vec![1.0; hidden],
            q: lin(mat(hidden, hidden, s_in), hidden, hidden)?,
            k: lin(mat(kv_heads * head_dim, hidden, s_in), kv_heads * head_dim, hidden)?,
            v: lin(mat(kv_heads * head_dim, hidden, s_in), kv_heads * head_dim, hidden)?,
            o: lin(mat(hidden, hidden, s_in), hidden, hidden)?,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: vec![1.0; hidden],
            post_ffn_norm: None,
            gate: lin4(mat(inter, hidden, s_in), inter, hidden)?,
            up: lin4(mat(inter, hidden, s_in), inter, hidden)?,
            down: lin4(mat(hidden, inter, s_mid), hidden, inter)?,
        });
    }
    let embed = mat(vocab, hidden, 1.0);
    let lm_head = lin(mat(vocab, hidden, s_in * 3.0), vocab, hidden)?;
    let weights = Weights {
        embed: Embedding {
            rows: embed,
            dim: hidden,
        },
        layers,
        final_norm: vec![1.0; hidden],
        lm_head,
    };
    let model = Model::new(cfg, weights, spec.max_len)?;
    Ok(LoadedModel {
        model,
        tokenizer,
        chat_template: Some(ChatTemplate::new(CHATML, "", "<|im_end|>")?),
        eos_token_ids: vec![2, 0],
        defaults: GenerationDefaults::default(),
        name: "tiny-llama".into(),
        max_model_len: spec.max_len,
        source: "in-memory tiny model".into(),
        kv_scales: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_single_tokens() {
        let t = tiny_tokenizer();
        for w in ["yes", " yes", "No", " no", "A", " A", "7"] {
            assert_eq!(t.encode(w, false).unwrap().len(), 1, "{w:?}");
        }
        assert_eq!(t.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap()[0], 1);
        let ids = t.encode("héllo wörld 🚀", false).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), "héllo wörld 🚀");
    }
}
