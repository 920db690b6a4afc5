//! What real OpenAI clients send besides the sampling parameters (in-process, tiny model): the
//! harmless fields (`store`, `metadata`, `user`, `service_tier`, `reasoning_effort`) accepted and
//! checked, `stream_options.continuous_usage_stats` (guidellm's default) answered with usage in every
//! chunk as vLLM does, `GET /v1/models/{id}` (`client.models.retrieve()`), and `GET /tokenizer_info`
//! (lm-eval's remote tokenizer).

mod common;

use common::{assert_openai_error, InProcess};
use serde_json::{json, Value};

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

#[test]
fn harmless_fields_are_accepted_and_checked() {
    let s = InProcess::tiny(&[]);
    let extra = json!({"store": true, "metadata": {"team": "routing"}, "user": "u-1",
                       "service_tier": "auto", "reasoning_effort": "low"});
    let (st, plain) = s.post("/v1/chat/completions", &chat(json!({})));
    assert_eq!(st, 200, "{plain}");
    let (st, r) = s.post("/v1/chat/completions", &chat(extra.clone()));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"], plain["choices"], "ignored: the same answer");
    let mut comp = json!({"prompt": "hi", "max_tokens": 4, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        comp[k] = v.clone();
    }
    let (st, r) = s.post("/v1/completions", &comp);
    assert_eq!(st, 200, "{r}");
    let too_many: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    for (bad, field) in [
        (json!({"store": "yes"}), "store"),
        (json!({"metadata": {"k": 1}}), "metadata"),
        (json!({"metadata": too_many}), "metadata"),
        (json!({"service_tier": "gold"}), "service_tier"),
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (
            json!({"stream": true, "stream_options": {"continuous_usage_stats": 1}}),
            "stream_options",
        ),
    ] {
        let (st, r) = s.post("/v1/chat/completions", &chat(bad.clone()));
        assert_openai_error(st, &r, 400);
        assert_eq!(r["error"]["param"], field, "{bad}: {r}");
    }
    // still refused by name: what kvgate cannot do yet
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"prediction": {"type": "content", "content": "x"}})),
    );
    assert_openai_error(st, &r, 400);
    assert!(r["error"]["message"].as_str().unwrap().contains("prediction"), "{r}");
}

/// The JSON chunks of a stream (without `[DONE]`).
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

