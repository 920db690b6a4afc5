//! `/v1/systemone` against the real `serve` on the default model: the spec's valid and invalid examples,
//! the typesafe-jev client, token accounting through the prefix cache, the warm follow-up, and
//! bitwise determinism alone / in a busy batch / with a warm prefix.

mod common;

use common::Server;
use serde_json::{json, Value};

fn spec_request() -> Value {
    json!({
      "state": "Help! My payouts have been failing for 3 days.",
      "model": "smollm2-135m-instruct",
      "questions": {
        "is_urgent":  {"type": "noul",   "instructions": "Does this convey urgency?",
                       "criteria": {"true": "Explicitly time-sensitive", "false": "No urgency expressed"}},
        "department": {"type": "choice", "instructions": "Which team should handle this?",
                       "criteria": {"billing": "Payments, invoicing, refunds", "technical": null, "sales": null}},
        "frustration":{"type": "score",  "instructions": "How frustrated is the customer?",
                       "criteria": ["Calm", "Frustrated", "Very angry"]}
      }
    })
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

fn units(dist: &Value) -> u64 {
    dist.as_object()
        .unwrap()
        .values()
        .map(|v| (v.as_f64().unwrap() * 1e6).round() as u64)
        .sum()
}

#[test]
fn spec_examples_shapes_and_errors() {
    let s = Server::start(&[]);
    let (st, r) = s.post("/v1/systemone", &spec_request());
    assert_eq!(st, 200, "{r}");
    assert_eq!(keys(&r), ["model", "answers", "usage"]);
    assert_eq!(r["model"], "smollm2-135m-instruct");
    let a = &r["answers"];
    assert_eq!(
        keys(a),
        ["is_urgent", "department", "frustration"],
        "answers in request order"
    );
    assert_eq!(keys(&a["is_urgent"]), ["type", "noul"]);
    let p = a["is_urgent"]["noul"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&p));
    let d = &a["department"];
    assert_eq!(keys(d), ["type", "choice", "probabilities", "confidence"]);
    assert_eq!(keys(&d["probabilities"]), ["billing", "technical", "sales"]);
    assert_eq!(units(&d["probabilities"]), 1_000_000, "sums to exactly 1");
    let best = d["probabilities"]
        .as_object()
        .unwrap()
        .iter()
        .max_by(|x, y| x.1.as_f64().unwrap().total_cmp(&y.1.as_f64().unwrap()))
        .unwrap()
        .0
        .clone();
    assert_eq!(d["choice"], best);
    let pmax = d["probabilities"][&best].as_f64().unwrap();
    assert!((d["confidence"].as_f64().unwrap() - ((pmax - 1.0 / 3.0) / (2.0 / 3.0)).clamp(0.0, 1.0)).abs() < 2e-6);
    let f = &a["frustration"];
    assert_eq!(keys(f), ["type", "score", "legend", "probabilities", "confidence"]);
    assert_eq!(f["legend"], json!({"0": "Calm", "1": "Frustrated", "2": "Very angry"}));
    assert_eq!(units(&f["probabilities"]), 1_000_000);
    let ps: Vec<f64> = (0..3)
        .map(|i| f["probabilities"][i.to_string()].as_f64().unwrap())
        .collect();
    let score: f64 = ps.iter().enumerate().map(|(i, p)| i as f64 * p).sum();
    assert!((f["score"].as_f64().unwrap() - score).abs() < 2e-6);
    assert!((0.0..=2.0).contains(&score));
    let c = f["confidence"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&c));
    assert_eq!(r["usage"]["output_tokens"], 0);
    assert!(
        r["usage"]["input_tokens"].as_u64().unwrap()
            > r["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap()
    );
    assert!(r.get("diagnostics").is_none());
    // diagnostics (never inside answers)
    let mut req = spec_request();
    req["diagnostics"] = json!(true);
    let (_, r2) = s.post("/v1/systemone", &req);
    assert_eq!(r2["answers"], r["answers"], "the same request gives the same answers");
    let m = r2["diagnostics"]["department"]["label_mass"].as_f64().unwrap();
    assert!(m > 0.0 && m <= 1.0);
    // invalid requests: 422 with every problem, each with type/loc/msg/input
    let bad = json!({
        "state": 42,
        "questions": {
            "a": {"type": "choice", "instructions": "Pick", "criteria": {}},
            "b": {"type": "score", "instructions": "Rate", "criteria": ["x", "y"], "crtieria": []},
            "c": {"type": "noul", "instructions": "Q", "criteria": {"maybe": "?"}},
            "d": {"type": "ranking", "instructions": "Q"},
            "e": {"type": "choice", "instructions": "Pick", "criteria": {"Yes": null, " yes ": null}},
            "f": {"type": "score", "criteria": ["x", "y", "z", "a", "b", "c", "d", "e", "f", "g", "h"]}
        }
    });
    let (st, e) = s.post("/v1/systemone", &bad);
    assert_eq!(st, 422, "{e}");
    let locs: Vec<Vec<String>> = e["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert!(
                d["type"].is_string() && d["msg"].is_string() && d.get("input").is_some(),
                "{d}"
            );
            d["loc"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    let want: Vec<Vec<&str>> = vec![
        vec!["body", "state"],
        vec!["body", "questions", "a", "criteria"],
        vec!["body", "questions", "b", "crtieria"],
        vec!["body", "questions", "c", "criteria", "maybe"],
        vec!["body", "questions", "d", "type"],
        vec!["body", "questions", "e", "criteria", " yes "],
        vec!["body", "questions", "f", "instructions"],
        vec!["body", "questions", "f", "criteria"],
    ];
    assert_eq!(locs, want);
    let types: Vec<&str> = e["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        [
            "value_error",
            "too_short",
            "extra_forbidden",
            "extra_forbidden",
            "literal_error",
            "value_error",
            "missing",
            "too_long"
        ]
    );
    let (st, e) = s.post("/v1/systemone", &json!({}));
    assert_eq!(st, 422);
    assert_eq!(e["detail"].as_array().unwrap().len(), 2);
    let (st, _, b) = s
        .raw(
            "POST",
            "/v1/systemone",
            &[("Content-Type", "application/json")],
            b"{oops",
        )
        .unwrap();
    assert_eq!(st, 422);
    assert_eq!(common::parse(&b)["detail"][0]["type"], "json_invalid");
    // more options than letters: numbered labels, read through their tokens
    let many: serde_json::Map<String, Value> = (0..27).map(|i| (format!("o{i}"), Value::Null)).collect();
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": "s", "questions": {"q": {"type": "choice", "instructions": "Pick", "criteria": many}}}),
    );
    assert_eq!(st, 200, "{r}");
    assert_eq!(units(&r["answers"]["q"]["probabilities"]), 1_000_000);
    // valid but not servable: 400; unknown model: 404
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": "x ".repeat(9000), "questions": {"q": {"type": "noul", "instructions": "?"}}}),
    );
    common::assert_jev_error(st, &r, 400, "api_usage_error");
    assert!(
        r["detail"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{r}"
    );
    let mut req = spec_request();
    req["model"] = json!("no-such-model");
    let (st, r) = s.post("/v1/systemone", &req);
    common::assert_jev_error(st, &r, 404, "not_found");
    // the Jev SDKs' default names are the served model
    for alias in ["jev-latest", "jev-preview"] {
        req["model"] = json!(alias);
        let (st, r) = s.post("/v1/systemone", &req);
        assert_eq!(st, 200, "{r}");
        assert_eq!(r["model"], "smollm2-135m-instruct");
    }
    // metrics
    assert!(s.metric("kvgate:decision_requests_total") >= 2.0);
    assert!(s.metric("kvgate:decision_questions_total") >= 6.0);
}

