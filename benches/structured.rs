//! Structured outputs on the default model, through `serve`:
//!
//! 1. Validity: 10 JSON Schemas × 10 prompts (short labels — tags, names in a list, SKUs — carry a
//!    `maxLength`, as a schema for a 135M model should: without one the model can run on inside a
//!    string until `max_tokens`, which no grammar can prevent) as `response_format: json_schema` (strict), sampled at
//!    temperature 0.7 with a seed per prompt, `max_tokens` 400: how many outputs parse and validate
//!    against their schema (a validator for the keywords the schemas use), finish reasons, tokens.
//! 2. Cost: decode throughput with and without a grammar at 1 and 16 concurrent streams (128 tokens
//!    each, greedy, `ignore_eos`; the grammar is a JSON array of strings with `minItems` 1000, so it
//!    never ends early and both arms generate the same number of tokens), and the mean per-token mask
//!    time from `/metrics` (`kvgate:grammar_mask_seconds_total ÷ kvgate:grammar_masks_total`).
//!
//! `cargo bench --bench structured` (~6 minutes on 2 cores). `SO_PARTS=validity` or `cost` runs one.

use std::time::Instant;

mod common;

use common::{metric, post, Serve};
use serde_json::{json, Value};

fn schemas() -> Vec<(&'static str, Value, Vec<&'static str>)> {
    let s = |x: Value| x;
    vec![
        (
            "person",
            s(json!({"type": "object", "properties": {
                "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                "email": {"type": "string"}},
              "required": ["name", "age", "email"], "additionalProperties": false})),
            vec![
                "Invent a customer for a bakery.",
                "Describe a retired sailor.",
                "Make up a student.",
                "Create a profile for a chess player.",
                "Describe your neighbour.",
                "Invent a doctor.",
                "Make up a software engineer.",
                "Describe a famous painter.",
                "Invent a child.",
                "Describe a pilot.",
            ],
        ),
        (
            "address",
            s(json!({"type": "object", "properties": {
                "street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                "country": {"type": "string"}},
              "required": ["street", "city", "zip", "country"], "additionalProperties": false})),
            vec![
                "An address in Paris.",
                "Where does a baker in Rome live?",
                "A museum's address.",
                "An office in Berlin.",
                "A house by the sea.",
                "A school's address.",
                "An address in Tokyo.",
                "A farm's address.",
                "A hospital's address.",
                "Any address in Canada.",
            ],
        ),
        (
            "product",
            s(json!({"type": "object", "properties": {
                "title": {"type": "string"}, "price": {"type": "number", "minimum": 0},
                "in_stock": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}},
              "required": ["title", "price", "in_stock", "tags"], "additionalProperties": false})),
            vec![
                "A coffee mug for sale.",
                "A pair of running shoes.",
                "A used bicycle.",
                "A laptop.",
                "A winter coat.",
                "A board game.",
                "A kitchen knife.",
                "A garden hose.",
                "A desk lamp.",
                "A teddy bear.",
            ],
        ),
        (
            "event",
            s(json!({"type": "object", "properties": {
                "title": {"type": "string"}, "date": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
                "attendees": {"type": "integer", "minimum": 1, "maximum": 10000}},
              "required": ["title", "date", "attendees"], "additionalProperties": false})),
            vec![
                "A birthday party.",
                "A science conference.",
                "A football match.",
                "A wedding.",
                "A concert.",
                "A team meeting.",
                "A book launch.",
                "A marathon.",
                "A school play.",
                "A charity dinner.",
            ],
        ),
        (
            "sentiment",
            s(json!({"type": "object", "properties": {
                "sentiment": {"enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
              "required": ["sentiment", "confidence"], "additionalProperties": false})),
            vec![
                "Classify: 'I love this phone.'",
                "Classify: 'The service was slow.'",
                "Classify: 'It is a chair.'",
                "Classify: 'Best day ever!'",
                "Classify: 'I want a refund.'",
                "Classify: 'The train left at 9.'",
                "Classify: 'Terrible food.'",
                "Classify: 'Great value for money.'",
                "Classify: 'Meh.'",
                "Classify: 'The package arrived broken.'",
            ],
        ),
        (
            "todo",
            s(json!({"type": "object", "properties": {
                "tasks": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "object", "properties": {
                    "task": {"type": "string"}, "done": {"type": "boolean"}},
                  "required": ["task", "done"], "additionalProperties": false}}},
              "required": ["tasks"], "additionalProperties": false})),
            vec![
                "My chores for Saturday.",
                "Steps to bake bread.",
                "Plan a trip.",
                "Prepare for an exam.",
                "Move house.",
                "Start a garden.",
                "Organise a party.",
                "Clean the kitchen.",
                "Learn to swim.",
                "Write a report.",
            ],
        ),
        (
            "weather",
            s(json!({"type": "object", "properties": {
                "city": {"type": "string"}, "temperature_c": {"type": "integer", "minimum": -50, "maximum": 50},
                "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "storm"]}},
              "required": ["city", "temperature_c", "condition"], "additionalProperties": false})),
            vec![
                "Weather in Oslo.",
                "Weather in Cairo.",
                "Weather in London.",
                "Weather in Lima.",
                "Weather in Delhi.",
                "Weather in Moscow.",
                "Weather in Sydney.",
                "Weather in Quebec.",
                "Weather in Madrid.",
                "Weather in Nairobi.",
            ],
        ),
        (
            "entities",
            s(json!({"type": "object", "properties": {
                "people": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3},
                "places": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
              "required": ["people", "places"], "additionalProperties": false})),
            vec![
                "Extract: 'Anna met Bob in Paris.'",
                "Extract: 'Carl flew to Rome and Oslo.'",
                "Extract: 'Dana lives in Lima.'",
                "Extract: 'Eve and Fay visited Berlin.'",
                "Extract: 'Gus stayed home.'",
                "Extract: 'Hal drove from Leeds to York.'",
                "Extract: 'Ivy called Jon.'",
                "Extract: 'Kim toured Tokyo.'",
                "Extract: 'Lea sailed to Malta.'",
                "Extract: 'Max and Ned met at the station in Bern.'",
            ],
        ),
        (
            "review",
            s(json!({"type": "object", "properties": {
                "stars": {"type": "integer", "minimum": 1, "maximum": 5}, "summary": {"type": "string", "maxLength": 80},
                "recommend": {"type": "boolean"}},
              "required": ["stars", "summary", "recommend"], "additionalProperties": false})),
            vec![
                "Review a pizza place.",
                "Review a hotel.",
                "Review a film.",
                "Review a phone.",
                "Review a park.",
                "Review a book.",
                "Review a dentist.",
                "Review a train ride.",
                "Review a museum.",
                "Review a cafe.",
            ],
        ),
        (
            "order",
            s(json!({"type": "object", "properties": {
                "order_id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
                "items": {"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
                    "sku": {"type": "string", "maxLength": 12}, "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                  "required": ["sku", "qty"], "additionalProperties": false}},
                "express": {"type": "boolean"}},
              "required": ["order_id", "items", "express"], "additionalProperties": false})),
            vec![
                "An order of two books.",
                "An order of pens.",
                "An order of one lamp.",
                "An order of tea.",
                "An order of socks.",
                "An order of paint.",
                "An order of cables.",
                "An order of cups.",
                "An order of seeds.",
                "An order of tools.",
            ],
        ),
    ]
}

/// Validates `v` against the schema keywords these schemas use.
fn valid(v: &Value, s: &Value) -> Result<(), String> {
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return e.contains(v).then_some(()).ok_or(format!("{v} not in enum"));
    }
    let ty = s.get("type").and_then(Value::as_str).unwrap_or("");
    let num = |x: f64| -> Result<(), String> {
        if s.get("minimum").and_then(Value::as_f64).is_some_and(|m| x < m) {
            return Err(format!("{x} < minimum"));
        }
        if s.get("maximum").and_then(Value::as_f64).is_some_and(|m| x > m) {
            return Err(format!("{x} > maximum"));
        }
        Ok(())
    };
    match ty {
        "object" => {
            let o = v.as_object().ok_or("not an object")?;
            let props = s["properties"].as_object().cloned().unwrap_or_default();
            for r in s["required"].as_array().into_iter().flatten() {
                if !o.contains_key(r.as_str().unwrap_or("")) {
                    return Err(format!("missing {r}"));
                }
            }
            for (k, x) in o {
                match props.get(k) {
                    Some(ps) => valid(x, ps).map_err(|e| format!("{k}: {e}"))?,
                    None if s["additionalProperties"] == json!(false) => return Err(format!("extra key {k}")),
                    None => {}
                }
            }
            Ok(())
        }
        "array" => {
            let a = v.as_array().ok_or("not an array")?;
            if s.get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| (a.len() as u64) < m)
            {
                return Err("too few items".into());
            }
            if s.get("maxItems")
                .and_then(Value::as_u64)
                .is_some_and(|m| (a.len() as u64) > m)
            {
                return Err("too many items".into());
            }
            a.iter().try_for_each(|x| valid(x, &s["items"]))
        }
        "string" => {
            let t = v.as_str().ok_or("not a string")?;
            if s.get("maxLength")
                .and_then(Value::as_u64)
                .is_some_and(|m| t.chars().count() as u64 > m)
            {
                return Err("too long".into());
            }
            if let Some(p) = s.get("pattern").and_then(Value::as_str) {
                // the patterns used here: ^[0-9]{5}$, ^2026-[01][0-9]-[0-3][0-9]$, ^[A-Z]{2}[0-9]{4}$
                let ok = match p {
                    "^[0-9]{5}$" => t.len() == 5 && t.chars().all(|c| c.is_ascii_digit()),
                    "^[A-Z]{2}[0-9]{4}$" => {
                        t.len() == 6
                            && t[..2].chars().all(|c| c.is_ascii_uppercase())
                            && t[2..].chars().all(|c| c.is_ascii_digit())
                    }
                    _ => t.len() == 10 && t.starts_with("2026-") && t.as_bytes()[7] == b'-',
                };
                return ok.then_some(()).ok_or(format!("{t:?} does not match {p}"));
            }
            Ok(())
        }
        "integer" => num(v.as_i64().ok_or("not an integer")? as f64),
        "number" => num(v.as_f64().ok_or("not a number")?),
        "boolean" => v.as_bool().map(|_| ()).ok_or("not a boolean".into()),
        _ => Ok(()),
    }
}

fn validity(s: &Serve) {
    println!("## Validity: 10 schemas x 10 prompts (json_schema strict, temperature 0.7, max_tokens 400)\n");
    println!("| schema | valid | stop | length | mean tokens |\n|---|---|---|---|---|");
    let (mut all_valid, mut all) = (0, 0);
    for (name, schema, prompts) in schemas() {
        let (mut ok, mut stop, mut length, mut tokens) = (0, 0, 0, 0);
        for (i, p) in prompts.iter().enumerate() {
            let r = post(
                s.1,
                "/v1/chat/completions",
                &json!({"messages": [{"role": "user", "content": format!("{p} Answer in JSON.")}],
                        "max_tokens": 400, "temperature": 0.7, "seed": i,
                        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": true}}}),
            );
            let c = &r["choices"][0];
            let text = c["message"]["content"].as_str().unwrap_or("");
            tokens += r["usage"]["completion_tokens"].as_u64().unwrap_or(0);
            match c["finish_reason"].as_str() {
                Some("stop") => stop += 1,
                _ => length += 1,
            }
            match serde_json::from_str::<Value>(text)
                .map_err(|e| e.to_string())
                .and_then(|v| valid(&v, &schema))
            {
                Ok(()) => ok += 1,
                Err(e) => eprintln!("  {name} #{i} invalid ({e}): {text}"),
            }
        }
        all_valid += ok;
        all += prompts.len();
        println!(
            "| {name} | {ok}/{} | {stop} | {length} | {:.0} |",
            prompts.len(),
            tokens as f64 / prompts.len() as f64
        );
    }
    println!("\n**{all_valid}/{all} valid**\n");
}

fn run_streams(port: u16, k: usize, guided: bool) -> (f64, u64) {
    let t = Instant::now();
    let handles: Vec<_> = (0..k)
        .map(|i| {
            std::thread::spawn(move || {
                let mut body = json!({"prompt": format!("Stream {i}: a list of fruit names:"), "max_tokens": 128,
                                      "temperature": 0, "ignore_eos": true});
                if guided {
                    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "list",
                        "schema": {"type": "array", "items": {"type": "string"}, "minItems": 1000}}});
                }
                let r = post(port, "/v1/completions", &body);
                r["usage"]["completion_tokens"].as_u64().unwrap_or(0)
            })
        })
        .collect();
    let tokens: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (t.elapsed().as_secs_f64(), tokens)
}

