//! A tiny Llama-architecture model built in memory from a seed (random weights over the tiny
//! byte-level vocabulary of [`kvgate_model::tiny`]), for tests that must run in seconds with no files.
//! Weights are either f32 or quantized (the MLP to Q4_0, the rest to Q8_0: both integer kernels).

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
pub use kvgate_model::tiny::{tiny_tokenizer, CHATML};
use kvgate_model::{
    Activation, Arch, ChatTemplate, GenerationDefaults, LoadedModel, ModelConfig, Result, RopeScaling, RopeStyle,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::linear::Linear;
use crate::model::Model;
use crate::weights::{Embedding, Layer, Stack, Weights};

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
pub fn tiny_model(spec: TinySpec) -> Result<LoadedModel<Model>> {
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
        let (q, k, v) = (
            lin(mat(hidden, hidden, s_in), hidden, hidden)?,
            lin(mat(kv_heads * head_dim, hidden, s_in), kv_heads * head_dim, hidden)?,
            lin(mat(kv_heads * head_dim, hidden, s_in), kv_heads * head_dim, hidden)?,
        );
        let o = lin(mat(hidden, hidden, s_in), hidden, hidden)?;
        let (gate, up) = (
            lin4(mat(inter, hidden, s_in), inter, hidden)?,
            lin4(mat(inter, hidden, s_in), inter, hidden)?,
        );
        layers.push(Layer {
            attn_norm: vec![1.0; hidden],
            qkv: Stack::of(vec![q, k, v]),
            o,
            q_norm: None,
            k_norm: None,
            post_attn_norm: None,
            ffn_norm: vec![1.0; hidden],
            post_ffn_norm: None,
            gate_up: Stack::of(vec![gate, up]),
            down: lin4(mat(hidden, inter, s_mid), hidden, inter)?,
        });
    }
    let embed = mat(vocab, hidden, 1.0);
    let lm_head = lin(mat(vocab, hidden, s_in * 3.0), vocab, hidden)?;
    let weights = Weights {
        embed: Embedding::Rows {
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
