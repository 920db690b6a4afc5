//! The `/v1/decisions` wire: what it accepts, what it refuses (with the exact `param`), and how it maps
//! onto the decision service's spec.

use kvgate_decide::spec::{Content as SpecContent, Question, State};
use kvgate_model::prompt::Role as MsgRole;
use serde_json::{json, Value};

use super::*;
use crate::http::error::ApiError;

fn ok(v: Value) -> Parsed {
    parse(v, MAX_QUESTIONS).unwrap_or_else(|e| panic!("{e}"))
}

/// The `param` and message of a refusal.
fn refused(v: Value) -> (String, String) {
    match parse(v, MAX_QUESTIONS) {
        Err(ApiError::BadRequest { message, param }) => (param.unwrap_or_default(), message),
        Err(e) => panic!("not a 400: {e}"),
        Ok(p) => panic!("accepted: {p:?}"),
    }
}

fn body(input: Value, questions: Value) -> Value {
    json!({"model": "m", "input": input, "questions": questions})
}

fn predicate() -> Value {
    json!([{"type": "predicate", "instructions": "Is it broken?"}])
}

#[test]
fn accepts_every_item_and_part_and_null_as_absent() {
    let p = ok(json!({
        "model": "m",
        "input": [
            {"role": "system", "content": "Be careful."},
            {"role": "developer", "content": [{"type": "input_text", "text": "Rules.", "prompt_cache_breakpoint": null}]},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Order: ", "prompt_cache_breakpoint": {"mode": "explicit"}},
                {"type": "input_json", "data": {"b": 1, "a": [true, null]}}
            ]},
            {"role": "assistant", "phase": null, "content": [{"type": "output_text", "text": "Checking."}, {"type": "refusal", "refusal": "no"}]},
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{\"id\": 7}", "id": null, "namespace": null, "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "shipped"}]},
            {"type": "custom_tool_call", "call_id": "c2", "name": "sh", "input": "ls"},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "a.txt", "status": null}
        ],
        "questions": [
            {"type": "predicate", "instructions": [{"type": "input_text", "text": "Shipped?"}, {"type": "input_json", "data": [{"k": 1}]}], "name": null},
            {"type": "choice", "instructions": "Which?", "choices": [{"value": "true"}, {"value": true, "description": "yes"}, {"value": "x"}], "name": "c"},
            {"type": "score", "instructions": "How bad?", "levels": [{"label": "0", "description": "fine"}, {"label": "broken"}, {"label": "gone", "description": "lost"}]}
        ],
        "prompt_cache_key": null, "prompt_cache_options": null, "safety_identifier": null
    }));
    let State::Conversation(m) = &p.spec.state else {
        panic!("items are a conversation")
    };
    let roles: Vec<MsgRole> = m.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            MsgRole::System,
            MsgRole::System,
            MsgRole::User,
            MsgRole::Assistant,
            MsgRole::Tool,
            MsgRole::Assistant,
            MsgRole::Tool
        ]
    );
    assert_eq!(
        m[2].content, "Order: {\"b\":1,\"a\":[true,null]}",
        "input_json is compact JSON, keys as sent"
    );
    assert_eq!(m[3].content, "Checking.no");
    assert_eq!(
        m[3].tool_calls.as_ref().map(Vec::len),
        Some(1),
        "a call folds into the assistant turn"
    );
    assert_eq!(m[4].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(p.spec.breakpoints, vec![2], "the breakpoint closes the user message");
    assert!(
        !p.spec.breakpoints_only,
        "implicit mode: the session's state is kept too"
    );
    assert_eq!(p.spec.breakpoint_ttl.as_secs(), 1800);
    assert_eq!(
        p.spec.questions[0].1,
        Question::Noul {
            instructions: Some(SpecContent(json!("Shipped?\n[{\"k\":1}]"))),
            yes: None,
            no: None
        }
    );
    let Question::Choice { options, .. } = &p.spec.questions[1].1 else {
        panic!()
    };
    let shown: Vec<&str> = options.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        shown,
        ["\"true\"", "true", "\"x\""],
        "\"true\" and true are distinct: strings quoted"
    );
    assert_eq!(
        p.keys[1],
        AnswerKey::Choice {
            name: Some("c".into()),
            values: vec![
                ChoiceValue::Str("true".into()),
                ChoiceValue::Bool(true),
                ChoiceValue::Str("x".into())
            ]
        }
    );
    let Question::Score { levels, .. } = &p.spec.questions[2].1 else {
        panic!()
    };
    assert_eq!(levels, &vec![json!("fine"), json!("broken"), json!("gone: lost")]);
    assert_eq!(p.keys[0], AnswerKey::Predicate { name: None });
}

