//! `serve --speculative-config` on the default model, both methods: prompt lookup, and a draft model
//! (the default model drafting for itself: a draft with the target's tokenizer). A greedy chat
//! completion, streamed and not, is the text the server writes without speculation, and vLLM's
//! `spec_decode_*` counters show proposals were made and kept. A draft whose vocabulary is not the
//! target's is refused at startup with the reason.

mod common;

use std::process::Command;

use common::Server;
use serde_json::{json, Value};

fn body(stream: bool) -> Value {
    json!({
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": "Write the numbers from one to thirty in words, separated by commas."}],
        "max_tokens": 80,
        "temperature": 0,
        "stream": stream,
    })
}

/// The completion's text, non-streamed and streamed (they must agree).
fn text(s: &Server) -> String {
    let (st, v) = s.post("/v1/chat/completions", &body(false));
    assert_eq!(st, 200, "{v}");
    let whole = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let streamed: String = s
        .stream("/v1/chat/completions", &body(true))
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, whole, "streamed and non-streamed text agree");
    whole
}

#[test]
fn both_methods_write_the_text_written_without_speculation() {
    let plain = text(&Server::start(&[]));
    assert!(!plain.is_empty());
    let draft = common::default_model();
    let draft_config = json!({
        "method": "draft_model",
        "model": draft.to_str().unwrap(),
        "num_speculative_tokens": 4,
    })
    .to_string();
    for config in [
        r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 2, "prompt_lookup_max": 4}"#,
        draft_config.as_str(),
    ] {
        let s = Server::start(&["--speculative-config", config]);
        assert_eq!(text(&s), plain, "{config}");
        let (proposed, kept) = (
            s.metric("vllm:spec_decode_num_draft_tokens_total"),
            s.metric("vllm:spec_decode_num_accepted_tokens_total"),
        );
        assert!(
            proposed > 0.0 && kept > 0.0,
            "{config}: {kept} of {proposed} proposed tokens kept"
        );
    }
}

#[test]
fn a_draft_with_another_vocabulary_is_refused_by_name() {
    let Some(dir) = common::test_models_dir() else {
        return;
    };
    let other = dir.join("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if !other.is_file() {
        eprintln!("{}: not found, skipped", other.display());
        return;
    }
    let config = json!({"method": "draft_model", "model": other.to_str().unwrap(), "num_speculative_tokens": 3});
    let out = Command::new(env!("CARGO_BIN_EXE_serve"))
        .args(["--model", common::default_model().to_str().unwrap(), "--port", "0"])
        .args([
            "--kv-cache-memory",
            "64MiB",
            "--speculative-config",
            &config.to_string(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("its vocabulary has 151936 tokens, the target's 49152"),
        "{err}"
    );
}
