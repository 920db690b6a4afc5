//! System One over HTTP in process, over the tiny model: the Jev drop-in (model names and aliases,
//! Jev's error shapes, compressed bodies), choices of 2 to 255 options read in balanced orders,
//! calibration by the content-free prior, fewer orders and per-type temperature.

mod common;

use common::{assert_openai_error, InProcess};
use serde_json::json;

/// The tiny model (fitted for nothing) reads cloze+calibrated by default; the tests of letter reads
/// name `ordered+calibrated` as the server's default.
const LETTERS: &[&str] = &["--decision-read", "ordered+calibrated"];

/// Question `q`'s probabilities by option name.
fn probs(r: &serde_json::Value) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = r["answers"]["q"]["probabilities"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The states calibration reads in place of the request's (`kvgate_decide::reads`).
const CONTENT_FREE: [&str; 3] = ["N/A", "", "[MASK]"];

/// Question `q`'s distribution as the wire gives it: yes/no as [p, 1 − p], else by option name.
fn dist(r: &serde_json::Value, q: &str) -> Vec<f64> {
    let a = &r["answers"][q];
    match a["noul"].as_f64() {
        Some(p) => vec![p, 1.0 - p],
        None => {
            let mut v: Vec<(&String, f64)> = a["probabilities"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k, v.as_f64().unwrap()))
                .collect();
            v.sort_by(|a, b| a.0.cmp(b.0));
            v.into_iter().map(|x| x.1).collect()
        }
    }
}

/// The element-wise mean of distributions.
fn mean(ds: impl Iterator<Item = Vec<f64>>) -> Vec<f64> {
    let ds: Vec<Vec<f64>> = ds.collect();
    (0..ds[0].len())
        .map(|i| ds.iter().map(|d| d[i]).sum::<f64>() / ds.len() as f64)
        .collect()
}

/// `p` divided by `prior`, renormalised.
fn divided(p: &[f64], prior: &[f64]) -> Vec<f64> {
    let q: Vec<f64> = p.iter().zip(prior).map(|(a, b)| a / b).collect();
    let t: f64 = q.iter().sum();
    q.iter().map(|x| x / t).collect()
}

fn noul_request(model: &str, state: &str) -> serde_json::Value {
    json!({"model": model, "state": state, "questions": {"q": {"type": "noul", "instructions": "Is it urgent?"}}})
}