fn cost(s: &Serve) {
    println!("## Cost: decode throughput with and without a grammar (128 tokens per stream, best of 3)\n");
    println!("| streams | plain tok/s | guided tok/s | cost | mean mask time per token |\n|---|---|---|---|---|");
    run_streams(s.1, 2, false);
    for k in [1usize, 16] {
        let mut best = [0.0f64; 2];
        let (m0, s0) = (
            metric(s.1, "kvgate:grammar_masks_total"),
            metric(s.1, "kvgate:grammar_mask_seconds_total"),
        );
        for _ in 0..3 {
            for (arm, guided) in [(0, false), (1, true)] {
                let (secs, tokens) = run_streams(s.1, k, guided);
                assert_eq!(tokens, 128 * k as u64, "every stream generates 128 tokens");
                best[arm] = best[arm].max(tokens as f64 / secs);
            }
        }
        let (m1, s1) = (
            metric(s.1, "kvgate:grammar_masks_total"),
            metric(s.1, "kvgate:grammar_mask_seconds_total"),
        );
        let per = (s1 - s0) / (m1 - m0).max(1.0);
        println!(
            "| {k} | {:.1} | {:.1} | {:+.1}% | {:.0} µs ({} masks) |",
            best[0],
            best[1],
            (best[0] / best[1] - 1.0) * 100.0,
            per * 1e6,
            m1 - m0
        );
    }
    println!();
}

fn main() {
    let parts = std::env::var("SO_PARTS").unwrap_or_else(|_| "validity,cost".into());
    let s = common::start(&[]);
    if parts.contains("validity") {
        validity(&s);
    }
    if parts.contains("cost") {
        cost(&s);
    }
}
