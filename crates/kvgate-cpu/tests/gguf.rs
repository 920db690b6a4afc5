//! GGUF loading for every weight format kvgate supports (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K):
//! a small random Llama is written as GGUF files with candle's writer (tied embeddings, the tiny
//! tokenizer's byte-level BPE vocabulary and merges, a chat template), loaded back through kvgate's
//! loader, and its logits compared with the F32 file's. Also checks the tokenizer built from the GGUF
//! vocabulary and the chat template from its metadata.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use kvgate_cpu::tiny::{tiny_tokenizer, CHATML};
use kvgate_cpu::{load, Batch};
use kvgate_kv::{CpuAttention, KvCache, KvDtype};
use kvgate_model::LoadOptions;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const HIDDEN: usize = 256;
const INTER: usize = 512;
const LAYERS: usize = 2;

fn write_gguf(dtype: GgmlDType, path: &Path) {
    let tok = tiny_tokenizer();
    let vocab = tok.vocab_size();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut mat = |rows: usize, cols: usize, scale: f32| {
        let v: Vec<f32> = (0..rows * cols).map(|_| rng.random_range(-scale..scale)).collect();
        Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
    };
    let q = |t: &Tensor| QTensor::quantize(t, dtype).unwrap();
    let norm = |n: usize| {
        QTensor::quantize(
            &Tensor::ones(n, candle_core::DType::F32, &Device::Cpu).unwrap(),
            GgmlDType::F32,
        )
        .unwrap()
    };
    let s = 1.7 / (HIDDEN as f32).sqrt();
    let mut tensors: Vec<(String, QTensor)> = vec![
        ("token_embd.weight".into(), q(&mat(vocab, HIDDEN, 1.0))),
        ("output_norm.weight".into(), norm(HIDDEN)),
    ];
    for l in 0..LAYERS {
        let p = format!("blk.{l}");
        tensors.push((format!("{p}.attn_norm.weight"), norm(HIDDEN)));
        tensors.push((format!("{p}.ffn_norm.weight"), norm(HIDDEN)));
        tensors.push((format!("{p}.attn_q.weight"), q(&mat(HIDDEN, HIDDEN, s))));
        tensors.push((format!("{p}.attn_k.weight"), q(&mat(128, HIDDEN, s))));
        tensors.push((format!("{p}.attn_v.weight"), q(&mat(128, HIDDEN, s))));
        tensors.push((format!("{p}.attn_output.weight"), q(&mat(HIDDEN, HIDDEN, s))));
        tensors.push((format!("{p}.ffn_gate.weight"), q(&mat(INTER, HIDDEN, s))));
        tensors.push((format!("{p}.ffn_up.weight"), q(&mat(INTER, HIDDEN, s))));
        tensors.push((
            format!("{p}.ffn_down.weight"),
            q(&mat(HIDDEN, INTER, 1.7 / (INTER as f32).sqrt())),
        ));
    }
    let tokens: Vec<Value> = (0..vocab as u32)
        .map(|i| Value::String(tok.id_to_token(i).unwrap()))
        .collect();
    let types: Vec<Value> = (0..vocab as u32)
        .map(|i| Value::I32(if i < 3 { 3 } else { 1 }))
        .collect();
    // The tiny tokenizer's merges, recovered from its vocabulary: every multi-character token is the
    // merge of its first character (or the space marker) and the rest.
    let mut merges = vec![];
    for i in 3..vocab as u32 {
        let t = tok.id_to_token(i).unwrap();
        let chars: Vec<char> = t.chars().collect();
        if chars.len() > 1 {
            // words were merged left to right: (prefix, last char); spaced words as (Ġ, word)
            let first = chars[0].to_string();
            let rest: String = chars[1..].iter().collect();
            if first == "Ġ" && tok.token_to_id(&rest).is_some() {
                merges.push(Value::String(format!("{first} {rest}")));
            } else {
                let head: String = chars[..chars.len() - 1].iter().collect();
                merges.push(Value::String(format!("{head} {}", chars[chars.len() - 1])));
            }
        }
    }
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(LAYERS as u32)),
        ("llama.context_length", Value::U32(256)),
        ("llama.embedding_length", Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length", Value::U32(INTER as u32)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("tokenizer.ggml.model", Value::String("gpt2".into())),
        ("tokenizer.ggml.pre", Value::String("default".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.merges", Value::Array(merges)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
        ("tokenizer.chat_template", Value::String(CHATML.into())),
    ];
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let t_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
}

fn logits(path: &Path, ids: &[u32]) -> Vec<f32> {
    let m = load(path, &LoadOptions::default()).unwrap();
    let c = m.model.config().clone();
    let shape = c.cache_shape(16, KvDtype::F32).unwrap();
    let mut cache = KvCache::new(shape, 4);
    m.model
        .forward(&Batch::single_sequence(ids, 16), &mut cache, &CpuAttention)
        .unwrap()
}

#[test]
fn every_gguf_format_loads_and_agrees_with_f32() {
    let dir = std::env::temp_dir().join(format!("kvgate-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f32_path = dir.join("f32.gguf");
    write_gguf(GgmlDType::F32, &f32_path);
    // The tokenizer and template come from the GGUF's own metadata.
    let m = load(&f32_path, &LoadOptions::default()).unwrap();
    let text = "yes, the answer is no <|im_end|>";
    let ids = m.tokenizer.encode(text, false).unwrap();
    assert_eq!(
        ids,
        tiny_tokenizer().encode(text, false).unwrap(),
        "tokenizer built from the GGUF vocabulary"
    );
    assert_eq!(m.tokenizer.decode(&ids, false).unwrap(), text);
    let chat = m.chat_template.as_ref().unwrap();
    let msgs = serde_json::json!([{"role": "user", "content": "hi"}]);
    assert_eq!(
        chat.render(&msgs, true, None, &Default::default()).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(m.eos_token_ids.contains(&2));
    let prompt = m.tokenizer.encode("the yes and no to the is", false).unwrap();
    let reference = logits(&f32_path, &prompt);
    // Worst-case relative logit error allowed per format (4-bit formats are coarse).
    for (dtype, tol) in [
        (GgmlDType::F16, 0.002),
        (GgmlDType::BF16, 0.02),
        (GgmlDType::Q8_0, 0.015),
        (GgmlDType::Q6K, 0.05),
        (GgmlDType::Q5K, 0.08),
        (GgmlDType::Q5_1, 0.08),
        (GgmlDType::Q5_0, 0.08),
        (GgmlDType::Q4K, 0.15),
        (GgmlDType::Q4_1, 0.2),
        (GgmlDType::Q4_0, 0.2),
    ] {
        let p = dir.join(format!("{dtype:?}.gguf"));
        write_gguf(dtype, &p);
        let got = logits(&p, &prompt);
        assert_eq!(got.len(), reference.len());
        let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
            / scale;
        eprintln!("{dtype:?}: max |Δlogit| / max |logit| = {worst:.4}");
        assert!(worst < tol, "{dtype:?}: {worst}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
