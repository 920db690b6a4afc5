//! From the typed `/v1/decisions` wire to the decision service's [`DecisionSpec`], with OpenAI's limits
//! checked on the way (each a 400 naming the exact path):
//!
//! - `input`: a string is the state as text — the same spec, so the same reads and probabilities, as
//!   `/v1/systemone` with that `state`; items are a conversation, turned into messages exactly as
//!   `/v1/responses` turns the same items (shared `conversation::items`), so the follow-up call over the
//!   conversation finds it warm. Developer reads as system; a tool output needs an earlier call with its
//!   `call_id` and no two calls share one; `input_json` is compact JSON text within 32 levels, 10,000
//!   values and 256 KiB; images are refused (kvgate serves text-only models).
//! - `questions` (1 to the server's limit, at most 400): predicate → noul, choice → choice (2–255
//!   distinct typed values; a string shown verbatim and a boolean as `true`/`false`, strings quoted when
//!   one question has both spellings), score → score (2–10 levels, `label: description`, the description
//!   alone when the label is the level's index, as the AI SDK sends them).
//! - Prompt caching as OpenAI writes it: `implicit` (the default) keeps the state for the session's
//!   next turn (kvgate's implicit breakpoint: the decision's shared prefix) plus the latest three
//!   explicit breakpoints; `explicit` keeps only the latest four explicit ones (none: nothing is kept).
//!   Each explicit breakpoint — a `prompt_cache_breakpoint` on an `input_text` part — closes its message;
//!   the prefix up to there is pinned for the request's `ttl` (30 minutes, the only value Decisions
//!   takes). `prompt_cache_key` is a session hint, as on chat and responses (not a cache partition:
//!   the follow-up chat call with the same key must find this state).

use std::collections::HashSet;

use kvgate_decide::spec::{Content as SpecContent, DecisionSpec, Question, State};
use kvgate_model::prompt::Message;
use serde_json::Value;

use super::wire::{ChoiceValue, Content, DecisionBody, Input, InstructionPart, QuestionIn};
use crate::http::body::at;
use crate::http::error::ApiError;
use crate::pipeline::cache::{self, CacheMode, CacheOptions, Ttl};
use crate::pipeline::conversation::fold::{fold, json_text, no_images, Rules};
use crate::pipeline::conversation::item::{self, Unknown};
use crate::pipeline::conversation::items::Folder;

/// The most questions OpenAI accepts in one request.
pub(crate) const MAX_QUESTIONS: usize = 400;
/// Choices per choice question.
const CHOICES: std::ops::RangeInclusive<usize> = 2..=255;
/// Levels per score question.
const LEVELS: std::ops::RangeInclusive<usize> = 2..=10;
/// `safety_identifier` length.
const SAFETY_ID_CHARS: usize = 128;

/// What an answer needs back from its question: its name and, per type, the typed values or labels.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AnswerKey {
    /// A predicate.
    Predicate {
        /// Echoed, `null` when unnamed.
        name: Option<String>,
    },
    /// A choice, with its values in order.
    Choice {
        /// Echoed.
        name: Option<String>,
        /// The supplied values, typed, in order.
        values: Vec<ChoiceValue>,
    },
    /// A score, with its level labels in order.
    Score {
        /// Echoed.
        name: Option<String>,
        /// The level labels.
        labels: Vec<String>,
    },
}

/// A parsed request: the spec, what the answers echo, and the caching the request asked for.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The model asked for.
    pub model: String,
    /// What to decide, with the breakpoints it writes (the route joins the tenant's salt).
    pub spec: DecisionSpec,
    /// Per question, in order.
    pub keys: Vec<AnswerKey>,
    /// `x_refuse_below`.
    pub refuse_below: Option<f64>,
    /// The end user, logged.
    pub safety_identifier: Option<String>,
}

/// Reads and checks a body (already a JSON value).
pub(crate) fn parse(body: Value, max_questions: usize) -> Result<Parsed, ApiError> {
    let b: DecisionBody = at(body, "")?;
    if let Some(s) = &b.safety_identifier {
        let n = s.chars().count();
        if n > SAFETY_ID_CHARS {
            return Err(ApiError::param(
                "safety_identifier",
                format!("safety_identifier: at most {SAFETY_ID_CHARS} characters, got {n}"),
            ));
        }
    }
    let mut cache_mode = CacheMode::Implicit;
    if let Some(o) = &b.prompt_cache_options {
        cache_mode = o.mode.unwrap_or(CacheMode::Implicit);
        if let Some(ttl) = o.ttl.as_deref().filter(|t| *t != "30m") {
            return Err(ApiError::param(
                "prompt_cache_options.ttl",
                format!("prompt_cache_options.ttl: \"30m\" is the only value /v1/decisions supports, got {ttl:?}"),
            ));
        }
    }
    if let Some(r) = b.x_refuse_below {
        if !(0.0..=1.0).contains(&r) {
            return Err(ApiError::param(
                "x_refuse_below",
                format!("x_refuse_below: must be between 0 and 1, got {r}"),
            ));
        }
    }
    let max = max_questions.min(MAX_QUESTIONS);
    let n = b.questions.len();
    if n == 0 || n > max {
        return Err(ApiError::param(
            "questions",
            format!("questions: between 1 and {max} questions, got {n}"),
        ));
    }
    let mut breakpoints = vec![];
    let state = match b.input {
        Input::Text(s) => State::Text(s),
        Input::Items(items) => State::Conversation(conversation(items, &mut breakpoints)?),
    };
    let mut questions = Vec::with_capacity(n);
    let mut keys = Vec::with_capacity(n);
    for (i, q) in b.questions.into_iter().enumerate() {
        let (q, key) = question(at(q, &format!("questions[{i}]"))?, i)?;
        questions.push((i.to_string(), q));
        keys.push(key);
    }
    let mut spec = DecisionSpec::new(state, questions);
    // OpenAI's choice of the breakpoints written; every one lives 30 minutes on Decisions
    let marked: Vec<(usize, Option<Ttl>)> = breakpoints.iter().map(|&i| (i, None)).collect();
    let options = CacheOptions {
        mode: Some(cache_mode),
        ttl: Some(Ttl::Minutes30),
    };
    let writes = cache::select(&marked, Some(&options));
    spec.breakpoints = writes.marks.iter().map(|m| m.0).collect();
    spec.breakpoint_ttl = Ttl::Minutes30.duration();
    spec.breakpoints_only = writes.only;
    Ok(Parsed {
        model: b.model,
        spec,
        keys,
        refuse_below: b.x_refuse_below,
        safety_identifier: b.safety_identifier,
    })
}

