//! Tests of `wire.rs`.

use super::*;
use serde_json::json;

fn errs(v: Value) -> Vec<(String, Vec<String>)> {
    parse(v.to_string().as_bytes(), 64)
        .unwrap_err()
        .into_iter()
        .map(|d| (d.kind.to_string(), d.loc))
        .collect()
}

fn loc(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_spec_example_parses_in_order() {
    let r = parse(
        json!({
            "state": "Help!", "model": "m",
            "questions": {
                "is_urgent": {"type": "noul", "instructions": "Urgent?", "criteria": {"true": "yes", "false": "no"}},
                "department": {"type": "choice", "instructions": "Team?", "criteria": {"billing": "Pay", "technical": null, "sales": null}},
                "frustration": {"type": "score", "instructions": "How?", "criteria": ["Calm", "Frustrated", "Very angry"]}
            },
            "unknown_top_level": 1
        })
        .to_string()
        .as_bytes(),
        64,
    )
    .unwrap();
    let ids: Vec<&str> = r.spec.questions.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(ids, ["is_urgent", "department", "frustration"]);
    assert!(matches!(&r.spec.questions[1].1, Question::Choice { options, .. } if options.len() == 3));
}

#[test]
fn reports_every_problem() {
    let got = errs(json!({
        "state": 5,
        "questions": {
            "a": {"type": "maybe"},
            "b": {"type": "choice", "criteria": {"x": null, " X ": null}, "instruction": "typo"},
            "c": {"type": "score", "instructions": "s", "criteria": ["only one"]},
            "d": {"type": "noul", "criteria": {"true": "t", "perhaps": "p"}},
            "e": {"type": "noul"},
            "f": "not an object"
        }
    }));
    let want = vec![
        ("value_error", loc(&["body", "state"])),
        ("literal_error", loc(&["body", "questions", "a", "type"])),
        ("extra_forbidden", loc(&["body", "questions", "b", "instruction"])),
        ("missing", loc(&["body", "questions", "b", "instructions"])),
        ("value_error", loc(&["body", "questions", "b", "criteria", " X "])),
        ("too_short", loc(&["body", "questions", "c", "criteria"])),
        (
            "extra_forbidden",
            loc(&["body", "questions", "d", "criteria", "perhaps"]),
        ),
        ("missing", loc(&["body", "questions", "e", "instructions"])),
        ("dict_type", loc(&["body", "questions", "f"])),
    ];
    let want: Vec<(String, Vec<String>)> = want.into_iter().map(|(k, l)| (k.to_string(), l)).collect();
    assert_eq!(got, want);
}

#[test]
fn missing_fields_and_bad_json() {
    assert_eq!(
        errs(json!({})),
        vec![
            ("missing".to_string(), loc(&["body", "state"])),
            ("missing".to_string(), loc(&["body", "questions"]))
        ]
    );
    let e = parse(b"{not json", 64).unwrap_err();
    assert_eq!(e[0].kind, "json_invalid");
    assert_eq!(errs(json!({"state": "s", "questions": {}}))[0].0, "too_short");
    let many: Map<String, Value> = (0..65)
        .map(|i| (format!("q{i}"), json!({"type": "noul", "instructions": "x"})))
        .collect();
    assert_eq!(errs(json!({"state": "s", "questions": many}))[0].0, "too_long");
}

#[test]
fn conversation_state_and_structured_state() {
    let r = parse(
        json!({"state": [{"role": "user", "content": "hi"}], "questions": {"q": {"type": "noul", "instructions": "x"}}})
            .to_string()
            .as_bytes(),
        64,
    )
    .unwrap();
    assert!(matches!(r.spec.state, State::Conversation(_)));
    let r = parse(
        json!({"state": {"b": 1, "a": [true, null]}, "questions": {"q": {"type": "noul", "instructions": "x"}}})
            .to_string()
            .as_bytes(),
        64,
    )
    .unwrap();
    assert_eq!(
        r.spec.state,
        State::Text("{\"b\":1,\"a\":[true,null]}".into()),
        "compact JSON, keys in the order sent"
    );
}

#[test]
fn read_method_and_orders() {
    for name in ReadMethod::names() {
        assert_eq!(read_method(Some(&Value::from(name))).unwrap().unwrap().name(), name);
    }
    let bad = read_method(Some(&Value::from("shuffled"))).unwrap_err();
    assert!(bad.contains("'cloze+calibrated'"), "{bad}");
    // absent: the served model's default, chosen by the service
    assert_eq!(read_method(None), Ok(None));
    assert_eq!(orders(Some(&Value::from(2))), Ok(Some(2)));
    assert_eq!(orders(None), Ok(None));
    for bad in [Value::from(0), Value::from(9), Value::from(1.5), Value::from("2")] {
        assert!(orders(Some(&bad)).is_err(), "{bad}");
    }
}
