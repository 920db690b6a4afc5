//! The System One request: parsing and validation that reports **every** problem at once as a 422
//! detail list (`{"type", "loc", "msg", "input"}`), with the types clients know (`missing`,
//! `json_invalid`, `string_type`, `dict_type`, `list_type`, `literal_error`, `too_short`, `too_long`,
//! `extra_forbidden`, `value_error`).
//!
//! Unknown top-level fields are ignored (the published schema allows it); unknown fields inside a
//! question are refused (a typo must not silently change the answer).
//!
//! This is the one wire format kvgate walks by hand instead of deserialising into serde types, on
//! purpose: Jev's clients expect every problem of a request in one 422, and serde stops at the first.
//! What it produces is typed: a [`DecisionSpec`] for the decision service.

use std::time::Duration;

use kvgate_decide::orders::{ReadMethod, MAX_ORDERS};
use kvgate_decide::spec::{Content, DecisionSpec, Question, State, MAX_KEEP_ALIVE};
use serde_json::{Map, Value};

use crate::http::error::Detail;

/// Parses `x_read` (absent or null: none, the served model's default).
fn read_method(v: Option<&Value>) -> Result<Option<ReadMethod>, String> {
    let expected = || {
        let names: Vec<String> = ReadMethod::names().map(|n| format!("'{n}'")).collect();
        format!("Input should be one of {}", names.join(", "))
    };
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => ReadMethod::from_name(s).map(Some).ok_or_else(expected),
        Some(_) => Err(expected()),
    }
}

/// Parses `x_orders` (absent or null: none, the served model's default).
fn orders(v: Option<&Value>) -> Result<Option<usize>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match n.as_u64() {
            Some(k) if (1..=MAX_ORDERS as u64).contains(&k) => Ok(Some(k as usize)),
            _ => Err(format!("Input should be an integer from 1 to {MAX_ORDERS}")),
        },
        Some(_) => Err("Input should be a valid integer".into()),
    }
}

/// A parsed `/v1/systemone` request: the decision's spec and what only the wire has.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The model asked for, if any.
    pub model: Option<String>,
    /// Add `diagnostics` to the response.
    pub diagnostics: bool,
    /// What to decide (`cache_salt` and `tenant` as sent; the route joins the tenant's).
    pub spec: DecisionSpec,
}

struct Errors(Vec<Detail>);