/// The items as messages, read strictly ([`fold`]); records which message each explicit breakpoint
/// closes.
fn conversation(items: Vec<Value>, breakpoints: &mut Vec<usize>) -> Result<Vec<Message>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::param("input", "input: must be a string or at least one item"));
    }
    let items = item::read_list(&Value::Array(items), "input", Unknown::Refuse)?;
    let mut f = Folder::starting_with(vec![]);
    fold(&mut f, items, "input", Rules { strict: true })?;
    let (msgs, marks) = f.finish();
    breakpoints.extend(marks.into_iter().map(|(m, _)| m));
    Ok(msgs)
}

/// A question's instructions as text: a string, or parts joined by newlines.
fn instructions(c: Content, p: &str) -> Result<SpecContent, ApiError> {
    let text = match c {
        Content::Text(s) => s,
        Content::Parts(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, v) in parts.into_iter().enumerate() {
                let pp = format!("{p}[{j}]");
                match at::<InstructionPart>(v, &pp)? {
                    InstructionPart::InputText { text } => texts.push(text),
                    InstructionPart::InputImage { .. } => return Err(no_images(&pp)),
                    InstructionPart::InputJson { data } => texts.push(json_text(&data, &format!("{pp}.data"))?),
                }
            }
            texts.join("\n")
        }
    };
    Ok(SpecContent(Value::String(text)))
}

/// One question, checked, as the service's question and its answer key.
fn question(q: QuestionIn, i: usize) -> Result<(Question, AnswerKey), ApiError> {
    let p = format!("questions[{i}]");
    let ins = |c| instructions(c, &format!("{p}.instructions"));
    Ok(match q {
        QuestionIn::Predicate { instructions, name } => (
            Question::Noul {
                instructions: Some(ins(instructions)?),
                yes: None,
                no: None,
            },
            AnswerKey::Predicate { name },
        ),
        QuestionIn::Choice {
            instructions,
            choices,
            name,
        } => {
            let cp = format!("{p}.choices");
            if !CHOICES.contains(&choices.len()) {
                return Err(ApiError::param(
                    &cp,
                    format!("{cp}: between 2 and 255 choices, got {}", choices.len()),
                ));
            }
            let mut seen = HashSet::new();
            for (j, c) in choices.iter().enumerate() {
                if !seen.insert(&c.value) {
                    let vp = format!("{cp}[{j}].value");
                    return Err(ApiError::param(
                        &vp,
                        format!(
                            "{vp}: each choice must be unique; {} is listed twice",
                            display_json(&c.value)
                        ),
                    ));
                }
            }
            let shown = |v: &ChoiceValue| match v {
                ChoiceValue::Bool(b) => b.to_string(),
                ChoiceValue::Str(s) => s.clone(),
            };
            // A string spelled like a boolean of the same question is quoted (so is every string of it).
            let clash = choices.iter().any(|a| {
                matches!(a.value, ChoiceValue::Str(_))
                    && choices
                        .iter()
                        .any(|b| matches!(b.value, ChoiceValue::Bool(_)) && shown(&a.value) == shown(&b.value))
            });
            let options = choices
                .iter()
                .map(|c| {
                    let name = match &c.value {
                        ChoiceValue::Str(s) if clash => Value::String(s.clone()).to_string(),
                        v => shown(v),
                    };
                    (name, c.description.clone().map(|d| SpecContent(Value::String(d))))
                })
                .collect();
            let values = choices.into_iter().map(|c| c.value).collect();
            (
                Question::Choice {
                    instructions: ins(instructions)?,
                    options,
                },
                AnswerKey::Choice { name, values },
            )
        }
        QuestionIn::Score {
            instructions,
            levels,
            name,
        } => {
            let lp = format!("{p}.levels");
            if !LEVELS.contains(&levels.len()) {
                return Err(ApiError::param(
                    &lp,
                    format!("{lp}: between 2 and 10 levels, got {}", levels.len()),
                ));
            }
            let shown = levels
                .iter()
                .enumerate()
                .map(|(k, l)| {
                    Value::String(match &l.description {
                        None => l.label.clone(),
                        Some(d) if l.label == k.to_string() => d.clone(),
                        Some(d) => format!("{}: {d}", l.label),
                    })
                })
                .collect();
            let labels = levels.into_iter().map(|l| l.label).collect();
            (
                Question::Score {
                    instructions: ins(instructions)?,
                    levels: shown,
                },
                AnswerKey::Score { name, labels },
            )
        }
    })
}

fn display_json(v: &ChoiceValue) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;
