//! `/v1/decisions` against the real `serve` on the default model: OpenAI's response shape (no id, every
//! answer named, integer usage), the same probabilities as `/v1/systemone` over the same state and
//! questions, OpenAI's error shape with `param`, and the warm follow-up — a decision over items, then
//! the chat completion and the Responses call over the same conversation; a DecisionsToolRunner-shaped
//! loop (a stable task, a changing observation) that finds its task warm at every step.

mod common;

use common::{assert_openai_error, Server};
use serde_json::{json, Value};

fn keys(v: &Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn close(a: &Value, b: &Value) {
    let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
    assert!((a - b).abs() < 1e-6, "{a} vs {b}");
}

fn task() -> String {
    (0..60)
        .map(|i| {
            format!(
                "Rule {i}: every payout over {} dollars needs a second approver from the {} team. ",
                i * 50,
                ["risk", "finance", "ops"][i % 3]
            )
        })
        .collect()
}

#[test]
fn shape_parity_with_systemone_and_errors() {
    let s = Server::start(&[]);
    let state = "Help! My payouts have been failing for 3 days.";
    let (st, d) = s.post(
        "/v1/decisions",
        &json!({"model": "smollm2-135m-instruct", "input": state, "questions": [
            {"type": "predicate", "name": "urgent", "instructions": "Does this convey urgency?"},
            {"type": "choice", "name": "dept", "instructions": "Which team should handle this?",
             "choices": [{"value": "billing", "description": "Payments, invoicing, refunds"}, {"value": "technical"}, {"value": "sales"}]},
            {"type": "score", "instructions": "How frustrated is the customer?",
             "levels": [{"label": "Calm"}, {"label": "Frustrated"}, {"label": "Very angry"}]}
        ], "safety_identifier": null, "prompt_cache_key": null}),
    );
    assert_eq!(st, 200, "{d}");
    assert_eq!(keys(&d), ["model", "answers", "usage"], "no id, object or created");
    assert_eq!(d["model"], "smollm2-135m-instruct");
    let a = d["answers"].as_array().unwrap();
    assert_eq!(keys(&a[0]), ["type", "name", "probability"]);
    assert_eq!(keys(&a[1]), ["type", "name", "choice", "probabilities", "confidence"]);
    assert_eq!(keys(&a[2]), ["type", "name", "score", "probabilities", "confidence"]);
    assert_eq!(
        a[2]["name"],
        Value::Null,
        "an unnamed question's answer says name: null"
    );
    let u = &d["usage"];
    assert_eq!(
        keys(u),
        [
            "input_tokens",
            "input_tokens_details",
            "output_tokens",
            "output_tokens_details",
            "total_tokens"
        ]
    );
    assert_eq!(
        keys(&u["input_tokens_details"]),
        ["cached_tokens", "cache_write_tokens"]
    );
    for v in [
        &u["input_tokens"],
        &u["input_tokens_details"]["cached_tokens"],
        &u["input_tokens_details"]["cache_write_tokens"],
        &u["output_tokens"],
        &u["output_tokens_details"]["reasoning_tokens"],
        &u["total_tokens"],
    ] {
        assert!(v.is_u64(), "usage counters are integers: {u}");
    }
    let levels: Vec<(u64, &str)> = a[2]["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["value"].as_u64().unwrap(), p["label"].as_str().unwrap()))
        .collect();
    assert_eq!(levels, [(0, "Calm"), (1, "Frustrated"), (2, "Very angry")]);
    let score: f64 = a[2]["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["value"].as_f64().unwrap() * p["probability"].as_f64().unwrap())
        .sum();
    assert!((a[2]["score"].as_f64().unwrap() - score).abs() < 2e-6);
    // the same state and questions on Jev's wire: the same numbers
    let (st, j) = s.post(
        "/v1/systemone",
        &json!({"state": state, "questions": {
            "urgent": {"type": "noul", "instructions": "Does this convey urgency?"},
            "dept": {"type": "choice", "instructions": "Which team should handle this?",
                     "criteria": {"billing": "Payments, invoicing, refunds", "technical": null, "sales": null}},
            "frustration": {"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["Calm", "Frustrated", "Very angry"]}
        }}),
    );
    assert_eq!(st, 200, "{j}");
    let ja = &j["answers"];
    close(&a[0]["probability"], &ja["urgent"]["noul"]);
    assert_eq!(a[1]["choice"], ja["dept"]["choice"]);
    for (i, name) in ["billing", "technical", "sales"].iter().enumerate() {
        assert_eq!(a[1]["probabilities"][i]["value"], *name, "choice order");
        close(
            &a[1]["probabilities"][i]["probability"],
            &ja["dept"]["probabilities"][name],
        );
        close(
            &a[2]["probabilities"][i.min(2)]["probability"],
            &ja["frustration"]["probabilities"][i.min(2).to_string()],
        );
    }
    close(&a[1]["confidence"], &ja["dept"]["confidence"]);
    close(&a[2]["score"], &ja["frustration"]["score"]);
    close(&a[2]["confidence"], &ja["frustration"]["confidence"]);
    assert_eq!(u["input_tokens"], j["usage"]["input_tokens"], "the same reads");
    // typed choice values come back typed
    let (st, b) = s.post(
        "/v1/decisions",
        &json!({"model": "smollm2-135m-instruct", "input": state, "questions": [
            {"type": "choice", "instructions": "Is it urgent?", "choices": [{"value": true}, {"value": false}, {"value": "true"}]}]}),
    );
    assert_eq!(st, 200, "{b}");
    let vals: Vec<&Value> = b["answers"][0]["probabilities"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["value"])
        .collect();
    assert_eq!(vals, [&json!(true), &json!(false), &json!("true")]);
    // errors: OpenAI's shape with the exact param
    for (body, param) in [
        (
            json!({"model": "smollm2-135m-instruct", "input": "x", "questions": []}),
            "questions",
        ),
        (
            json!({"model": "smollm2-135m-instruct", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}],
                "questions": [{"type": "predicate", "instructions": "x"}]}),
            "input[0].content[0]",
        ),
        (
            json!({"model": "smollm2-135m-instruct", "input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}],
                "questions": [{"type": "predicate", "instructions": "x"}]}),
            "input[0].call_id",
        ),
    ] {
        let (st, e) = s.post("/v1/decisions", &body);
        assert_openai_error(st, &e, 400);
        assert_eq!(e["error"]["param"], param, "{e}");
    }
    let (st, e) = s.post(
        "/v1/decisions",
        &json!({"model": "gpt-6-luna", "input": "x", "questions": [{"type": "predicate", "instructions": "x"}]}),
    );
    assert_openai_error(st, &e, 404);
    // x_refuse_below: a question whose labels get too little mass is refused, named
    let (st, r) = s.post(
        "/v1/decisions",
        &json!({"model": "smollm2-135m-instruct", "input": state, "x_refuse_below": 1.0,
                "questions": [{"type": "predicate", "name": "p", "instructions": "Urgent?"}]}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["answers"][0], json!({"type": "refusal", "name": "p"}));
}

#[test]
fn the_follow_up_and_the_runner_loop_are_warm() {
    let s = Server::start(&[]);
    let items = json!([
        {"role": "developer", "content": "You are a support agent for a payments company."},
        {"role": "user", "content": format!("{} My payouts are failing. What should I do?", task())},
        {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"account\": 7}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "payouts blocked: bank account closed"}
    ]);
    let (st, d) = s.post(
        "/v1/decisions",
        &json!({"model": "smollm2-135m-instruct", "input": items,
                "questions": [{"type": "choice", "name": "route", "instructions": "Route to", "choices": [{"value": "billing"}, {"value": "technical"}]}]}),
    );
    assert_eq!(st, 200, "{d}");
    // the Responses call over the same items finds the conversation warm
    let (st, r) = s.post("/v1/responses", &json!({"input": items, "max_output_tokens": 4}));
    assert_eq!(st, 200, "{r}");
    let prompt = r["usage"]["input_tokens"].as_u64().unwrap();
    let cached = r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    eprintln!("responses follow-up: {cached} of {prompt} cached");
    assert!(
        cached as f64 >= 0.9 * prompt as f64,
        "responses follow-up cached {cached} of {prompt}"
    );
    // and so does the chat completion over the same messages (tool call and result in chat's shape)
    let messages = json!([
        {"role": "system", "content": "You are a support agent for a payments company."},
        {"role": "user", "content": format!("{} My payouts are failing. What should I do?", task())},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"account\": 7}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "payouts blocked: bank account closed"}
    ]);
    let (st, c) = s.post("/v1/chat/completions", &json!({"messages": messages, "max_tokens": 4}));
    assert_eq!(st, 200, "{c}");
    let prompt = c["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    eprintln!("chat follow-up: {cached} of {prompt} cached");
    assert!(
        cached as f64 >= 0.9 * prompt as f64,
        "chat follow-up cached {cached} of {prompt}"
    );
    // a DecisionsToolRunner-shaped loop: the task, then a changing observation; one choice per step
    let mut task_tokens = 0;
    for step in 0..4 {
        let (st, d) = s.post(
            "/v1/decisions",
            &json!({"model": "smollm2-135m-instruct",
                    "input": [{"role": "user", "content": format!("Task: {}", task())}, {"role": "user", "content": format!("counter={step}")}],
                    "questions": [{"type": "choice", "name": "next_action",
                        "instructions": "Select the supplied action that best advances the task, or done if the task is complete.",
                        "choices": [{"value": "increment", "description": "Add one"}, {"value": "done", "description": "Finished"}]}]}),
        );
        assert_eq!(st, 200, "{d}");
        assert_eq!(d["answers"][0]["name"], "next_action");
        let input = d["usage"]["input_tokens"].as_u64().unwrap();
        let cached = d["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
        eprintln!("runner loop step {step}: {cached} of {input} cached");
        if step == 0 {
            task_tokens = input;
        } else {
            assert!(
                cached as f64 >= 0.85 * task_tokens as f64,
                "step {step}: cached {cached} of {input}"
            );
        }
    }
}
