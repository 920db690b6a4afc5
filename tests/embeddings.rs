//! `/v1/embeddings`: the wire (floats and base64 of the same f32 values, batches in order, token-id
//! inputs, usage, vLLM's `normalize` and `truncate_prompt_tokens`) and every refusal a 400 naming the
//! field, the limit and the value, on the tiny model in process; and on the default model, the engine's
//! pooled embeddings (f32 KV, the default, and fp8 KV) against an f32 reference — the same GGUF with
//! every weight dequantized to f32, one plain forward pass, pooled in f64 — at cosine ≥ 0.999.

mod common;

use std::sync::Arc;

use base64::Engine as _;
use common::{assert_openai_error, InProcess};
use kvgate_cpu::{load, Batch, CpuBackend, CpuCache, Output, Want};
use kvgate_engine::{start, EmbedRequest, EngineConfig, Pooling};
use kvgate_kv::{KvDtype, KvQuant};
use kvgate_model::LoadOptions;
use serde_json::{json, Value};

fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    dot / (norm(a) * norm(b))
}

#[test]
fn the_wire_and_its_refusals() {
    let s = InProcess::tiny(&[]);
    let (st, f) = s.post(
        "/v1/embeddings",
        &json!({"input": ["the sea", "a long walk by the sea", "the sea"], "encoding_format": "float"}),
    );
    assert_eq!(st, 200, "{f}");
    assert_eq!(
        (f["object"].as_str(), f["data"][0]["object"].as_str()),
        (Some("list"), Some("embedding"))
    );
    assert!(f["id"].as_str().unwrap().starts_with("embd-"));
    let data = f["data"].as_array().unwrap();
    assert_eq!(
        data.iter().map(|d| d["index"].as_u64().unwrap()).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    let vs: Vec<Vec<f32>> = data.iter().map(|d| floats(&d["embedding"])).collect();
    let dim = vs[0].len();
    assert!(dim > 0 && vs.iter().all(|v| v.len() == dim));
    assert!(vs.iter().all(|v| (norm(v) - 1.0).abs() < 1e-5), "normalized by default");
    assert_eq!(vs[0], vs[2], "the same text, the same vector");
    assert_ne!(vs[0], vs[1]);
    let u = &f["usage"];
    assert_eq!(u["prompt_tokens"], u["total_tokens"]);
    assert!(u["prompt_tokens"].as_u64().unwrap() > 0);

    // base64 is the little-endian bytes of the same f32 values
    let (st, b) = s.post(
        "/v1/embeddings",
        &json!({"input": "the sea", "encoding_format": "base64"}),
    );
    assert_eq!(st, 200, "{b}");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][0]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_eq!(decoded, vs[0]);

    // token ids, one list or several; `dimensions` equal to the model's is fine
    let (st, t) = s.post(
        "/v1/embeddings",
        &json!({"input": [[5, 6, 7], [8]], "dimensions": dim, "encoding_format": "float"}),
    );
    assert_eq!(st, 200, "{t}");
    assert_eq!(
        (
            t["data"].as_array().unwrap().len(),
            t["usage"]["prompt_tokens"].as_u64()
        ),
        (2, Some(4))
    );
    let (st, one) = s.post(
        "/v1/embeddings",
        &json!({"input": [5, 6, 7], "encoding_format": "float"}),
    );
    assert_eq!(st, 200);
    assert_eq!(one["data"][0]["embedding"], t["data"][0]["embedding"]);
    // vLLM's extensions: no normalization; keep the last k tokens
    let (_, raw) = s.post("/v1/embeddings", &json!({"input": [5, 6, 7], "normalize": false}));
    let raw = floats(&raw["data"][0]["embedding"]);
    assert!((norm(&raw) - 1.0).abs() > 1e-3, "not normalized: {}", norm(&raw));
    assert!(cosine(&raw, &floats(&one["data"][0]["embedding"])) > 0.99999);
    let (_, cut) = s.post(
        "/v1/embeddings",
        &json!({"input": [1, 2, 5, 6, 7], "truncate_prompt_tokens": 3}),
    );
    assert_eq!(cut["data"][0]["embedding"], one["data"][0]["embedding"]);
    assert_eq!(cut["usage"]["prompt_tokens"], 3);

    let too_many: Vec<&str> = vec!["x"; 2049];
    let long: Vec<u32> = vec![5; 100_000];
    for (body, param, says) in [
        (json!({}), "input", "required"),
        (json!({"input": []}), "input", "not be empty"),
        (json!({"input": [""]}), "input", "input 0 is empty"),
        (json!({"input": [1, 2, 1_000_000]}), "input", "size"),
        (json!({"input": [["a"]]}), "input", "not a token id"),
        (json!({"input": {"text": "a"}}), "input", "must be a string"),
        (
            json!({"input": too_many}),
            "input",
            "at most 2048 inputs per request, got 2049",
        ),
        (json!({"input": long}), "input", "100000 tokens"),
        (json!({"input": "a", "dimensions": 8}), "dimensions", "got 8"),
        (
            json!({"input": "a", "encoding_format": "int8"}),
            "encoding_format",
            "\"int8\"",
        ),
        (
            json!({"input": "a", "truncate_prompt_tokens": 0}),
            "truncate_prompt_tokens",
            "got 0",
        ),
        (json!({"input": "a", "messages": []}), "messages", "messages"),
    ] {
        let (st, e) = s.post("/v1/embeddings", &body);
        assert_openai_error(st, &e, 400);
        let msg = e["error"]["message"].as_str().unwrap();
        assert_eq!(e["error"]["param"], param, "{says}: {msg}");
        assert!(msg.contains(says), "{says}: {msg}");
    }
    let (st, e) = s.post("/v1/embeddings", &json!({"input": "a", "model": "nope"}));
    assert_openai_error(st, &e, 404);
}

