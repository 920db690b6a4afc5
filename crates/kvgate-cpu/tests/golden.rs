//! Architecture correctness: the random-weight fixtures of `shared/reference/tiny/` (Llama, Qwen2, Qwen3,
//! Gemma 3), loaded from safetensors, reproduce the Hugging Face logits at every position to 1e-4.

use std::path::PathBuf;

use kvgate_cpu::{prepare, Batch, CpuLayout, Model};
use kvgate_kv::{CpuAttention, KvCache, KvDtype};
use kvgate_model::load_hf_dir;

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch)
}

fn check(arch: &str) {
    let dir = fixture(arch);
    let (cfg, stored, _) = load_hf_dir(&dir).unwrap();
    let model = Model::new(
        cfg.clone(),
        prepare::weights(stored, CpuLayout::default()).unwrap(),
        512,
    )
    .unwrap();
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("golden.json")).unwrap()).unwrap();
    for seq in golden["sequences"].as_array().unwrap() {
        let ids: Vec<u32> = seq["input_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let shape = cfg.cache_shape(4, KvDtype::F32).unwrap();
        let mut cache = KvCache::new(shape, 16);
        let logits = model
            .forward(&Batch::single_sequence(&ids, 4), &mut cache, &CpuAttention)
            .unwrap();
        let vocab = cfg.vocab_size;
        let want = seq["logits"].as_array().unwrap();
        let mut worst = 0f64;
        for (pos, row) in want.iter().enumerate() {
            for (i, w) in row.as_array().unwrap().iter().enumerate() {
                let d = (logits[pos * vocab + i] as f64 - w.as_f64().unwrap()).abs();
                worst = worst.max(d);
            }
            let argmax = (0..vocab)
                .max_by(|&a, &b| logits[pos * vocab + a].total_cmp(&logits[pos * vocab + b]))
                .unwrap();
            assert_eq!(
                argmax as u64,
                seq["argmax"][pos].as_u64().unwrap(),
                "{arch} argmax at {pos}"
            );
        }
        assert!(worst < 1e-4, "{arch}: max |Δlogit| {worst}");
    }
}

#[test]
fn llama_matches_transformers() {
    check("llama");
}

#[test]
fn qwen2_matches_transformers() {
    check("qwen2");
}

#[test]
fn qwen3_matches_transformers() {
    check("qwen3");
}

#[test]
fn gemma3_matches_transformers() {
    check("gemma3_text");
}
