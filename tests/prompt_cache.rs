//! OpenAI's prompt-cache controls on `/v1/decisions`, `/v1/chat/completions` and `/v1/responses`, in
//! process over the tiny model with no session retention and a small cache: an explicit
//! `prompt_cache_breakpoint` keeps exactly its prefix through a flood of cold prompts that evicts
//! everything else (`cache_write_tokens` reports what it wrote); the same prefix without a breakpoint
//! is gone after the same flood; explicit mode without breakpoints writes nothing; the options and the
//! deprecated `prompt_cache_retention` are accepted as openai-python 3.60 sends them.

mod common;

use common::InProcess;
use serde_json::{json, Value};

fn decision(system: &str, user: &str, marked: bool, mode: &str) -> Value {
    let mut part = json!({"type": "input_text", "text": system});
    if marked {
        part["prompt_cache_breakpoint"] = json!({"mode": "explicit"});
    }
    json!({"model": "tiny", "input": [{"role": "system", "content": [part]}, {"role": "user", "content": user}],
           "prompt_cache_options": {"mode": mode, "ttl": "30m"},
           "questions": [{"type": "predicate", "name": "p", "instructions": "Urgent?"}]})
}

fn usage(r: &Value) -> (u64, u64, u64) {
    let u = &r["usage"];
    (
        u["input_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cache_write_tokens"].as_u64().unwrap(),
    )
}

fn flood(s: &InProcess) {
    for j in 0..10 {
        let cold = json!({"prompt": format!("Unrelated prompt {j}: warehouses, shipping lanes and the weather {j}{j}{j}."), "max_tokens": 1});
        let (st, r) = s.post("/v1/completions", &cold);
        assert_eq!(st, 200, "{r}");
    }
}

#[test]
fn a_breakpoint_keeps_its_prefix_through_a_flood() {
    let s = InProcess::tiny(&["--num-kv-blocks", "64", "--block-size", "4", "--session-window", "0"]);
    let name = s.get("/v1/models").unwrap().1["data"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let with_model = |mut v: Value| {
        v["model"] = json!(name);
        v
    };
    let system = "Triage rules: refunds go to billing; outages go to ops.";
    let (st, r) = s.post(
        "/v1/decisions",
        &with_model(decision(system, "My order is late.", true, "implicit")),
    );
    assert_eq!(st, 200, "{r}");
    let (_, _, written) = usage(&r);
    assert!(written >= 8, "the breakpoint's prefix was written: {r}");
    flood(&s);
    let (st, r) = s.post(
        "/v1/decisions",
        &with_model(decision(system, "Payments fail.", true, "implicit")),
    );
    assert_eq!(st, 200, "{r}");
    let (_, cached, written_again) = usage(&r);
    assert!(
        cached >= written,
        "the marked prefix survived the flood: cached {cached}, written {written}"
    );
    assert_eq!(written_again, 0, "found in the cache: nothing new written");
    // the same shape without a breakpoint: the flood takes it
    let other = "Escalation rules: legal threats go to the lawyers; praise goes to marketing.";
    let (st, r) = s.post(
        "/v1/decisions",
        &with_model(decision(other, "My order is late.", false, "implicit")),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(usage(&r).2, 0, "no breakpoint, nothing written");
    flood(&s);
    let (_, r) = s.post(
        "/v1/decisions",
        &with_model(decision(other, "Payments fail.", false, "implicit")),
    );
    let (_, cached_plain, _) = usage(&r);
    assert!(
        cached_plain < written,
        "unmarked: evicted by the flood ({cached_plain} cached)"
    );
    // explicit mode without a breakpoint writes nothing
    let (_, r) = s.post(
        "/v1/decisions",
        &with_model(decision("Third rules.", "x", false, "explicit")),
    );
    assert_eq!(usage(&r).2, 0);
}

fn small() -> InProcess {
    InProcess::tiny(&["--num-kv-blocks", "64", "--block-size", "4", "--session-window", "0"])
}

fn details<'a>(r: &'a Value, key: &str) -> &'a Value {
    &r["usage"][key]
}

