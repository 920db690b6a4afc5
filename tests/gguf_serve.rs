//! `serve` on the real-weight GGUFs (Gemma-3-270M and Qwen2.5-Coder-0.5B Q4_K_M, from
//! scripts/fetch-test-models.sh): both start and answer; Gemma 3, a base model with no chat template,
//! serves `/v1/completions` and refuses chat with a 400 that says why (and, given `--chat-template
//! templates/gemma.jinja`, renders Gemma's turns and serves chat and decisions; given
//! `templates/completion.jinja`, plain text turns); past its 512-token sliding window the next-token distribution is the exact one (tests/fixtures/gguf-llamacpp-logprobs.json's numpy
//! reference) whether the prompt is prefilled in chunks of 64 or found in the prefix cache; Qwen's chat
//! template renders byte for byte as its own Jinja template does in transformers
//! (tests/fixtures/qwen-chat-template.json, by scripts/chat-template-fixture.py), with and without tools.
//! Without the GGUFs the tests say so and check nothing.

mod common;

use common::Server;
use serde_json::{json, Value};

fn gguf(file: &str) -> Option<String> {
    let path = common::test_models_dir()?.join(file);
    if !path.is_file() {
        eprintln!("{}: not found, skipped", path.display());
        return None;
    }
    Some(path.to_string_lossy().into_owned())
}

/// The top-5 logprob values of a legacy completions `logprobs` entry, highest first.
fn top_values(lp: &Value) -> Vec<f32> {
    let mut v: Vec<f32> = lp["top_logprobs"][0]
        .as_object()
        .unwrap()
        .values()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    v.sort_by(|a, b| b.total_cmp(a));
    v
}

#[test]
fn gemma_serves_completions_refuses_chat_and_slides_exactly() {
    let Some(model) = gguf("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let fx = common::fixture("gguf-llamacpp-logprobs.json");
    let long = fx["models"]["gemma"]["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ids"].as_array().unwrap().len() > 512)
        .expect("a case past the window");
    let exact: Vec<f32> = long["f32_top10"].as_array().unwrap()[..5]
        .iter()
        .map(|t| t["logprob"].as_f64().unwrap() as f32)
        .collect();
    // exact arithmetic (completions default to 8-bit activations), to compare with the exact forward
    let s = Server::start(&[
        "--model",
        &model,
        "--max-num-batched-tokens",
        "64",
        "--max-model-len",
        "2048",
        "--activations",
        "f32",
    ]);
    let body = json!({"prompt": long["prompt"], "max_tokens": 1, "temperature": 0, "logprobs": 5});
    let (st, cold) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{cold}");
    let n = long["ids"].as_array().unwrap().len() as u64;
    assert_eq!(cold["usage"]["prompt_tokens"], n);
    let (st, warm) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{warm}");
    let cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        cached >= 512,
        "the second read comes from the prefix cache ({cached} tokens)"
    );
    let (a, b) = (
        top_values(&cold["choices"][0]["logprobs"]),
        top_values(&warm["choices"][0]["logprobs"]),
    );
    eprintln!("{n}-token prompt: chunks of 64 {a:?}, from the cache {b:?}, exact {exact:?}");
    for ((x, y), e) in a.iter().zip(&b).zip(&exact) {
        assert!((x - y).abs() <= 1e-4, "chunked {x} vs cached {y}");
        assert!((x - e).abs() <= 0.005, "chunked {x} vs exact {e}");
    }
    assert_eq!(
        cold["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        warm["choices"][0]["logprobs"]["top_logprobs"][0]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>()
    );
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    assert!(!r["choices"][0]["text"].as_str().unwrap().is_empty());
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
    );
    common::assert_openai_error(st, &r, 400);
    let msg = r["error"]["message"].as_str().unwrap();
    assert!(msg.contains("template"), "{msg}");
}