#[test]
fn typesafe_jev_client_gets_typed_answers() {
    use typesafe_jev::{Choice, Client, Config, Noul, Questions, Score};
    let s = Server::start(&[]);
    let cfg = Config {
        base_url: s.url("/v1/systemone"),
        model: "smollm2-135m-instruct".into(),
        max_retries: 0,
        ..Config::default()
    };
    let client = Client::new("unused-key", cfg).unwrap();
    let questions = Questions::new()
        .with(
            "department",
            Choice::new(
                "Which team should handle this?",
                [
                    ("billing", "Payment or subscription issues"),
                    ("technical", "Bugs or integration problems"),
                    ("sales", "Pricing"),
                ],
            ),
        )
        .with(
            "frustration",
            Score::new(
                "How frustrated the customer appears",
                ["Calm", "Frustrated but civil", "Very angry"],
            ),
        )
        .with(
            "is_urgent",
            Noul::new("The message conveys urgency or time-sensitivity"),
        );
    let ticket = "Hi, I've been trying to connect my Stripe account for 3 days and the integration keeps failing. Please help ASAP.";
    let r = client.ask(ticket, &questions).unwrap();
    assert_eq!(r.model, "smollm2-135m-instruct");
    let d = r.choice("department").expect("a choice answer");
    assert!(["billing", "technical", "sales"].contains(&d.choice.as_str()));
    assert_eq!(d.probabilities.len(), 3);
    let f = r.score("frustration").expect("a score answer");
    assert!((0.0..=2.0).contains(&f.score));
    assert_eq!(f.legend.len(), 3);
    let u = r.noul("is_urgent").expect("a noul answer");
    assert!((0.0..=1.0).contains(&u.noul));
    assert!(client.usage().input_tokens() > 0);
    // a structured state and structured instructions work too
    let state = json!({"ticket": ticket, "customer": {"plan": "pro", "since": 2021}});
    let q = Questions::new().with("pro", Noul::new("Is the customer on the pro plan?"));
    assert!(client.ask(&state, &q).is_ok());
}