#[test]
fn a_string_input_is_the_systemone_text_state() {
    let p = ok(json!({
        "model": "m", "input": "The screen arrived broken.", "prompt_cache_key": "k1",
        "questions": [
            {"type": "choice", "instructions": "Team?", "choices": [{"value": "billing", "description": "Pay"}, {"value": "sales"}]},
            {"type": "score", "instructions": "How?", "levels": [{"label": "Calm"}, {"label": "Angry"}]}
        ]
    }));
    assert_eq!(p.spec.state, State::Text("The screen arrived broken.".into()));
    assert_eq!(
        p.spec.cache_salt, None,
        "prompt_cache_key is a session hint, not a partition"
    );
    assert_eq!(
        p.spec.questions[0].1,
        Question::Choice {
            instructions: SpecContent(json!("Team?")),
            options: vec![
                ("billing".into(), Some(SpecContent(json!("Pay")))),
                ("sales".into(), None)
            ]
        }
    );
    assert_eq!(
        p.spec.questions[1].1,
        Question::Score {
            instructions: SpecContent(json!("How?")),
            levels: vec![json!("Calm"), json!("Angry")]
        }
    );
}

/// OpenAI's choice of the breakpoints a request writes: the latest three beside the implicit one, the
/// latest four in explicit mode.
#[test]
fn the_latest_breakpoints_are_written() {
    let marked = |t: &str| json!({"role": "user", "content": [{"type": "input_text", "text": t, "prompt_cache_breakpoint": {"mode": "explicit"}}]});
    let input: Vec<Value> = (0..6).map(|i| marked(&format!("m{i}"))).collect();
    let p = ok(body(Value::Array(input.clone()), predicate()));
    assert_eq!(p.spec.breakpoints, vec![3, 4, 5]);
    let mut explicit = body(Value::Array(input), predicate());
    explicit["prompt_cache_options"] = json!({"mode": "explicit", "ttl": "30m"});
    let p = ok(explicit);
    assert_eq!(p.spec.breakpoints, vec![2, 3, 4, 5]);
    assert!(p.spec.breakpoints_only);
    let mut none = body(json!([{"role": "user", "content": "x"}]), predicate());
    none["prompt_cache_options"] = json!({"mode": "explicit"});
    let p = ok(none);
    assert!(
        p.spec.breakpoints.is_empty() && p.spec.breakpoints_only,
        "explicit without breakpoints writes nothing"
    );
}