/// Every row's final hidden state of `ids`, one plain forward pass of `model` over an f32 cache.
fn hidden_rows(model: &kvgate_cpu::Model, ids: &[u32]) -> Vec<f32> {
    let shape = model.config().cache_shape(16, KvDtype::F32).unwrap();
    let mut cache = kvgate_kv::KvCache::new(shape, ids.len().div_ceil(16));
    let mut b = Batch::single_sequence(ids, 16);
    b.outputs = (0..ids.len())
        .map(|row| Output {
            row,
            want: Want::Hidden,
        })
        .collect();
    model
        .forward_split(&b, &mut cache, &kvgate_kv::CpuAttention, false)
        .unwrap()
        .hidden
}

fn pool(rows: &[f32], d: usize, pooling: Pooling) -> Vec<f32> {
    match pooling {
        Pooling::Last => rows[rows.len() - d..].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; d];
            for r in rows.chunks_exact(d) {
                sum.iter_mut().zip(r).for_each(|(s, &x)| *s += x as f64);
            }
            sum.iter().map(|s| (s / (rows.len() / d) as f64) as f32).collect()
        }
    }
}

#[test]
fn default_model_embeddings_match_an_f32_reference() {
    let path = common::default_model();
    let opts = |f32_weights| LoadOptions {
        max_model_len: Some(2048),
        int8_activations: false,
        f32_weights,
        chat_template: None,
    };
    let reference = load(&path, &opts(true)).unwrap();
    let d = reference.model.config().hidden_size;
    let tok = &reference.tokenizer;
    let mut texts: Vec<String> = [
        "Hello",
        "The order shipped late and the customer wants a refund.",
        "def add(a, b):\n    return a + b",
        "Quarterly revenue grew 12% while costs fell; the board approved the dividend.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    texts.push("A long state for an agent: the user asked about shipping, then billing. ".repeat(24));
    let inputs: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t, true).unwrap()).collect();
    let want: Vec<Vec<f32>> = inputs.iter().map(|ids| hidden_rows(&reference.model, ids)).collect();
    drop(reference);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for kv in [KvDtype::F32, KvDtype::Fp8E4m3] {
        let m = load(&path, &opts(false)).unwrap();
        let cfg = EngineConfig {
            max_model_len: 2048,
            model_name: "smollm2".into(),
            ..Default::default()
        };
        let cache = CpuCache {
            dtype: kv,
            quant: KvQuant::default_for(kv),
            ..Default::default()
        };
        let backend = Box::new(CpuBackend::with_cache(m.model, cache).unwrap());
        let h = start(backend, Arc::new(m.tokenizer), m.eos_token_ids, cfg).unwrap();
        let mut worst = 1f64;
        for pooling in [Pooling::Last, Pooling::Mean] {
            for (ids, rows) in inputs.iter().zip(&want) {
                let got = rt
                    .block_on(
                        h.embed(EmbedRequest {
                            prompt: ids.clone(),
                            pooling,
                            normalize: true,
                            cache_salt: None,
                        })
                        .unwrap()
                        .outcome(),
                    )
                    .unwrap();
                assert_eq!(got.embedding.len(), d);
                let c = cosine(&got.embedding, &pool(rows, d, pooling));
                assert!(c >= 0.999, "{kv:?} {pooling:?}, {} tokens: cosine {c}", ids.len());
                worst = worst.min(c);
            }
        }
        eprintln!("{kv:?} KV: worst cosine to the f32 reference {worst:.6}");
        h.shutdown();
    }
}
