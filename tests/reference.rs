//! The default model against the references of `shared/reference/smollm2-135m-instruct.json`
//! (transformers in f32 on the dequantized GGUF, and llama.cpp): tokenizer ids, chat template text,
//! next-token top-1, top-5 overlap and top-5 logprobs.

mod common;

use std::collections::HashSet;

use kvgate_cpu::load;
use kvgate_model::LoadOptions;

#[test]
fn default_model_matches_the_references() {
    let path = common::default_model();
    let m = load(
        &path,
        &LoadOptions {
            max_model_len: Some(2048),
            int8_activations: false,
            f32_weights: false,
            chat_template: None,
        },
    )
    .unwrap();
    let r = common::reference();
    // Tokenizer.
    for case in r["tokenize"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            m.tokenizer.encode(text, false).unwrap(),
            common::ids(&case["ids"]),
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
    let (mut worst, mut worst_int8, mut worst_llama) = (0f32, 0f32, 0f32);
    let (mut sum_int8, mut sum_llama, mut n) = (0f32, 0f32, 0);
    for p in r["prompts"].as_array().unwrap() {
        let prompt = p["prompt"].as_str().unwrap();
        let want_ids = common::ids(&p["ids"]);
        assert_eq!(
            m.tokenizer.encode(prompt, false).unwrap(),
            want_ids,
            "ids of {prompt:?}"
        );
        let lp = common::next_token_logprobs(&m.model, &want_ids, false);
        let top5 = kvgate_engine::top_k_of(&lp, 5);
        let hf: Vec<(u32, f32)> = p["hf_top10"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["id"].as_u64().unwrap() as u32, t["logprob"].as_f64().unwrap() as f32))
            .collect();
        let lc_top: Vec<(u32, f32)> = p["llama_cpp_top10"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["id"].as_u64().unwrap() as u32, t["logprob"].as_f64().unwrap() as f32))
            .collect();
        let lc: Vec<u32> = lc_top.iter().map(|t| t.0).collect();
        // The 8-bit-activation path (completions' default; the same weights, the rows flagged): top-1 as
        // transformers on every prompt, top-5 logprobs in llama.cpp's class (it computes this way too).
        let lp8 = common::next_token_logprobs(&m.model, &want_ids, true);
        assert_eq!(
            kvgate_engine::top_k_of(&lp8, 1)[0].0,
            hf[0].0,
            "int8 top-1 for {prompt:?}: {:?} vs {:?}",
            kvgate_engine::top_k_of(&lp8, 4),
            &hf[..4]
        );
        for (id, want) in &hf[..5] {
            worst_int8 = worst_int8.max((lp8[*id as usize] - want).abs());
            if let Some((_, l)) = lc_top.iter().find(|t| t.0 == *id) {
                worst_llama = worst_llama.max((l - want).abs());
                sum_int8 += (lp8[*id as usize] - want).abs();
                sum_llama += (l - want).abs();
                n += 1;
            }
        }
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
    let (mean_int8, mean_llama) = (sum_int8 / n as f32, sum_llama / n as f32);
    eprintln!(
        "max |Δ logprob| over the hf top-5s: f32 activations {worst:.4}, int8 activations {worst_int8:.4} \
         (mean {mean_int8:.4}), llama.cpp {worst_llama:.4} (mean {mean_llama:.4})"
    );
    // Rounding activations to 8 bits is discontinuous: an f32-rounding-sized change of one input can
    // move its step, and the network amplifies it, so the 8-bit result is one draw of the quantization
    // noise (llama.cpp's is another: 0.21 here; across kvgate's versions 0.28–0.35 on these 8 prompts,
    // whose mean 0.07–0.08 is llama.cpp's 0.07; tests/gguf_real_weights.rs compares the two on 64
    // prompts of three models). The bound is what such draws stay within; a wrong offset term (the exact
    // instead of the quantized block sum) gave 0.63 and a top-1 flip.
    assert!(
        worst_int8 <= 0.5,
        "int8 activations: {worst_int8} from transformers (llama.cpp {worst_llama})"
    );
}