#[test]
fn every_refusal_names_its_path() {
    let many: Vec<Value> = (0..401)
        .map(|_| json!({"type": "predicate", "instructions": "x"}))
        .collect();
    let choices = |n: usize| -> Value { (0..n).map(|i| json!({"value": format!("v{i}")})).collect() };
    let levels = |n: usize| -> Value { (0..n).map(|i| json!({"label": format!("l{i}")})).collect() };
    let deep = (0..33).fold(json!(1), |v, _| json!({ "a": v }));
    let wide: Vec<Value> = (0..5001).map(|i| json!({ "k": i })).collect();
    let big = json!({"s": "x".repeat(256 * 1024)});
    let cases: Vec<(Value, &str, &str)> = vec![
        (
            body(json!("s"), json!([])),
            "questions",
            "between 1 and 400 questions, got 0",
        ),
        (body(json!("s"), Value::Array(many)), "questions", "got 401"),
        (
            body(
                json!("s"),
                json!([{"type": "choice", "instructions": "q", "choices": choices(1)}]),
            ),
            "questions[0].choices",
            "between 2 and 255 choices, got 1",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "choice", "instructions": "q", "choices": choices(256)}]),
            ),
            "questions[0].choices",
            "got 256",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "choice", "instructions": "q", "choices": [{"value": "a"}, {"value": "a"}]}]),
            ),
            "questions[0].choices[1].value",
            "\"a\" is listed twice",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "score", "instructions": "q", "levels": levels(1)}]),
            ),
            "questions[0].levels",
            "between 2 and 10 levels, got 1",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "score", "instructions": "q", "levels": levels(11)}]),
            ),
            "questions[0].levels",
            "got 11",
        ),
        (
            body(json!("s"), json!([{"type": "noul", "instructions": "q"}])),
            "questions[0].type",
            "unknown variant `noul`",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "predicate", "instructions": "q", "criteria": {}}]),
            ),
            "questions[0]",
            "unknown field `criteria`",
        ),
        (
            body(
                json!([{"type": "function_call_output", "call_id": "c9", "output": "x"}]),
                predicate(),
            ),
            "input[0].call_id",
            "no earlier function_call has the call id \"c9\"",
        ),
        (
            body(
                json!([{"type": "function_call_output", "call_id": "c1", "output": "x"},
                       {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
                predicate(),
            ),
            "input[0].call_id",
            "no earlier function_call",
        ),
        (
            body(
                json!([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                       {"type": "custom_tool_call", "call_id": "c1", "name": "g", "input": ""}]),
                predicate(),
            ),
            "input[1].call_id",
            "used by an earlier call",
        ),
        (
            body(
                json!([{"type": "custom_tool_call", "call_id": "c1", "name": "g", "input": ""},
                       {"type": "function_call_output", "call_id": "c1", "output": "x"}]),
                predicate(),
            ),
            "input[1].call_id",
            "names a custom_tool_call",
        ),
        (
            json!({"model": "m", "input": "s", "questions": predicate(), "prompt_cache_options": {"ttl": "12h"}}),
            "prompt_cache_options.ttl",
            "\"30m\" is the only value",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_text", "text": "x", "prompt_cache_breakpoint": {"mode": "implicit"}}]}]),
                predicate(),
            ),
            "input[0].content[0]",
            "unknown variant `implicit`, expected `explicit`",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_json", "data": deep}]}]),
                predicate(),
            ),
            "input[0].content[0].data",
            "at most 32 nested levels, got 33",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_json", "data": wide}]}]),
                predicate(),
            ),
            "input[0].content[0].data",
            "at most 10000 values, got 10003",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_json", "data": big}]}]),
                predicate(),
            ),
            "input[0].content[0].data",
            "at most 262144 bytes",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_json", "data": 3}]}]),
                predicate(),
            ),
            "input[0].content[0].data",
            "an object or an array of objects",
        ),
        (
            json!({"model": "m", "input": "s", "questions": predicate(), "safety_identifier": "x".repeat(129)}),
            "safety_identifier",
            "at most 128 characters, got 129",
        ),
        (
            body(
                json!([{"role": "user", "content": [{"type": "input_text", "text": "look"}, {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]),
                predicate(),
            ),
            "input[0].content[1]",
            "does not support image input",
        ),
        (
            body(
                json!("s"),
                json!([{"type": "predicate", "instructions": [{"type": "input_image", "image_url": "https://x/y.png"}]}]),
            ),
            "questions[0].instructions[0]",
            "does not support image input",
        ),
        (
            body(
                json!([{"role": "system", "content": [{"type": "input_json", "data": {}}]}]),
                predicate(),
            ),
            "input[0].content[0]",
            "\"input_json\" is not allowed here",
        ),
        (
            body(
                json!([{"role": "user", "content": "x", "phase": "commentary"}]),
                predicate(),
            ),
            "input[0].phase",
            "only an assistant message",
        ),
        (body(json!([]), predicate()), "input", "at least one item"),
        (body(json!(5), predicate()), "input", "expected one of the forms"),
        (
            body(json!([{"role": "tool", "content": "x"}]), predicate()),
            "input[0].role",
            "unknown variant `tool`",
        ),
        (
            json!({"model": "m", "input": "s", "questions": predicate(), "temperature": 0}),
            "temperature",
            "unknown field",
        ),
        (
            json!({"input": "s", "questions": predicate()}),
            "",
            "missing field `model`",
        ),
        (
            json!({"model": "m", "input": "s", "questions": predicate(), "x_refuse_below": 2}),
            "x_refuse_below",
            "between 0 and 1",
        ),
    ];
    let mut wrong = vec![];
    for (v, param, msg) in cases {
        let (p, m) = refused(v.clone());
        if p != param || !m.contains(msg) {
            wrong.push(format!("want {param:?} ~ {msg:?}, got {p:?}: {m:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(parse(body(json!("s"), predicate()), 1).is_ok());
    let two = json!([{"type": "predicate", "instructions": "a"}, {"type": "predicate", "instructions": "b"}]);
    assert!(parse(body(json!("s"), two), 1)
        .unwrap_err()
        .to_string()
        .contains("between 1 and 1 questions, got 2"));
}
