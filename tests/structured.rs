//! Structured outputs and tool calls through the HTTP surface (in-process, tiny random-weight model,
//! whose unconstrained output is noise, so every valid answer below is the grammar's doing):
//! `response_format` (json_schema, json_object, text), `structured_outputs`, the `guided_*` fields,
//! on chat and completions, with `n` > 1 and streaming; invalid grammars and conflicting constraints
//! are 400s naming the field; `tools` with `tool_choice` required / named / auto / none, tool calls in
//! the message and as stream deltas, tool history rendered back; constrained requests still hit the
//! prefix cache.

mod common;

use common::{assert_openai_error, InProcess};
use serde_json::{json, Value};

fn chat(extra: Value) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Describe a person."}],
                       "max_tokens": 120, "temperature": 1.0, "seed": 3});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
            "role": {"enum": ["admin", "user"]}
        },
        "required": ["name", "age", "role"],
        "additionalProperties": false
    })
}

fn is_person(text: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    v["name"].as_str().is_some_and(|n| n.chars().count() <= 8)
        && v["age"].as_u64().is_some_and(|a| a <= 99)
        && ["admin", "user"].contains(&v["role"].as_str().unwrap_or(""))
        && v.as_object().is_some_and(|o| o.len() == 3)
}

#[test]
fn json_schema_json_object_and_vllm_fields_constrain_chat_and_completions() {
    let s = InProcess::tiny(&[]);
    let rf =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}});
    let (st, r) = s.post("/v1/chat/completions", &chat(json!({"response_format": rf, "n": 3})));
    assert_eq!(st, 200, "{r}");
    for c in r["choices"].as_array().unwrap() {
        let text = c["message"]["content"].as_str().unwrap();
        assert!(is_person(text), "{text}");
        assert_eq!(c["finish_reason"], "stop");
    }
    for extra in [
        json!({"structured_outputs": {"json": person_schema()}}),
        json!({"guided_json": person_schema().to_string()}),
    ] {
        let mut body = json!({"prompt": "A person:", "max_tokens": 120, "seed": 5});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (st, r) = s.post("/v1/completions", &body);
        assert_eq!(st, 200, "{r}");
        assert!(is_person(r["choices"][0]["text"].as_str().unwrap()), "{r}");
    }
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "json_object"}})),
    );
    assert_eq!(st, 200, "{r}");
    let text = r["choices"][0]["message"]["content"].as_str().unwrap();
    if r["choices"][0]["finish_reason"] == "stop" {
        // valid JSON; serde_json refuses numbers past f64 (1E600), which JSON allows
        match serde_json::from_str::<Value>(text) {
            Ok(v) => assert!(v.is_object(), "{text}"),
            Err(e) => assert!(e.to_string().contains("out of range"), "{e}: {text}"),
        }
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"response_format": {"type": "text"}, "max_tokens": 3})),
    );
    assert_eq!(st, 200, "{r}");
    for (extra, ok) in [
        (
            json!({"structured_outputs": {"regex": "(red|green)-[0-9]{3}"}}),
            "regex",
        ),
        (json!({"guided_regex": "(red|green)-[0-9]{3}"}), "regex"),
        (
            json!({"structured_outputs": {"choice": ["yes", "no", "maybe so"]}}),
            "choice",
        ),
        (json!({"guided_choice": ["yes", "no", "maybe so"]}), "choice"),
        (
            json!({"structured_outputs": {"grammar": "start: \"f(\" /[a-c]/ \")\""}}),
            "grammar",
        ),
        (json!({"guided_grammar": "start: \"f(\" /[a-c]/ \")\""}), "grammar"),
    ] {
        let (st, r) = s.post("/v1/chat/completions", &chat(extra.clone()));
        assert_eq!(st, 200, "{r}");
        let t = r["choices"][0]["message"]["content"].as_str().unwrap();
        let good = match ok {
            "regex" => {
                let (a, b) = t.split_once('-').unwrap_or(("", ""));
                ["red", "green"].contains(&a) && b.len() == 3 && b.chars().all(|c| c.is_ascii_digit())
            }
            "choice" => ["yes", "no", "maybe so"].contains(&t),
            _ => ["f(a)", "f(b)", "f(c)"].contains(&t),
        };
        assert!(good, "{extra}: {t:?}");
        assert_eq!(r["choices"][0]["finish_reason"], "stop");
    }
}

