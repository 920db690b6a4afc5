//! The default model against the references of `shared/reference/smollm2-135m-instruct.json`
//! (transformers in f32 on the dequantized GGUF, and llama.cpp): tokenizer ids, chat template text,
//! next-token top-1, top-5 overlap and top-5 logprobs.

mod common;

use std::collections::HashSet;

use kvgate_kv::{CpuAttention, KvCache, KvDtype};
use kvgate_model::{load, Batch, LoadOptions};
use serde_json::Value;

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn default_model_matches_the_references() {
    let path = common::default_model();
    let m = load(
        &path,
        &LoadOptions {
            max_model_len: Some(2048),
        },
    )
    .unwrap();
    let r = common::reference();
    // Tokenizer.
    for case in r["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode(text, false).unwrap(),
            ids(&case["ids"]),
            "tokenize {text:?}"
        );
    }
    // Chat template.
    let tmpl = m.chat_template.as_ref().expect("the GGUF has a chat template");
    for case in r["chat_template"].as_array().unwrap() {
        let got = tmpl
            .render(
                &case["messages"],
                case["add_generation_prompt"].as_bool().unwrap(),
                None,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(got, case["text"].as_str().unwrap());
    }
    // Next-token distributions.
    let c = m.model.config().clone();
    let mut worst = 0f32;
    for p in r["prompts"].as_array().unwrap() {
        let prompt = p["prompt"].as_str().unwrap();
        let want_ids = ids(&p["ids"]);
        assert_eq!(
            m.tokenizer.encode(prompt, false).unwrap(),
            want_ids,
            "ids of {prompt:?}"
        );
        let shape = c.cache_shape(16, KvDtype::F32).unwrap();
        let mut cache = KvCache::new(shape, want_ids.len().div_ceil(16));
        let mut b = Batch::single_sequence(&want_ids, 16);
        b.logit_rows = vec![want_ids.len() - 1];
        let logits = m.model.forward(&b, &mut cache, &CpuAttention).unwrap();
        let lp = kvgate_engine::log_softmax(&logits);
        let top5 = kvgate_engine::top_k_of(&lp, 5);
        let hf: Vec<(u32, f32)> = p["hf_top10"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["id"].as_u64().unwrap() as u32, t["logprob"].as_f64().unwrap() as f32))
            .collect();
        let lc: Vec<u32> = p["llama_cpp_top10"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap() as u32)
            .collect();
        assert_eq!(top5[0].0, hf[0].0, "top-1 vs transformers for {prompt:?}");
        assert_eq!(top5[0].0, lc[0], "top-1 vs llama.cpp for {prompt:?}");
        let ours: HashSet<u32> = top5.iter().map(|t| t.0).collect();
        let theirs: HashSet<u32> = hf[..5].iter().map(|t| t.0).collect();
        assert!(
            ours.intersection(&theirs).count() >= 4,
            "top-5 overlap for {prompt:?}: {top5:?} vs {:?}",
            &hf[..5]
        );
        for (id, want) in &hf[..5] {
            let d = (lp[*id as usize] - want).abs();
            worst = worst.max(d);
            // The issue allows 0.25 (llama.cpp is off by up to 0.21); kvgate computes with f32 activations
            // against the packed weights and matches the dequantized reference almost exactly.
            assert!(
                d <= 0.01,
                "logprob of {id} for {prompt:?}: {} vs {want}",
                lp[*id as usize]
            );
        }
    }
    eprintln!("max |Δ logprob| over the hf top-5s: {worst:.4}");
}