#[test]
fn continuous_usage_stats_put_usage_in_every_chunk() {
    let s = InProcess::tiny(&[]);
    for (path, body) in [
        (
            "/v1/chat/completions",
            chat(json!({"max_tokens": 6, "ignore_eos": true, "stream": true,
                        "stream_options": {"include_usage": true, "continuous_usage_stats": true}})),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hello there", "max_tokens": 6, "ignore_eos": true, "temperature": 0, "stream": true,
                   "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        ),
    ] {
        let cs = chunks(&s.stream(path, &body));
        let last = cs.last().unwrap();
        assert_eq!(last["choices"], json!([]), "{path}: the final usage chunk");
        assert_eq!(last["usage"]["completion_tokens"], 6);
        let mut prev = 0;
        for c in &cs[..cs.len() - 1] {
            let u = &c["usage"];
            assert_eq!(u["prompt_tokens"], last["usage"]["prompt_tokens"], "{path}: {c}");
            let done = u["completion_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("{path}: no usage in {c}"));
            assert!(done >= prev && done <= 6, "{path}: {c}");
            assert_eq!(
                u["total_tokens"].as_u64(),
                Some(done + u["prompt_tokens"].as_u64().unwrap())
            );
            prev = done;
        }
        assert_eq!(prev, 6, "{path}: the last content chunk counts every token");
        // without it (or without include_usage, as vLLM): usage only at the end
        let mut plain = body.clone();
        plain["stream_options"] = json!({"include_usage": true});
        let cs = chunks(&s.stream(path, &plain));
        assert!(
            cs[..cs.len() - 1]
                .iter()
                .all(|c| c.get("usage").is_none_or(Value::is_null)),
            "{path}"
        );
        plain["stream_options"] = json!({"continuous_usage_stats": true});
        let cs = chunks(&s.stream(path, &plain));
        assert!(cs.iter().all(|c| c.get("usage").is_none_or(Value::is_null)), "{path}");
    }
}

#[test]
fn models_retrieve() {
    let s = InProcess::tiny(&["--served-model-name", "tiny", "org/tiny-chat"]);
    let (_, list) = s.get("/v1/models").unwrap();
    for name in ["tiny", "org/tiny-chat"] {
        let (st, m) = s.get(&format!("/v1/models/{name}")).unwrap();
        assert_eq!(st, 200, "{m}");
        assert_eq!(m["id"], name);
        assert_eq!(m["object"], "model");
        let listed = list["data"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == name)
            .unwrap();
        assert_eq!(&m, listed, "the same object as in the list");
    }
    let (st, r) = s.get("/v1/models/gpt-4o").unwrap();
    assert_openai_error(st, &r, 404);
    assert!(r["error"]["message"].as_str().unwrap().contains("gpt-4o"), "{r}");
}

#[test]
fn max_tokens_0_with_echo_scores_the_prompt() {
    let s = InProcess::tiny(&[]);
    let body =
        json!({"prompt": "the cat sat on the mat", "max_tokens": 0, "echo": true, "logprobs": 1, "temperature": 0});
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    assert_eq!(c["text"], "the cat sat on the mat");
    assert_eq!(c["finish_reason"], "length");
    assert_eq!(r["usage"]["completion_tokens"], 0);
    let lp = &c["logprobs"];
    let n = r["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(lp["tokens"].as_array().unwrap().len(), n, "{lp}");
    assert!(lp["token_logprobs"][0].is_null(), "the first token has no logprob");
    // the same prompt logprobs as a request that also generates
    let (_, one) = s.post(
        "/v1/completions",
        &json!({"prompt": "the cat sat on the mat", "max_tokens": 1, "echo": true, "logprobs": 1, "temperature": 0}),
    );
    let prompt_part: Vec<Value> = one["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap()[..n].to_vec();
    assert_eq!(lp["token_logprobs"].as_array().unwrap(), &prompt_part);
    // without echo, or streamed: a 400 naming max_tokens
    for bad in [
        json!({"prompt": "x", "max_tokens": 0}),
        json!({"prompt": "x", "max_tokens": 0, "echo": true, "stream": true}),
    ] {
        let (st, r) = s.post("/v1/completions", &bad);
        assert_openai_error(st, &r, 400);
        assert_eq!(r["error"]["param"], "max_tokens", "{r}");
    }
}

#[test]
fn an_empty_prompt_is_read_after_the_document_start_token() {
    let s = InProcess::tiny(&[]);
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "", "max_tokens": 3, "temperature": 0, "echo": true}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["usage"]["prompt_tokens"], 1, "{r}");
    assert!(r["choices"][0]["text"].is_string());
    // the same as asking after <|endoftext|> (id 0 in the tiny vocabulary) by id
    let (_, by_id) = s.post(
        "/v1/completions",
        &json!({"prompt": [0], "max_tokens": 3, "temperature": 0}),
    );
    let (_, plain) = s.post(
        "/v1/completions",
        &json!({"prompt": "", "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(plain["choices"][0]["text"], by_id["choices"][0]["text"]);
    // a list with an empty string too
    let (st, r) = s.post("/v1/completions", &json!({"prompt": ["", "hi"], "max_tokens": 1}));
    assert_eq!(st, 200, "{r}");
}

#[test]
fn streamed_echo_carries_the_prompt_logprobs_and_offsets() {
    let s = InProcess::tiny(&[]);
    let body = json!({"prompt": "the cat sat", "max_tokens": 4, "ignore_eos": true, "echo": true, "logprobs": 2, "temperature": 0});
    let (_, whole) = s.post("/v1/completions", &body);
    let want = &whole["choices"][0]["logprobs"];
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let cs = chunks(&s.stream("/v1/completions", &streamed));
    let mut got: serde_json::Map<String, Value> = serde_json::Map::new();
    for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        let all: Vec<Value> = cs
            .iter()
            .filter_map(|c| c["choices"][0]["logprobs"][k].as_array().cloned())
            .flatten()
            .collect();
        got.insert(k.into(), Value::Array(all));
    }
    assert_eq!(
        &Value::Object(got),
        want,
        "the stream's logprobs are the non-streamed ones"
    );
    let text: String = cs.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
}

#[test]
fn tokenizer_info_serves_what_a_remote_tokenizer_reads() {
    // lm-eval's RemoteTokenizer: GET /tokenizer_info (eos_token, bos_token, chat_template), then
    // POST /tokenize {prompt, add_special_tokens: false} → tokens and /detokenize {tokens} → prompt.
    let s = InProcess::tiny(&[]);
    let (st, info) = s.get("/tokenizer_info").unwrap();
    assert_eq!(st, 200, "{info}");
    let eos = info["eos_token"].as_str().expect("eos_token");
    assert!(!eos.is_empty());
    assert!(
        info["chat_template"].as_str().is_some_and(|t| t.contains("messages")),
        "{info}"
    );
    assert!(info["model_max_length"].as_u64().unwrap() > 0);
    let (st, t) = s.post("/tokenize", &json!({"prompt": eos, "add_special_tokens": false}));
    assert_eq!(st, 200);
    assert_eq!(
        t["tokens"].as_array().unwrap().len(),
        1,
        "the eos string is one token: {t}"
    );
    assert_eq!(t["tokens"][0], info["eos_token_ids"][0]);
    let (_, t) = s.post(
        "/tokenize",
        &json!({"prompt": "hello world", "add_special_tokens": false}),
    );
    let (_, d) = s.post("/detokenize", &json!({"tokens": t["tokens"]}));
    assert_eq!(d["prompt"], "hello world");
}

#[test]
fn hostile_corner_values_behave() {
    let s = InProcess::tiny(&[]);
    // a subnormal temperature is greedy (it used to overflow 1/T into garbage); a positive top_p too
    // small for an f32 is still positive (it used to be refused as "got 0")
    let (_, greedy) = s.post(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 6, "temperature": 0}),
    );
    for extra in [json!({"temperature": 1e-39}), json!({"temperature": 1e-45, "seed": 3})] {
        let mut b = json!({"prompt": "hello", "max_tokens": 6});
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (st, r) = s.post("/v1/completions", &b);
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["choices"][0]["text"], greedy["choices"][0]["text"], "{extra}");
    }
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "hello", "max_tokens": 2, "top_p": 5e-324}),
    );
    assert_eq!(st, 200, "{r}");
    // a forged X-Request-Id (spaces, quotes, '=': fields in a text log line) is replaced by kvgate's own
    let body = json!({"prompt": "hi", "max_tokens": 1}).to_string();
    let (_, hs, _) = s
        .raw(
            "POST",
            "/v1/completions",
            &[
                ("Content-Type", "application/json"),
                ("X-Request-Id", "abc\" status=500 forged=\"1"),
            ],
            body.as_bytes(),
        )
        .unwrap();
    let id = hs
        .iter()
        .find(|(k, _)| k == "x-request-id")
        .map(|(_, v)| v.clone())
        .unwrap();
    assert!(id.starts_with("req-") && !id.contains(' '), "{id}");
    let (_, hs, _) = s
        .raw(
            "POST",
            "/v1/completions",
            &[
                ("Content-Type", "application/json"),
                ("X-Request-Id", "trace-42:a/b.c_d"),
            ],
            body.as_bytes(),
        )
        .unwrap();
    assert!(
        hs.iter().any(|(k, v)| k == "x-request-id" && v == "trace-42:a/b.c_d"),
        "{hs:?}"
    );
}