#[test]
fn jev_drop_in_names_models_errors_and_compressed_bodies() {
    use std::io::Write;
    let s = InProcess::tiny(&[
        "--api-key",
        "k",
        "--max-request-body",
        "64KiB",
        "--model-alias",
        "jev-latest,router",
    ]);
    let auth = ("Authorization", "Bearer k");
    // /v1/models: OpenAI's data[] and Jev's models[] (served name and aliases, each with the three fields)
    let (st, _, b) = s.raw("GET", "/v1/models", &[auth], b"").unwrap();
    assert_eq!(st, 200);
    let m = common::parse(&b);
    assert!(m["data"][0]["id"].is_string());
    let names: Vec<&str> = m["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[1..], ["jev-latest", "router"]);
    for x in m["models"].as_array().unwrap() {
        assert!(
            x["description"].is_string() && x["release_date"].as_str().unwrap().len() == 10,
            "{x}"
        );
    }
    let post = |body: &[u8], headers: &[(&str, &str)]| {
        let (st, _, b) = s.raw("POST", "/v1/systemone", headers, body).unwrap();
        (st, common::parse(&b))
    };
    let json_ct = ("Content-Type", "application/json");
    let plain = noul_request("router", &"payouts fail. ".repeat(40)).to_string();
    let (st, want) = post(plain.as_bytes(), &[auth, json_ct]);
    assert_eq!(st, 200, "an alias is the served model: {want}");
    // the same body compressed, as the Jev SDK sends it (zstd) and as other clients do
    let gz = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(plain.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let zl = {
        let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(plain.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let zs = zstd::encode_all(plain.as_bytes(), 3).unwrap();
    for (enc, body) in [("zstd", &zs), ("gzip", &gz), ("deflate", &zl)] {
        let (st, got) = post(body, &[auth, json_ct, ("Content-Encoding", enc)]);
        assert_eq!(st, 200, "{enc}: {got}");
        assert_eq!(got["answers"], want["answers"], "{enc}");
    }
    // a compressed bomb: small on the wire, over the limit decompressed → 413 naming the limit
    let bomb = zstd::encode_all(noul_request("router", &"a".repeat(1 << 20)).to_string().as_bytes(), 19).unwrap();
    assert!(bomb.len() < 64 << 10);
    let (st, r) = post(&bomb, &[auth, json_ct, ("Content-Encoding", "zstd")]);
    common::assert_jev_error(st, &r, 413, "request_too_large");
    assert!(r["detail"]["message"].as_str().unwrap().contains("65536"), "{r}");
    let (st, r) = post(plain.as_bytes(), &[auth, json_ct, ("Content-Encoding", "snappy")]);
    common::assert_jev_error(st, &r, 415, "unsupported_media_type");
    // Jev's error shape on /v1/systemone, OpenAI's elsewhere
    let (st, r) = post(plain.as_bytes(), &[json_ct]);
    common::assert_jev_error(st, &r, 401, "authentication_error");
    let (st, r) = post(plain.as_bytes(), &[("Authorization", "Bearer wrong"), json_ct]);
    common::assert_jev_error(st, &r, 401, "authentication_error");
    let (st, r) = post(noul_request("gpt-9", "x").to_string().as_bytes(), &[auth, json_ct]);
    common::assert_jev_error(st, &r, 404, "not_found");
    let (st, _, b) = s.raw("GET", "/v1/systemone", &[auth], b"").unwrap();
    common::assert_jev_error(st, &common::parse(&b), 405, "method_not_allowed");
    let (st, r) = post(b"{\"state\": 1", &[auth, json_ct]);
    assert_eq!((st, r["detail"][0]["type"].as_str()), (422, Some("json_invalid")));
    let (st, _, b) = s.raw("POST", "/v1/completions", &[json_ct], b"{}").unwrap();
    assert_openai_error(st, &common::parse(&b), 401);
    let (st, _, b) = s
        .raw(
            "POST",
            "/v1/completions",
            &[auth, json_ct, ("Content-Encoding", "gzip")],
            &gz,
        )
        .unwrap();
    assert_ne!(
        st,
        415,
        "compressed bodies are accepted on every route: {}",
        String::from_utf8_lossy(&b)
    );
    // aliases belong to the decision API; the OpenAI routes name only served models
    let (st, _, b) = s
        .raw(
            "POST",
            "/v1/completions",
            &[auth, json_ct],
            br#"{"model": "router", "prompt": "hi", "max_tokens": 1}"#,
        )
        .unwrap();
    assert_openai_error(st, &common::parse(&b), 404);
}

#[test]
fn choices_of_2_to_255_options() {
    // temperature 1: the raw read, to see the mass spread over every branch
    let s = InProcess::tiny_long(&["--decision-temperature", "1"], 4096);
    let state = "The invoice was charged twice; please refund the second charge.";
    let ask = |n: usize| {
        let criteria: serde_json::Map<String, serde_json::Value> = (1..=n)
            .map(|i| {
                (
                    format!("q{i}"),
                    if i % 3 == 0 {
                        json!(format!("queue {i}"))
                    } else {
                        json!(null)
                    },
                )
            })
            .collect();
        let (st, r) = s.post(
            "/v1/systemone",
            &json!({"state": state, "diagnostics": true,
                    "questions": {"q": {"type": "choice", "instructions": "Which queue?", "criteria": criteria}}}),
        );
        assert_eq!(st, 200, "{n} options: {r}");
        r
    };
    for n in [2, 26, 27, 64, 255] {
        let r = ask(n);
        let a = &r["answers"]["q"];
        let p = a["probabilities"].as_object().unwrap();
        let names: Vec<String> = (1..=n).map(|i| format!("q{i}")).collect();
        assert_eq!(
            p.keys().cloned().collect::<Vec<_>>(),
            names,
            "{n}: keys in option order"
        );
        let units: u64 = p.values().map(|v| (v.as_f64().unwrap() * 1e6).round() as u64).sum();
        assert_eq!(units, 1_000_000, "{n}: sums to exactly 1");
        let best = p
            .iter()
            .max_by(|a, b| a.1.as_f64().unwrap().total_cmp(&b.1.as_f64().unwrap()))
            .unwrap();
        assert_eq!(a["choice"].as_str(), Some(best.0.as_str()), "{n}: choice is the argmax");
        if n > 26 {
            // numbered labels read through their digits: the mass spreads over options past the 26th
            let beyond = p.values().skip(26).filter(|v| v.as_f64().unwrap() > 0.0).count();
            assert!(beyond * 2 > n - 26, "{n}: {p:?}");
        }
        let again = ask(n);
        assert_eq!(
            again["answers"], r["answers"],
            "{n}: the same answer warm (branch reads from the cache)"
        );
        assert!(
            again["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 0
        );
    }
    let (st, _) = s.post(
        "/v1/systemone",
        &json!({"state": state, "questions": {"q": {"type": "choice", "instructions": "Which?",
                "criteria": (1..=256).map(|i| (format!("q{i}"), json!(null))).collect::<serde_json::Map<_, _>>()}}}),
    );
    assert_eq!(st, 422, "256 options is beyond the limit");
}

#[test]
fn choices_are_read_in_balanced_orders_and_do_not_depend_on_listing() {
    let s = InProcess::tiny(LETTERS);
    let ask = |criteria: serde_json::Value, read: Option<&str>| {
        let mut body = json!({"state": "The invoice was charged twice.", "diagnostics": true,
                              "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": criteria}}});
        if let Some(r) = read {
            body["x_read"] = json!(r);
        }
        let (st, r) = s.post("/v1/systemone", &body);
        assert_eq!(st, 200, "{r}");
        r
    };
    let listed = [
        json!({"billing": "payments", "tech": null, "sales": "deals", "legal": null, "ops": null}),
        json!({"ops": null, "legal": null, "sales": "deals", "tech": null, "billing": "payments"}),
        json!({"sales": "deals", "billing": "payments", "ops": null, "tech": null, "legal": null}),
    ];
    let first = ask(listed[0].clone(), None);
    let d = &first["diagnostics"]["q"];
    assert_eq!(
        (d["x_read"].as_str(), d["x_orders"].as_u64()),
        (Some("ordered+calibrated"), Some(5)),
        "{d}"
    );
    let first_ordered = ask(listed[0].clone(), Some("ordered"));
    // set: the options as parallel branches of one read (tree attention), exact to the bit
    let first_set = ask(listed[0].clone(), Some("set"));
    let first_set_cal = ask(listed[0].clone(), Some("set+calibrated"));
    assert_eq!(
        (
            first_set["diagnostics"]["q"]["x_read"].as_str(),
            first_set["diagnostics"]["q"]["x_orders"].as_u64()
        ),
        (Some("set"), Some(1)),
        "{first_set}"
    );
    assert_eq!(first_set_cal["diagnostics"]["q"]["x_read"], "set+calibrated");
    assert_ne!(
        probs(&first_set),
        probs(&first_ordered),
        "a set read is not the rotations' average"
    );
    for l in &listed[1..] {
        let reads = [
            (None, &first),
            (Some("ordered"), &first_ordered),
            (Some("set"), &first_set),
            (Some("set+calibrated"), &first_set_cal),
        ];
        for (read, want) in reads {
            let r = ask(l.clone(), read);
            assert_eq!(
                probs(&r),
                probs(want),
                "{read:?}: the same distribution however the options are listed"
            );
            assert_eq!(r["answers"]["q"]["choice"], want["answers"]["q"]["choice"]);
        }
    }
    // plain: one read as listed (so the listing can matter)
    let plain: Vec<_> = listed.iter().map(|l| ask(l.clone(), Some("plain"))).collect();
    assert_eq!(plain[0]["diagnostics"]["q"]["x_read"], "plain");
    assert_eq!(plain[0]["diagnostics"]["q"]["x_orders"], 1);
    assert!(
        plain.iter().any(|r| probs(r) != probs(&plain[0])),
        "the tiny model's plain read depends on the listing (else this test shows nothing)"
    );
    let (st, r) = s.post(
        "/v1/systemone",
        &json!({"state": "x", "x_read": "shuffled", "questions": {"q": {"type": "noul", "instructions": "?"}}}),
    );
    assert_eq!(st, 422, "{r}");
    assert_eq!(r["detail"][0]["loc"], json!(["body", "x_read"]));
}

#[test]
fn calibration_divides_out_the_content_free_prior() {
    let s = InProcess::tiny(LETTERS);
    let qs = json!({
        "n": {"type": "noul", "instructions": "Is it urgent?"},
        "c": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": null, "tech": null, "sales": "deals"}},
        "s": {"type": "score", "instructions": "How angry?", "criteria": ["calm", "annoyed", "furious"]}
    });
    let ask = |state: &str, read: &str| {
        let (st, r) = s.post(
            "/v1/systemone",
            &json!({"state": state, "x_read": read, "diagnostics": true, "questions": qs}),
        );
        assert_eq!(st, 200, "{r}");
        r
    };
    // calibration divides out the mean of the same reads over the three content-free states
    // ("N/A", "", "[MASK]"): checked against the uncalibrated reads of those states
    let state = "The printer is on fire.";
    for (read, raw) in [("calibrated", "plain"), ("ordered+calibrated", "ordered")] {
        let got = ask(state, read);
        let uncal = ask(state, raw);
        let priors: Vec<serde_json::Value> = CONTENT_FREE.iter().map(|cf| ask(cf, raw)).collect();
        for q in ["n", "c", "s"] {
            let prior = mean(priors.iter().map(|r| dist(r, q)));
            let want = divided(&dist(&uncal, q), &prior);
            let got_q = dist(&got, q);
            for (g, w) in got_q.iter().zip(&want) {
                assert!((g - w).abs() < 2e-5, "{read} {q}: {got_q:?} vs {want:?}");
            }
            // one content-free state alone would not give these numbers
            let one = divided(&dist(&uncal, q), &dist(&priors[0], q));
            assert!(one.iter().zip(&want).any(|(a, b)| (a - b).abs() > 1e-3), "{read} {q}");
            // ordering applies to choices only: a score is read once, calibrated
            let want = if q == "c" { read } else { "calibrated" };
            assert_eq!(got["diagnostics"][q]["x_read"], want);
        }
    }
    // a real state: calibration moves the answer, ordered+calibrated keeps the listing-independence
    let plain = ask("The server is down and customers are shouting.", "plain");
    let cal = ask("The server is down and customers are shouting.", "calibrated");
    assert_ne!(plain["answers"]["n"], cal["answers"]["n"]);
    assert_eq!(cal["diagnostics"]["c"]["x_orders"], 1);
    let oc = ask("The server is down and customers are shouting.", "ordered+calibrated");
    assert_eq!(oc["diagnostics"]["c"]["x_orders"], 3);
    // every question shape here was calibrated before: its prior now comes from the cache, and the
    // answers are the same as with the prior read again
    for q in ["n", "c", "s"] {
        assert_eq!(oc["diagnostics"][q]["x_prior"], "cached", "{oc}");
    }
    assert!(plain["diagnostics"]["n"].get("x_prior").is_none());
    let s2 = InProcess::tiny(LETTERS);
    let (_, fresh) = s2.post(
        "/v1/systemone",
        &json!({"state": "The server is down and customers are shouting.", "diagnostics": true, "questions": qs}),
    );
    assert_eq!(fresh["diagnostics"]["c"]["x_prior"], "computed");
    assert_eq!(fresh["answers"], oc["answers"]);
    // yes/no questions left uncalibrated (as fitted for a stronger model): read as plain reads them,
    // choices and scores still calibrated
    let s3 = InProcess::tiny(&[
        "--decision-yes-no-calibration",
        "false",
        "--decision-read",
        "ordered+calibrated",
    ]);
    let (_, off) = s3.post(
        "/v1/systemone",
        &json!({"state": "The server is down and customers are shouting.", "diagnostics": true, "questions": qs}),
    );
    assert_eq!(off["diagnostics"]["n"]["x_read"], "plain", "{off}");
    assert!(off["diagnostics"]["n"].get("x_prior").is_none(), "{off}");
    assert_eq!(off["answers"]["n"], plain["answers"]["n"]);
    assert_eq!(off["answers"]["c"], oc["answers"]["c"]);
    assert_eq!(off["answers"]["s"], oc["answers"]["s"]);
    // the second identical request takes the prior from the cache (no content-free read) and answers
    // the same
    let (_, again) = s2.post(
        "/v1/systemone",
        &json!({"state": "The server is down and customers are shouting.", "diagnostics": true, "questions": qs}),
    );
    assert_eq!(again["answers"], fresh["answers"]);
    assert_eq!(again["diagnostics"]["c"]["x_prior"], "cached");
}

#[test]
fn fewer_orders_and_per_type_temperature() {
    let s = InProcess::tiny(LETTERS);
    let hot = InProcess::tiny(&[
        "--decision-temperature",
        "choice=2,noul=0.5",
        "--decision-read",
        "ordered+calibrated",
    ]);
    let body = |criteria: serde_json::Value, orders: Option<u64>| {
        let mut b = json!({"state": "The invoice was charged twice.", "diagnostics": true,
                           "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": criteria},
                                         "n": {"type": "noul", "instructions": "Is it urgent?"}}});
        if let Some(k) = orders {
            b["x_orders"] = json!(k);
        }
        b
    };
    let a = json!({"billing": null, "tech": null, "sales": null, "legal": null});
    let b = json!({"legal": null, "sales": null, "billing": null, "tech": null});
    // two orders (canonical and reversed) still do not depend on the listing
    let (_, ra) = s.post("/v1/systemone", &body(a.clone(), Some(2)));
    let (_, rb) = s.post("/v1/systemone", &body(b, Some(2)));
    assert_eq!(ra["diagnostics"]["q"]["x_orders"], 2, "{ra}");
    assert_eq!(ra["answers"]["q"], rb["answers"]["q"]);
    let (st, bad) = s.post("/v1/systemone", &body(a.clone(), Some(9)));
    assert_eq!(st, 422, "{bad}");
    assert_eq!(bad["detail"][0]["loc"], json!(["body", "x_orders"]));
    // temperature: same answer, softer choice, sharper noul
    let (_, cold) = s.post("/v1/systemone", &body(a.clone(), None));
    let (_, warm) = hot.post("/v1/systemone", &body(a, None));
    assert_eq!(warm["diagnostics"]["q"]["x_temperature"], 2.0);
    assert_eq!(
        cold["diagnostics"]["q"]["x_temperature"], 1.0,
        "a model not fitted keeps every type's distribution as read"
    );
    assert_eq!(cold["diagnostics"]["n"]["x_temperature"], 1.0);
    assert_eq!(warm["answers"]["q"]["choice"], cold["answers"]["q"]["choice"]);
    let top = |r: &serde_json::Value| {
        r["answers"]["q"]["probabilities"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .fold(0.0, f64::max)
    };
    assert!(top(&warm) < top(&cold), "{} vs {}", top(&warm), top(&cold));
    let (n0, n1) = (
        cold["answers"]["n"]["noul"].as_f64().unwrap(),
        warm["answers"]["n"]["noul"].as_f64().unwrap(),
    );
    assert!((n1 - 0.5).abs() > (n0 - 0.5).abs(), "{n0} -> {n1}");
}

#[test]
fn cloze_reads_answer_by_name_in_one_read() {
    let s = InProcess::tiny(&[]);
    let ask = |state: &str, criteria: serde_json::Value, read: &str| {
        let (st, r) = s.post(
            "/v1/systemone",
            &json!({"state": state, "x_read": read, "diagnostics": true,
                    "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": criteria}}}),
        );
        assert_eq!(st, 200, "{r}");
        r
    };
    let state = "The invoice was charged twice.";
    let listed = [
        json!({"billing": "payments", "tech": null, "sales": "deals", "legal": null}),
        json!({"legal": null, "sales": "deals", "tech": null, "billing": "payments"}),
    ];
    let first = ask(state, listed[0].clone(), "cloze+calibrated");
    let d = &first["diagnostics"]["q"];
    assert_eq!(
        (d["x_read"].as_str(), d["x_orders"].as_u64(), d["x_prior"].as_str()),
        (Some("cloze+calibrated"), Some(1), Some("computed")),
        "{d}"
    );
    let total: f64 = probs(&first).iter().map(|p| p.1).sum();
    assert!((total - 1.0).abs() < 1e-9, "{first}");
    // a model nothing was fitted for (the tiny one) reads cloze+calibrated when a request does not say
    let (_, default) = s.post(
        "/v1/systemone",
        &json!({"state": state, "diagnostics": true,
                "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": listed[0]}}}),
    );
    assert_eq!(default["diagnostics"]["q"]["x_read"], "cloze+calibrated", "{default}");
    assert_eq!(probs(&default), probs(&first));
    // one canonical listing: the same bits however the request lists the options; the prior cached
    let again = ask(state, listed[1].clone(), "cloze+calibrated");
    assert_eq!(probs(&again), probs(&first));
    assert_eq!(again["diagnostics"]["q"]["x_prior"], "cached");
    // calibration divides out the mean of the cloze reads over the content-free states
    let raw: Vec<f64> = probs(&ask(state, listed[0].clone(), "cloze"))
        .iter()
        .map(|p| p.1)
        .collect();
    let prior = mean(CONTENT_FREE.iter().map(|cf| {
        probs(&ask(cf, listed[0].clone(), "cloze"))
            .iter()
            .map(|p| p.1)
            .collect()
    }));
    let want = divided(&raw, &prior);
    for (g, w) in probs(&first).iter().zip(&want) {
        assert!((g.1 - w).abs() < 2e-5, "{first} vs {want:?}");
    }
    // by name, not by letter: another distribution than the canonical letter read
    let cloze = ask(state, listed[0].clone(), "cloze");
    assert_eq!(cloze["diagnostics"]["q"]["x_read"], "cloze");
    let letters = ask(state, listed[0].clone(), "ordered");
    assert_ne!(probs(&cloze), probs(&letters));
    // names sharing their first tokens: one more read at the branch point, still a distribution
    let shared = ask(
        state,
        json!({"billing_refund": null, "billing_dispute": null, "tech": null}),
        "cloze+calibrated",
    );
    assert_eq!(shared["diagnostics"]["q"]["x_read"], "cloze+calibrated", "{shared}");
    let total: f64 = probs(&shared).iter().map(|p| p.1).sum();
    assert!((total - 1.0).abs() < 1e-9, "{shared}");
    // a name whose tokens begin another's cannot be told apart by name: read by letter in the
    // canonical order, exactly as one ordered read
    let prefix = json!({"bug": null, "bug fix": null, "tech": null});
    let fallback = ask(state, prefix.clone(), "cloze+calibrated");
    assert_eq!(fallback["diagnostics"]["q"]["x_read"], "calibrated", "{fallback}");
    let (_, one) = s.post(
        "/v1/systemone",
        &json!({"state": state, "x_read": "ordered+calibrated", "x_orders": 1, "diagnostics": true,
                "questions": {"q": {"type": "choice", "instructions": "Which team?", "criteria": prefix}}}),
    );
    assert_eq!(probs(&fallback), probs(&one));
}