#[test]
fn gemma_serves_chat_and_decisions_with_a_given_template() {
    let Some(model) = gguf("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let s = with_template(&model, "gemma.jinja");
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "Capital of France?"}
    ]);
    let text = "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n\
                <start_of_turn>user\nCapital of France?<end_of_turn>\n<start_of_turn>model\n";
    let rendered = assert_renders(&s, &messages, text, "Gemma's turn format");
    assert_eq!(rendered["tokens"][0], 2, "one <bos>");
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": messages, "max_tokens": 4, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], rendered["count"]);
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": "My card was charged twice.", "questions": {
            "team": {"type": "choice", "instructions": "Which team?",
                     "criteria": {"billing": "Payments", "technical": "Bugs", "sales": "Plans"}}}}),
    );
    assert_eq!(st, 200, "{r}");
    let p = &r["answers"]["team"]["probabilities"];
    let total: f64 = ["billing", "technical", "sales"]
        .iter()
        .map(|k| p[*k].as_f64().unwrap())
        .sum();
    assert!((total - 1.0).abs() < 1e-5, "{r}");
    drop(s);
    // the plain-text template for base models
    let s = with_template(&model, "completion.jinja");
    let text = "<bos>Be brief.\n\nHi\n\nAnswer:\nHello\n\nCapital of France?\n\nAnswer:\n";
    assert_renders(&s, &messages, text, "plain turns");
}

/// `serve` on `model` with `templates/<file>` as its chat template.
fn with_template(model: &str, file: &str) -> Server {
    let template = format!("{}/templates/{file}", env!("CARGO_MANIFEST_DIR"));
    Server::start(&[
        "--model",
        model,
        "--chat-template",
        &template,
        "--max-model-len",
        "2048",
    ])
}

/// Checks that `messages` render (with the generation prompt) to the tokens of `text`; returns the
/// rendering (`/tokenize`'s answer).
fn assert_renders(s: &Server, messages: &Value, text: &str, what: &str) -> Value {
    let (st, rendered) = s.post(
        "/tokenize",
        &json!({"messages": messages, "add_generation_prompt": true}),
    );
    assert_eq!(st, 200, "{rendered}");
    let (st, want) = s.post("/tokenize", &json!({"prompt": text, "add_special_tokens": false}));
    assert_eq!(st, 200, "{want}");
    assert_eq!(rendered["tokens"], want["tokens"], "{what}");
    rendered
}

#[test]
fn qwen_serves_chat_and_renders_its_own_template() {
    let Some(model) = gguf("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf") else {
        return;
    };
    let fx = common::fixture("qwen-chat-template.json");
    let lm = kvgate_cpu::load(
        std::path::Path::new(&model),
        &kvgate_model::LoadOptions {
            max_model_len: Some(512),
            int8_activations: false,
            f32_weights: false,
            chat_template: None,
        },
    )
    .unwrap();
    let t = lm.chat_template.as_ref().expect("Qwen's GGUF carries a chat template");
    for c in fx["cases"].as_array().unwrap() {
        let got = t
            .render(
                &c["messages"],
                c["add_generation_prompt"].as_bool().unwrap(),
                c.get("tools"),
                &Default::default(),
            )
            .unwrap();
        assert_eq!(got, c["rendered"].as_str().unwrap(), "{}", c["name"]);
    }
    drop(lm);
    let s = Server::start(&["--model", &model]);
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(text.contains('4'), "{text}");
    // Tools go through Qwen's own template; its <tool_call> (or fenced JSON) answer is parsed.
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "add", "description": "Add two integers",
         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                        "required": ["a", "b"]}}}
    ]);
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is 17 + 25? Use the tool."}],
                "tools": tools, "max_tokens": 60, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    let call = &c["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "add", "{r}");
    let args: serde_json::Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"a": 17, "b": 25}));
    // and the conversation goes on with the result, rendered back by the template
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": [
            {"role": "user", "content": "What is 17 + 25?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 17, \"b\": 25}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}],
            "tools": tools, "max_tokens": 20, "temperature": 0}),
    );
    assert_eq!(st, 200, "{r}");
}