#[test]
fn giant_prompts_are_refused_by_their_bytes_before_tokenizing() {
    // `"a " × 2,000,000` (4 MB): far more bytes than max_model_len tokens can hold; refused without
    // being tokenized, on every route that tokenizes text, naming the limit
    let s = InProcess::tiny(&[]);
    let giant = "a ".repeat(2_000_000);
    let cases = [
        ("/v1/completions", json!({"prompt": giant, "max_tokens": 1}), "prompt"),
        (
            "/v1/completions",
            json!({"prompt": ["ok", giant], "max_tokens": 1}),
            "prompt",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": giant}], "max_tokens": 1}),
            "messages",
        ),
        ("/tokenize", json!({"prompt": giant}), "prompt"),
        (
            "/tokenize",
            json!({"messages": [{"role": "user", "content": giant}]}),
            "messages",
        ),
    ];
    for (path, body, field) in cases {
        let (st, r) = s.post(path, &body);
        assert_openai_error(st, &r, 400);
        assert_eq!(r["error"]["param"], field, "{path}");
        let msg = r["error"]["message"].as_str().unwrap();
        assert!(msg.contains("4000000 bytes") && msg.contains("not tokenized"), "{msg}");
        assert!(msg.contains("maximum context length is"), "{msg}");
    }
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": giant, "questions": {"q": {"type": "noul", "instructions": "ok?"}}}),
    );
    assert_eq!(st, 400, "{r}");
    assert!(r.to_string().contains("not tokenized"), "{r}");
    let (st, _) = s.get("/health").unwrap();
    assert_eq!(st, 200);
    // a prompt just inside the context still works
    let (st, r) = s.post("/v1/completions", &json!({"prompt": "a ".repeat(100), "max_tokens": 1}));
    assert_eq!(st, 200, "{r}");
}

