//! vLLM's render endpoints (in-process, tiny model): `/v1/chat/completions/render` and
//! `/v1/completions/render` answer the token ids the real call would prefill (what `/tokenize` says
//! for the same messages or prompts), with the same 400s as the real call, and the routers' own fields
//! pass on both.

mod common;

use common::{assert_openai_error, InProcess};
use serde_json::json;

#[test]
fn render_answers_the_prompt_tokens_with_the_real_calls_checks() {
    let s = InProcess::tiny(&[]);
    let messages = json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}]);
    let (st, r) = s.post(
        "/v1/chat/completions/render",
        &json!({"messages": messages, "max_tokens": 7, "no_stop_trim": false, "return_hidden_states": false}),
    );
    assert_eq!(st, 200, "{r}");
    let (_, t) = s.post("/tokenize", &json!({"messages": messages}));
    assert_eq!(r["token_ids"], t["tokens"]);
    assert_eq!(r["sampling_params"]["max_tokens"], 7);
    assert!(r["request_id"].as_str().unwrap().starts_with("chatcmpl"));

    let (st, r) = s.post(
        "/v1/completions/render",
        &json!({"prompt": ["Hello world", "Bye"], "max_tokens": 3, "logprobs": 2}),
    );
    assert_eq!(st, 200, "{r}");
    let list = r.as_array().unwrap();
    assert_eq!(list.len(), 2);
    for (item, text) in list.iter().zip(["Hello world", "Bye"]) {
        let (_, t) = s.post("/tokenize", &json!({"prompt": text}));
        assert_eq!(item["token_ids"], t["tokens"]);
        assert_eq!(item["sampling_params"]["logprobs"], 2);
    }

    // the real call's checks, the real call's 400s
    for (path, body, param) in [
        (
            "/v1/completions/render",
            json!({"prompt": "x", "max_tokens": 0}),
            "max_tokens",
        ),
        (
            "/v1/completions/render",
            json!({"prompt": "x", "no_stop_trim": true}),
            "no_stop_trim",
        ),
        (
            "/v1/chat/completions/render",
            json!({"messages": messages, "frobnicate": 1}),
            "frobnicate",
        ),
        ("/v1/chat/completions/render", json!({"messages": []}), "messages"),
    ] {
        let (st, e) = s.post(path, &body);
        let real = path.trim_end_matches("/render");
        let (st_real, e_real) = s.post(real, &body);
        assert_openai_error(st, &e, 400);
        assert_eq!(
            (st, &e["error"]["param"]),
            (st_real, &e_real["error"]["param"]),
            "{path}: {e} vs {e_real}"
        );
        assert_eq!(e["error"]["param"], param, "{e}");
    }
}