impl Errors {
    fn push(&mut self, kind: &'static str, loc: &[&str], msg: impl Into<String>, input: &Value) {
        self.0.push(Detail {
            kind,
            loc: std::iter::once("body")
                .chain(loc.iter().copied())
                .map(str::to_string)
                .collect(),
            msg: msg.into(),
            input: input.clone(),
        });
    }
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

fn is_message(v: &Value) -> bool {
    v.as_object().is_some_and(|o| {
        o.get("role")
            .and_then(Value::as_str)
            .is_some_and(|r| ROLES.contains(&r))
            && o.contains_key("content")
    })
}

/// Checks a content field: a string, an object or an array (non-blank when a string and `non_blank`).
fn content(e: &mut Errors, loc: &[&str], v: &Value, non_blank: bool) -> Option<Content> {
    match v {
        Value::String(s) if non_blank && s.trim().is_empty() => {
            e.push("value_error", loc, "Value error, must not be blank", v);
            None
        }
        Value::String(_) | Value::Object(_) | Value::Array(_) => Some(Content(v.clone())),
        _ => {
            e.push(
                "value_error",
                loc,
                "Value error, must be a string, an object or an array",
                v,
            );
            None
        }
    }
}

fn check_fields(e: &mut Errors, loc: &[&str], obj: &Map<String, Value>, allowed: &[&str]) {
    for k in obj.keys() {
        if !allowed.contains(&k.as_str()) {
            let mut l = loc.to_vec();
            l.push(k);
            e.push("extra_forbidden", &l, "Extra inputs are not permitted", &obj[k]);
        }
    }
}

fn question(e: &mut Errors, id: &str, v: &Value) -> Option<Question> {
    let base = ["questions", id];
    let Some(obj) = v.as_object() else {
        e.push("dict_type", &base, "Input should be a valid dictionary", v);
        return None;
    };
    let kind = match obj.get("type") {
        None => {
            e.push("missing", &["questions", id, "type"], "Field required", v);
            return None;
        }
        Some(Value::String(t)) if ["noul", "choice", "score"].contains(&t.as_str()) => t.as_str(),
        Some(t) => {
            e.push(
                "literal_error",
                &["questions", id, "type"],
                "Input should be 'noul', 'choice' or 'score'",
                t,
            );
            return None;
        }
    };
    check_fields(e, &base, obj, &["type", "instructions", "criteria"]);
    let before = e.0.len();
    let instructions = match obj.get("instructions") {
        Some(i) => content(e, &["questions", id, "instructions"], i, true),
        None => None,
    };
    let crit_loc = ["questions", id, "criteria"];
    let q = match kind {
        "noul" => {
            let (mut yes, mut no) = (None, None);
            match obj.get("criteria") {
                None | Some(Value::Null) => {}
                Some(Value::Object(c)) => {
                    for (k, val) in c {
                        let l = ["questions", id, "criteria", k.as_str()];
                        match k.as_str() {
                            "true" => yes = content(e, &l, val, true),
                            "false" => no = content(e, &l, val, true),
                            _ => e.push(
                                "extra_forbidden",
                                &l,
                                "Extra inputs are not permitted: noul criteria take 'true' and 'false'",
                                val,
                            ),
                        }
                    }
                }
                Some(c) => e.push("dict_type", &crit_loc, "Input should be a valid dictionary", c),
            }
            if instructions.is_none() && yes.is_none() && no.is_none() && !obj.contains_key("instructions") {
                e.push(
                    "missing",
                    &["questions", id, "instructions"],
                    "Field required: a noul question needs instructions or a true/false description",
                    v,
                );
            }
            Question::Noul { instructions, yes, no }
        }
        "choice" => {
            if !obj.contains_key("instructions") {
                e.push("missing", &["questions", id, "instructions"], "Field required", v);
            }
            let mut options = vec![];
            match obj.get("criteria") {
                None => e.push("missing", &crit_loc, "Field required", v),
                Some(Value::Object(c)) => {
                    if c.is_empty() {
                        e.push(
                            "too_short",
                            &crit_loc,
                            "Dictionary should have at least 1 item after validation, not 0",
                            &Value::Object(c.clone()),
                        );
                    }
                    if c.len() > 255 {
                        e.push(
                            "too_long",
                            &crit_loc,
                            format!(
                                "Dictionary should have at most 255 items after validation, not {}",
                                c.len()
                            ),
                            &Value::Object(c.clone()),
                        );
                    }
                    let mut seen = std::collections::HashMap::new();
                    for (name, desc) in c {
                        let l = ["questions", id, "criteria", name.as_str()];
                        if name.trim().is_empty() {
                            e.push(
                                "value_error",
                                &l,
                                "Value error, option names must not be blank",
                                &Value::String(name.clone()),
                            );
                            continue;
                        }
                        let norm = name.trim().to_lowercase();
                        if let Some(prev) = seen.insert(norm, name.clone()) {
                            e.push(
                                "value_error",
                                &l,
                                format!("Value error, option {name:?} duplicates {prev:?} (names must be distinct after trimming and lowercasing)"),
                                &Value::String(name.clone()),
                            );
                            continue;
                        }
                        let d = match desc {
                            Value::Null => None,
                            other => content(e, &l, other, true),
                        };
                        options.push((name.clone(), d));
                    }
                }
                Some(c) => e.push("dict_type", &crit_loc, "Input should be a valid dictionary", c),
            }
            Question::Choice {
                instructions: instructions.clone().unwrap_or(Content(Value::String(String::new()))),
                options,
            }
        }
        _ => {
            if !obj.contains_key("instructions") {
                e.push("missing", &["questions", id, "instructions"], "Field required", v);
            }
            let mut levels = vec![];
            match obj.get("criteria") {
                None => e.push("missing", &crit_loc, "Field required", v),
                Some(Value::Array(a)) => {
                    if a.len() < 2 {
                        e.push(
                            "too_short",
                            &crit_loc,
                            format!("List should have at least 2 items after validation, not {}", a.len()),
                            &Value::Array(a.clone()),
                        );
                    }
                    if a.len() > 10 {
                        e.push(
                            "too_long",
                            &crit_loc,
                            format!("List should have at most 10 items after validation, not {}", a.len()),
                            &Value::Array(a.clone()),
                        );
                    }
                    for (i, lv) in a.iter().enumerate() {
                        let idx = i.to_string();
                        if content(e, &["questions", id, "criteria", idx.as_str()], lv, true).is_some() {
                            levels.push(lv.clone());
                        }
                    }
                }
                Some(c) => e.push("list_type", &crit_loc, "Input should be a valid list", c),
            }
            Question::Score {
                instructions: instructions.clone().unwrap_or(Content(Value::String(String::new()))),
                levels,
            }
        }
    };
    (e.0.len() == before).then_some(q)
}

/// Parses and validates a body; `Err` holds every problem found.
pub fn parse(bytes: &[u8], max_questions: usize) -> Result<Request, Vec<Detail>> {
    let mut e = Errors(vec![]);
    let body: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(err) => {
            e.push(
                "json_invalid",
                &[],
                format!("JSON decode error: {err}"),
                &Value::Object(Map::new()),
            );
            return Err(e.0);
        }
    };
    let Some(obj) = body.as_object() else {
        e.push("dict_type", &[], "Input should be a valid dictionary", &body);
        return Err(e.0);
    };
    let model = match obj.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(m) => {
            e.push("string_type", &["model"], "Input should be a valid string", m);
            None
        }
    };
    let state = match obj.get("state") {
        None => {
            e.push("missing", &["state"], "Field required", &body);
            None
        }
        Some(Value::String(s)) => Some(State::Text(s.clone())),
        // A conversation is normalised here, as chat completions normalise theirs: a message the
        // chat endpoint refuses is this field's problem.
        Some(v @ Value::Array(a)) if !a.is_empty() && a.iter().all(is_message) => {
            match crate::pipeline::conversation::normalize_messages(Some(v), "state") {
                Ok(m) => Some(State::Conversation(m)),
                Err(err) => {
                    e.push("value_error", &["state"], format!("Value error, {err}"), v);
                    None
                }
            }
        }
        Some(v @ (Value::Object(_) | Value::Array(_))) => Some(State::Text(v.to_string())),
        Some(v) => {
            e.push(
                "value_error",
                &["state"],
                "Value error, state must be a string, an object or an array",
                v,
            );
            None
        }
    };
    let mut questions = vec![];
    match obj.get("questions") {
        None => e.push("missing", &["questions"], "Field required", &body),
        Some(Value::Object(qs)) => {
            if qs.is_empty() {
                e.push(
                    "too_short",
                    &["questions"],
                    "Dictionary should have at least 1 item after validation, not 0",
                    &Value::Object(qs.clone()),
                );
            }
            if qs.len() > max_questions {
                e.push(
                    "too_long",
                    &["questions"],
                    format!(
                        "Dictionary should have at most {max_questions} items after validation, not {}",
                        qs.len()
                    ),
                    &Value::Null,
                );
            }
            for (id, q) in qs {
                if id.is_empty() {
                    e.push(
                        "value_error",
                        &["questions", ""],
                        "Value error, question ids must not be empty",
                        q,
                    );
                    continue;
                }
                if let Some(q) = question(&mut e, id, q) {
                    questions.push((id.clone(), q));
                }
            }
        }
        Some(v) => e.push("dict_type", &["questions"], "Input should be a valid dictionary", v),
    }
    let instructions = match obj.get("instructions") {
        None | Some(Value::Null) => None,
        Some(v) => content(&mut e, &["instructions"], v, true),
    };
    let keep_alive = match obj.get("keep_alive") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(x) if (0.0..=MAX_KEEP_ALIVE).contains(&x) => Some(x),
            Some(_) => {
                e.push(
                    "value_error",
                    &["keep_alive"],
                    format!("Value error, keep_alive must be between 0 and {MAX_KEEP_ALIVE} seconds"),
                    v,
                );
                None
            }
            None => {
                e.push("float_type", &["keep_alive"], "Input should be a valid number", v);
                None
            }
        },
    };
    let cache_salt = match obj.get("cache_salt") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(v @ Value::String(_)) => {
            e.push(
                "string_too_short",
                &["cache_salt"],
                "String should have at least 1 character",
                v,
            );
            None
        }
        Some(v) => {
            e.push("string_type", &["cache_salt"], "Input should be a valid string", v);
            None
        }
    };
    let diagnostics = match obj.get("diagnostics") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            e.push("bool_type", &["diagnostics"], "Input should be a valid boolean", v);
            false
        }
    };
    let read = read_method(obj.get("x_read")).unwrap_or_else(|msg| {
        e.push("literal_error", &["x_read"], msg, &obj["x_read"]);
        None
    });
    let orders = orders(obj.get("x_orders")).unwrap_or_else(|msg| {
        e.push("int_type", &["x_orders"], msg, &obj["x_orders"]);
        None
    });
    if !e.0.is_empty() {
        return Err(e.0);
    }
    Ok(Request {
        model,
        diagnostics,
        spec: DecisionSpec {
            state: state.expect("checked"),
            questions,
            instructions,
            keep_alive: keep_alive.map(Duration::from_secs_f64),
            cache_salt,
            read,
            orders,
            tenant: None,
            breakpoints: vec![],
            breakpoint_ttl: Duration::ZERO,
            breakpoints_only: false,
        },
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