/// vLLM's `allowed_token_ids` (only those are sampled) and `bad_words` (never generated), on both
/// endpoints; bad values are a 400 naming the field.
#[test]
fn allowed_token_ids_and_bad_words() {
    let s = InProcess::tiny(&[]);
    let (st, r) = s.post("/tokenize", &json!({"prompt": "b"}));
    assert_eq!(st, 200, "{r}");
    let b = r["tokens"][0].as_u64().unwrap();
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "ignore_eos": true, "allowed_token_ids": [b]}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["text"], "bbbb", "{r}");
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 3, "temperature": 0, "ignore_eos": true, "allowed_token_ids": [b]})),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], "bbb", "{r}");
    // bad_words: whatever greedy decoding writes first is then never written
    let body = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let (_, r) = s.post("/v1/completions", &body);
    let text = r["choices"][0]["text"].as_str().unwrap().to_string();
    let first = text.chars().find(|c| c.is_alphanumeric()).expect("a letter");
    let mut banned = body.clone();
    banned["bad_words"] = json!([first.to_string()]);
    let (st, r) = s.post("/v1/completions", &banned);
    assert_eq!(st, 200, "{r}");
    let again = r["choices"][0]["text"].as_str().unwrap();
    assert!(!again.contains(first), "{first:?} in {again:?} (was {text:?})");
    for (extra, field) in [
        (json!({"allowed_token_ids": []}), "allowed_token_ids"),
        (json!({"allowed_token_ids": [999999]}), "allowed_token_ids"),
        (json!({"bad_words": [""]}), "bad_words"),
    ] {
        let mut b = body.clone();
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        let (st, r) = s.post("/v1/completions", &b);
        assert_eq!(st, 400, "{b}: {r}");
        assert_eq!(r["error"]["param"], field, "{r}");
    }
}

#[test]
fn prompt_logprobs_come_back_as_vllm_writes_them() {
    let s = InProcess::tiny(&[]);
    let body = json!({"prompt": "the cat sat on the mat", "max_tokens": 2, "temperature": 0,
                      "prompt_logprobs": 3, "echo": true, "logprobs": 1});
    let (st, r) = s.post("/v1/completions", &body);
    assert_eq!(st, 200, "{r}");
    let plp = r["choices"][0]["prompt_logprobs"]
        .as_array()
        .expect("prompt_logprobs")
        .clone();
    let n = r["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(plp.len(), n);
    assert!(plp[0].is_null(), "nothing predicts the first token");
    let legacy = &r["choices"][0]["logprobs"];
    for (i, pos) in plp.iter().enumerate().skip(1) {
        let m = pos.as_object().unwrap();
        assert!((3..=4).contains(&m.len()), "the prompt token and the top 3: {pos}");
        let (id, own) = m.iter().next().unwrap();
        let rank = own["rank"].as_u64().unwrap() as usize;
        // the first entry is the prompt token: the legacy echo's logprob of the same position
        assert_eq!(own["logprob"], legacy["token_logprobs"][i], "position {i}");
        assert_eq!(own["decoded_token"], legacy["tokens"][i]);
        let mut ranks: Vec<usize> = m
            .values()
            .skip(1)
            .map(|v| v["rank"].as_u64().unwrap() as usize)
            .collect();
        if m.len() == 3 {
            ranks.push(rank); // the prompt token is among the top 3
        }
        ranks.sort();
        assert_eq!(ranks, [1, 2, 3], "position {i}: {pos}");
        for (k, v) in m {
            let better = m
                .values()
                .filter(|w| w["logprob"].as_f64() > v["logprob"].as_f64())
                .count();
            let r = v["rank"].as_u64().unwrap() as usize;
            if k == id && m.len() == 4 {
                assert!(r > 3, "outside the top 3, ranked {r}");
            } else {
                assert_eq!(r, better + 1, "rank of {k}");
            }
            assert!(k.parse::<u32>().is_ok());
        }
    }
    // the answer is the one without them
    let (_, plain) = s.post(
        "/v1/completions",
        &json!({"prompt": "the cat sat on the mat", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(plain["choices"][0]["prompt_logprobs"], Value::Null);
    assert!(
        plain["choices"][0].get("prompt_logprobs").is_none(),
        "omitted unless asked"
    );

    // chat: at the top level, one entry per prompt token
    let (st, c) = s.post("/v1/chat/completions", &chat(json!({"prompt_logprobs": 0})));
    assert_eq!(st, 200, "{c}");
    let plp = c["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(plp.len() as u64, c["usage"]["prompt_tokens"].as_u64().unwrap());
    assert!(plp[1..].iter().all(|p| p.as_object().unwrap().len() == 1));

    for (bad, says) in [
        (json!({"prompt_logprobs": 21}), "between 0 and 20, got 21"),
        (
            json!({"prompt_logprobs": 1, "stream": true}),
            "not available with 'stream'",
        ),
    ] {
        let (st, e) = s.post("/v1/chat/completions", &chat(bad));
        assert_openai_error(st, &e, 400);
        assert_eq!(e["error"]["param"], "prompt_logprobs");
        assert!(e["error"]["message"].as_str().unwrap().contains(says), "{e}");
    }
}