#[test]
fn chat_and_responses_breakpoints_keep_their_prefix() {
    let s = small();
    let system = "Triage rules: refunds go to billing; outages go to ops.";
    let chat = |user: &str, marked: bool| {
        let mut part = json!({"type": "text", "text": system});
        if marked {
            part["prompt_cache_breakpoint"] = json!({"mode": "explicit", "ttl": "12h"});
        }
        json!({"messages": [{"role": "system", "content": [part]}, {"role": "user", "content": user}],
               "max_tokens": 1, "prompt_cache_options": {"mode": "implicit", "ttl": "30m"},
               "prompt_cache_retention": "in_memory", "prompt_cache_key": "k"})
    };
    let (st, r) = s.post("/v1/chat/completions", &chat("My order is late.", true));
    assert_eq!(st, 200, "{r}");
    let written = details(&r, "prompt_tokens_details")["cache_write_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(written >= 8, "the breakpoint's prefix was written: {r}");
    flood(&s);
    let (_, r) = s.post("/v1/chat/completions", &chat("Payments fail.", true));
    let cached = details(&r, "prompt_tokens_details")["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= written,
        "chat: the marked prefix survived the flood ({cached} of {written})"
    );
    assert!(
        details(&r, "prompt_tokens_details").get("cache_write_tokens").is_none(),
        "nothing new: {r}"
    );
    // responses: an input_text part's breakpoint
    let other = "Escalation rules: legal threats go to the lawyers; praise goes to marketing.";
    let resp = |user: &str, marked: bool| {
        let mut part = json!({"type": "input_text", "text": other});
        if marked {
            part["prompt_cache_breakpoint"] = json!({"mode": "explicit"});
        }
        json!({"input": [{"role": "developer", "content": [part]}, {"role": "user", "content": user}],
               "max_output_tokens": 1, "store": false, "prompt_cache_options": {"mode": "explicit", "ttl": "12h"}})
    };
    let (st, r) = s.post("/v1/responses", &resp("My order is late.", true));
    assert_eq!(st, 200, "{r}");
    let written = details(&r, "input_tokens_details")["cache_write_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(written >= 8, "the breakpoint's prefix was written: {r}");
    flood(&s);
    let (_, r) = s.post("/v1/responses", &resp("Payments fail.", true));
    let cached = details(&r, "input_tokens_details")["cached_tokens"].as_u64().unwrap();
    assert!(
        cached >= written,
        "responses: the marked prefix survived the flood ({cached} of {written})"
    );
    // without a breakpoint the same flood takes a prefix
    let third = "Routing rules: anything about invoices goes to accounts receivable today.";
    let plain =
        json!({"messages": [{"role": "system", "content": third}, {"role": "user", "content": "x"}], "max_tokens": 1});
    let (_, r) = s.post("/v1/chat/completions", &plain);
    assert!(details(&r, "prompt_tokens_details").get("cache_write_tokens").is_none());
    flood(&s);
    let (_, r) = s.post("/v1/chat/completions", &plain);
    let cached_plain = details(&r, "prompt_tokens_details")["cached_tokens"].as_u64().unwrap();
    assert!(
        cached_plain < written,
        "unmarked: evicted by the flood ({cached_plain} cached)"
    );
    // a wrong mode or ttl is a 400 naming the field
    let mut bad = chat("x", false);
    bad["prompt_cache_options"] = json!({"mode": "sometimes"});
    let (st, e) = s.post("/v1/chat/completions", &bad);
    assert_eq!(st, 400, "{e}");
    assert_eq!(e["error"]["param"], "prompt_cache_options", "{e}");
    let mut bad = resp("x", false);
    bad["prompt_cache_options"] = json!({"ttl": "1h"});
    let (st, e) = s.post("/v1/responses", &bad);
    assert_eq!(st, 400, "{e}");
}