fn long_state() -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < 9000 {
        s.push_str(&format!(
            "Line {i}: the shipment {} was delayed at the {} depot. ",
            i * 37 % 101,
            ["north", "south", "east"][i % 3]
        ));
        i += 1;
    }
    s
}

#[test]
fn token_accounting_follow_up_and_determinism() {
    let s = Server::start(&["--max-num-batched-tokens", "512"]);
    // 8 questions over a ~2,000-token state: the state is computed once.
    let state = long_state();
    let mut qs = serde_json::Map::new();
    for i in 0..8 {
        qs.insert(
            format!("q{i}"),
            json!({"type": "noul", "instructions": format!("Is line {i} about the north depot?")}),
        );
    }
    let req = json!({"state": state, "questions": qs, "cache_salt": "accounting"});
    let (st, cold) = s.post("/v1/systemone", &req);
    assert_eq!(st, 200, "{cold}");
    let input = cold["usage"]["input_tokens"].as_u64().unwrap();
    let computed_cold = input - cold["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let per_read = input / 8;
    assert!(per_read > 1900, "a ~2,000-token state: {per_read}");
    assert!(
        computed_cold < per_read + 8 * 40,
        "computed {computed_cold} for 8 reads of {per_read}: the state once"
    );
    let (_, warm) = s.post("/v1/systemone", &req);
    let computed_warm = input - warm["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(computed_warm < 8 * 40, "warm: only the suffixes ({computed_warm})");
    assert_eq!(
        warm["answers"], cold["answers"],
        "warm and cold answers are bitwise identical"
    );
    // the same decision inside a batch of 16 concurrent other requests
    let busy = std::thread::scope(|sc| {
        let others: Vec<_> = (0..16)
            .map(|i| {
                let s = &s;
                sc.spawn(move || {
                    s.post(
                        "/v1/completions",
                        &json!({"prompt": format!("Other request {i}:"), "max_tokens": 48, "ignore_eos": true}),
                    )
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut r = req.clone();
        r["cache_salt"] = json!("busy");
        let (_, busy) = s.post("/v1/systemone", &r);
        for o in others {
            assert_eq!(o.join().unwrap().0, 200);
        }
        busy
    });
    assert_eq!(
        busy["answers"], cold["answers"],
        "batch composition does not change the answers"
    );
    // follow-up: a decision over a conversation, then the chat completion over the same messages
    let conversation = json!([
        {"role": "system", "content": "You are a support agent for a payments company."},
        {"role": "user", "content": format!("{} My payouts are failing. What should I do?", &state[..3000])}
    ]);
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": conversation, "keep_alive": 60,
                "questions": {"route": {"type": "choice", "instructions": "Route to", "criteria": {"billing": null, "technical": null}}}}),
    );
    assert_eq!(st, 200, "{r}");
    let (st, c) = s.post(
        "/v1/chat/completions",
        &json!({"messages": conversation, "max_tokens": 8}),
    );
    assert_eq!(st, 200);
    let prompt = c["usage"]["prompt_tokens"].as_u64().unwrap();
    let cached = c["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(
        cached as f64 >= 0.9 * prompt as f64,
        "follow-up cached {cached} of {prompt}"
    );
    assert!(s.metric("kvgate:decision_prefix_reuse_tokens_total") >= cached as f64 - 16.0);
}
