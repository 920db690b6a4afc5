//! The completion and decision end-to-end checks with every KV-cache dtype (with calibrated scales for
//! the scaled ones; int8 needs none), each with its default method and the quantized ones also with `plain`: the
//! configured dtype and method are reported, completions and streams work, decisions have the right
//! shape, stay deterministic (warm = cold: cached blocks read as written), and stay within loose bounds
//! of the float32 cache.

mod common;

use common::Server;
use serde_json::{json, Value};

fn decision() -> Value {
    json!({
      "state": "Help! My payouts have been failing for 3 days and customers are complaining.",
      "questions": {
        "is_urgent":  {"type": "noul", "instructions": "Does this convey urgency?"},
        "department": {"type": "choice", "instructions": "Which team should handle this?",
                       "criteria": {"billing": "Payments, invoicing, refunds", "technical": "Bugs, outages", "sales": null}},
        "frustration":{"type": "score", "instructions": "How frustrated is the customer?", "criteria": ["Calm", "Frustrated", "Very angry"]}
      }
    })
}

fn probs(r: &Value) -> Vec<f64> {
    let a = &r["answers"];
    let mut v = vec![a["is_urgent"]["noul"].as_f64().unwrap()];
    for k in ["department", "frustration"] {
        v.extend(
            a[k]["probabilities"]
                .as_object()
                .unwrap()
                .values()
                .map(|x| x.as_f64().unwrap()),
        );
    }
    v
}

#[test]
fn every_dtype_serves_completions_and_decisions() {
    let reference = {
        let s = Server::start(&["--kv-cache-dtype", "float32", "--decision-temperature", "1"]);
        let (st, r) = s.post("/v1/systemone", &decision());
        assert_eq!(st, 200);
        probs(&r)
    };
    let cases = [
        ("bfloat16", "auto", "plain"),
        ("float16", "auto", "plain"),
        ("int8", "auto", "rotation+smooth"),
        ("int8", "plain", "plain"),
        ("fp8", "auto", "rotation+smooth"),
        ("fp8", "plain", "plain"),
        ("fp8_e5m2", "auto", "rotation+smooth"),
        ("nvfp4", "auto", "both+smooth"),
        ("nvfp4", "plain", "plain"),
    ];
    for (dtype, method, resolved) in cases {
        let s = Server::start(&[
            "--kv-cache-dtype",
            dtype,
            "--kv-cache-method",
            method,
            "--calculate-kv-scales",
            "--decision-temperature",
            "1",
        ]);
        let canonical = if dtype == "fp8" { "fp8_e4m3" } else { dtype };
        let (_, _, m) = s.raw("GET", "/metrics", &[], b"").unwrap();
        let m = String::from_utf8_lossy(&m).to_string();
        assert!(m.contains(&format!("cache_dtype=\"{canonical}\"")), "{dtype}");
        assert!(m.contains(&format!("cache_method=\"{resolved}\"")), "{dtype} {method}");
        if canonical != "bfloat16" && canonical != "float16" {
            assert!(
                s.log_text().contains(&format!("dtype {canonical}, method {resolved}")),
                "{dtype}: startup log"
            );
        }
        let (st, r) = s.post(
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(st, 200, "{dtype}: {r}");
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert!(text.contains("Paris"), "{dtype}: {text:?}");
        let ev = s.stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "stream": true}),
        );
        assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{dtype}");
        let (st, a) = s.post("/v1/systemone", &decision());
        assert_eq!(st, 200, "{dtype}: {a}");
        let (_, b) = s.post("/v1/systemone", &decision());
        assert_eq!(a["answers"], b["answers"], "{dtype}: warm and cold are identical");
        let p = probs(&a);
        let worst = p.iter().zip(&reference).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        // Temperature 1: the drift of the reads themselves. Loose bounds that only catch a broken codec: the drift itself is measured by
        // `cargo bench --bench kv_report` (this 135M model is very sensitive to K/V rounding).
        let limit = match dtype {
            "bfloat16" | "float16" => 0.02,
            // kv_report: 0.0195 over 50 questions with rotation+smooth, 0.06 plain
            "int8" => 0.1,
            "fp8" => 0.2,
            // kv_report: nvfp4 plain reaches 0.459 over its 50 questions (this question: 0.38-0.40,
            // moving with the attention's rounding), rotation+smooth 0.26
            _ => 0.5,
        };
        eprintln!("{dtype} {method}: max |Δp| vs float32 = {worst:.4}");
        assert!(worst <= limit, "{dtype} {method}: max |Δp| vs float32 = {worst}");
    }
}