#[test]
fn streamed_constrained_output_is_valid_and_prefixes_stay_cached() {
    let s = InProcess::tiny(&[]);
    let rf = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}});
    let body = chat(json!({"response_format": rf, "stream": true, "temperature": 0}));
    let events = s.stream("/v1/chat/completions", &body);
    let mut text = String::new();
    let mut finish = Value::Null;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(c);
        }
        if !v["choices"][0]["finish_reason"].is_null() {
            finish = v["choices"][0]["finish_reason"].clone();
        }
    }
    assert!(is_person(&text), "{text}");
    assert_eq!(finish, "stop");
    let mut plain = body.clone();
    plain["stream"] = false.into();
    let (_, a) = s.post("/v1/chat/completions", &plain);
    assert_eq!(
        a["choices"][0]["message"]["content"],
        text.as_str(),
        "greedy: streamed = whole"
    );
    let (_, b) = s.post("/v1/chat/completions", &plain);
    assert!(
        b["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0,
        "{b}"
    );
    assert_eq!(a["choices"], b["choices"]);
}

#[test]
fn invalid_or_conflicting_constraints_are_400s_naming_the_field() {
    let s = InProcess::tiny(&[]);
    let cases = [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (json!({"response_format": {"type": "xml"}}), "response_format"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
            "response_format",
        ),
        (json!({"structured_outputs": {"regex": "(open"}}), "structured_outputs"),
        (
            json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
            "structured_outputs",
        ),
        (json!({"structured_outputs": {"bogus": 1}}), "structured_outputs"),
        (json!({"guided_grammar": "start: nothing_defined"}), "guided_grammar"),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_json": "{not json"}), "guided_json"),
        (json!({"guided_regex": "a", "guided_choice": ["b"]}), "guided_choice"),
        (json!({"guided_whitespace_pattern": " "}), "guided_whitespace_pattern"),
    ];
    for (extra, field) in cases {
        let (st, r) = s.post("/v1/chat/completions", &chat(extra.clone()));
        assert_openai_error(st, &r, 400);
        assert_eq!(r["error"]["param"], field, "{extra}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains(field), "{r}");
    }
    let (st, r) = s.post(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 0, "echo": true, "guided_choice": ["a"]}),
    );
    assert_openai_error(st, &r, 400);
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
         "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                        "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add",
         "parameters": {"type": "object", "properties": {"a": {"type": "integer", "maximum": 9}, "b": {"type": "integer", "maximum": 9}},
                        "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

fn check_call(c: &Value) -> String {
    assert!(c["id"].as_str().is_some_and(|i| i.starts_with("call")), "{c}");
    assert_eq!(c["type"], "function");
    let name = c["function"]["name"].as_str().unwrap().to_string();
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().unwrap()).unwrap();
    match name.as_str() {
        "get_weather" => assert!(["Paris", "Oslo"].contains(&args["city"].as_str().unwrap())),
        "add" => assert!(args["a"].as_i64().unwrap() <= 9 && args["b"].as_i64().unwrap() <= 9),
        other => panic!("unknown tool {other}"),
    }
    name
}

#[test]
fn tool_choice_required_named_auto_and_none() {
    let s = InProcess::tiny(&[]);
    for (choice, parallel) in [(json!("required"), false), (json!("required"), true)] {
        let (st, r) = s.post(
            "/v1/chat/completions",
            &chat(json!({"tools": tools(), "tool_choice": choice, "parallel_tool_calls": parallel, "max_tokens": 200})),
        );
        assert_eq!(st, 200, "{r}");
        let c = &r["choices"][0];
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert!(!calls.is_empty(), "{r}");
        if !parallel {
            assert_eq!(calls.len(), 1);
        }
        calls.iter().for_each(|c| {
            check_call(c);
        });
        // one call ends the output; parallel calls go on until the model stops (the random model
        // does not: it runs out of tokens inside a further call)
        let want = if parallel {
            c["finish_reason"].as_str().unwrap()
        } else {
            "tool_calls"
        };
        assert!(["tool_calls", "length"].contains(&want), "{r}");
        assert_eq!(c["finish_reason"], want, "{r}");
    }
    // required without parallel_tool_calls: one complete call, then the output ends (as vLLM and OpenAI)
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tools": tools(), "tool_choice": "required", "max_tokens": 200})),
    );
    assert_eq!(st, 200, "{r}");
    let c = &r["choices"][0];
    assert_eq!(c["message"]["tool_calls"].as_array().map(Vec::len), Some(1), "{r}");
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    let named = json!({"type": "function", "function": {"name": "add"}});
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tools": tools(), "tool_choice": named, "max_tokens": 200, "n": 2})),
    );
    assert_eq!(st, 200, "{r}");
    for c in r["choices"].as_array().unwrap() {
        let calls = c["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "a named function is called once: {r}");
        assert_eq!(check_call(&calls[0]), "add");
        assert_eq!(c["finish_reason"], "tool_calls");
    }
    // auto: the tiny model says whatever it says; the answer is well formed either way
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tools": tools(), "max_tokens": 8})),
    );
    assert_eq!(st, 200, "{r}");
    let calls = &r["choices"][0]["message"]["tool_calls"];
    assert!(
        calls.is_null() || calls.as_array().is_some_and(|c| !c.is_empty()),
        "tool_calls is omitted when the model made none: {r}"
    );
    // none: no tools in the prompt, no parsing
    let (st, r) = s.post(
        "/v1/chat/completions",
        &chat(json!({"tools": tools(), "tool_choice": "none", "max_tokens": 4})),
    );
    assert_eq!(st, 200, "{r}");
    assert!(r["choices"][0]["message"].get("tool_calls").is_none());
    // bad tool requests
    for (extra, field) in [
        (json!({"tools": [{"type": "function"}]}), "tools"),
        (json!({"tools": tools(), "tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": tools(), "tool_choice": "required", "guided_choice": ["a"]}),
            "guided_choice",
        ),
        (json!({"functions": [{"name": "f"}]}), "functions"),
    ] {
        let (st, r) = s.post("/v1/chat/completions", &chat(extra.clone()));
        assert_openai_error(st, &r, 400);
        assert_eq!(r["error"]["param"], field, "{extra}: {r}");
    }
}

#[test]
fn streamed_tool_calls_and_tool_history() {
    let s = InProcess::tiny(&[]);
    let events = s.stream(
        "/v1/chat/completions",
        &chat(
            json!({"tools": tools(), "tool_choice": "required", "stream": true, "max_tokens": 200,
                     "parallel_tool_calls": false}),
        ),
    );
    let mut calls = vec![];
    let mut finish = Value::Null;
    for e in events.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let ch = &v["choices"][0];
        for c in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
            assert_eq!(c["index"], calls.len(), "{c}");
            calls.push(c.clone());
        }
        if !ch["finish_reason"].is_null() {
            finish = ch["finish_reason"].clone();
        }
    }
    assert!(!calls.is_empty());
    calls.iter().for_each(|c| {
        check_call(c);
    });
    assert_eq!(finish, "tool_calls");
    // the conversation continues with the call and its result
    let history = json!([
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}
    ]);
    let (st, r) = s.post(
        "/v1/chat/completions",
        &json!({"messages": history, "tools": tools(), "max_tokens": 4}),
    );
    assert_eq!(st, 200, "{r}");
    let (st, r) = s.post("/tokenize", &json!({"messages": history}));
    assert_eq!(st, 200, "{r}");
}
