//! The one reader from typed input items to conversation turns, called by `/v1/responses` and
//! `/v1/decisions` alike, so the same items give the same messages — the same rendered prefix, the
//! same warm KV — whichever door they came in by: messages as turns (`developer` as `system`), parts
//! joined back to back, `input_json` as compact JSON text (within OpenAI's limits: 32 levels, 10,000
//! values, 256 KiB), calls folded into the assistant turn they belong to and each output paired
//! with its call ([`super::items::Folder`]), earlier reasoning dropped; images, files and audio
//! refused (kvgate serves text-only models). Every refusal is a 400 naming the exact path.
//!
//! [`Rules::strict`] is OpenAI's Decisions reading: the five conversation item types only, the parts
//! each role may carry, a phase only on an assistant message, call ids used once, every output
//! answering an earlier call of its kind. The lenient reading (Responses) takes outputs whose calls
//! are in an earlier response or a compacted window; compactions and item references must have been
//! resolved into the items they stand for before the fold.

use kvgate_model::prompt::Role as MsgRole;
use serde_json::Value;

use super::item::{Content, InputItem, OutputItem, Part, Role};
use super::items::{CallBody, Folder, Pairing};
use crate::http::error::ApiError;
use crate::pipeline::cache::Ttl;

/// `input_json` limits: container depth, values, compact bytes.
const JSON_DEPTH: usize = 32;
const JSON_VALUES: usize = 10_000;
const JSON_BYTES: usize = 256 * 1024;

/// How strictly the items are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// OpenAI's Decisions reading (see the module doc).
    pub strict: bool,
}

/// Folds `items` (paths `{field}[i]`) into `f`, in order.
pub(crate) fn fold(f: &mut Folder, items: Vec<InputItem>, field: &str, rules: Rules) -> Result<(), ApiError> {
    for (i, it) in items.into_iter().enumerate() {
        let p = format!("{field}[{i}]");
        match it {
            InputItem::Message(m) => {
                if rules.strict && m.phase.is_some() && m.role != Role::Assistant {
                    return Err(ApiError::param(
                        &format!("{p}.phase"),
                        format!("{p}.phase: only an assistant message has a phase"),
                    ));
                }
                let (text, mark) = text(m.content, &format!("{p}.content"), m.role, rules)?;
                let role = match m.role {
                    Role::User => MsgRole::User,
                    Role::Developer | Role::System => MsgRole::System,
                    Role::Assistant => MsgRole::Assistant,
                };
                f.message(role, text, mark);
            }
            InputItem::FunctionCall(c) => {
                let fresh = f.call(&c.call_id, &c.name, CallBody::Function(&c.arguments));
                unique(fresh || !rules.strict, &c.call_id, &p)?;
            }
            InputItem::CustomToolCall(c) => {
                let fresh = f.call(&c.call_id, &c.name, CallBody::Custom(&c.input));
                unique(fresh || !rules.strict, &c.call_id, &p)?;
            }
            InputItem::FunctionCallOutput(o) => output(f, o, false, &p, rules)?,
            InputItem::CustomToolCallOutput(o) => output(f, o, true, &p, rules)?,
            other if rules.strict => {
                return Err(ApiError::param(
                    &format!("{p}.type"),
                    format!("{p}.type: unknown variant `{}`, expected one of `message`, `function_call`, `function_call_output`, `custom_tool_call`, `custom_tool_call_output`", other.kind()),
                ));
            }
            InputItem::Reasoning(_) | InputItem::CompactionTrigger(_) => {}
            InputItem::Compaction(_) => {
                return Err(ApiError::param(
                    &p,
                    format!("{p}: a compaction item must be one /v1/responses/compact returned"),
                ))
            }
            InputItem::ItemReference(_) => {
                return Err(ApiError::param(
                    &p,
                    format!("{p}: an item reference names an item of the previous response or the conversation"),
                ))
            }
        }
    }
    Ok(())
}

/// An output: a `tool` turn (strictly, only one that answers an earlier call of its kind).
fn output(f: &mut Folder, o: OutputItem, custom: bool, p: &str, rules: Rules) -> Result<(), ApiError> {
    if rules.strict {
        paired(f.pairs(&o.call_id, custom), &o.call_id, custom, &format!("{p}.call_id"))?;
    }
    let (text, mark) = text(o.output, &format!("{p}.output"), Role::User, rules)?;
    f.output(&o.call_id, text, mark);
    Ok(())
}

/// A 400 unless the call id of the item at `p` is fresh (or may repeat).
fn unique(ok: bool, id: &str, p: &str) -> Result<(), ApiError> {
    if ok {
        return Ok(());
    }
    let param = format!("{p}.call_id");
    Err(ApiError::param(
        &param,
        format!("{param}: the call id {id:?} is used by an earlier call"),
    ))
}

/// An output's pairing as a 400 naming `param` unless it answers an earlier call of its kind.
fn paired(pairing: Pairing, id: &str, custom: bool, param: &str) -> Result<(), ApiError> {
    let (this, other) = if custom {
        ("custom_tool_call", "function_call")
    } else {
        ("function_call", "custom_tool_call")
    };
    match pairing {
        Pairing::Paired => Ok(()),
        Pairing::OtherKind => Err(ApiError::param(
            param,
            format!("{param}: {id:?} names a {other}; a {this}_output answers a {this}"),
        )),
        Pairing::NoCall => Err(ApiError::param(
            param,
            format!("{param}: no earlier {this} has the call id {id:?}"),
        )),
    }
}

/// A message's (or a tool output's, read as the user's) text, its parts at `p[j]`; and the
/// breakpoint one of its parts carries (its own ttl), if any.
fn text(c: Content, p: &str, role: Role, rules: Rules) -> Result<(String, Option<Option<Ttl>>), ApiError> {
    let parts = match c {
        Content::Text(s) => return Ok((s, None)),
        Content::Parts(parts) => parts,
    };
    let mut out = String::new();
    let mut mark = None;
    for (j, part) in parts.into_iter().enumerate() {
        let pp = format!("{p}[{j}]");
        if rules.strict {
            let allowed: &[&str] = match role {
                Role::User => &["input_text", "input_image", "input_json"],
                Role::Developer | Role::System => &["input_text"],
                Role::Assistant => &["output_text", "refusal"],
            };
            if !allowed.contains(&part.kind()) {
                return Err(ApiError::param(
                    &pp,
                    format!(
                        "{pp}: a part of type {:?} is not allowed here (allowed: {})",
                        part.kind(),
                        allowed.join(", ")
                    ),
                ));
            }
        }
        match part {
            Part::InputText {
                text,
                prompt_cache_breakpoint,
            } => {
                out.push_str(&text);
                if let Some(b) = prompt_cache_breakpoint {
                    if rules.strict && b.ttl.is_some() {
                        let at = format!("{pp}.prompt_cache_breakpoint.ttl");
                        return Err(ApiError::param(
                            &at,
                            format!("{at}: unknown field `ttl` (a breakpoint lives as long as prompt_cache_options.ttl says)"),
                        ));
                    }
                    mark = Some(b.ttl);
                }
            }
            Part::InputImage { .. } | Part::InputFile { .. } | Part::InputAudio { .. } => return Err(no_images(&pp)),
            Part::InputJson { data } => out.push_str(&json_text(&data, &format!("{pp}.data"))?),
            Part::OutputText { text, .. } => out.push_str(&text),
            Part::Refusal { refusal } => out.push_str(&refusal),
        }
    }
    Ok((out, mark))
}

/// The refusal of an image (or a file, or audio) at `p`.
pub(crate) fn no_images(p: &str) -> ApiError {
    ApiError::param(
        p,
        format!("{p}: this model does not support image input, files or audio (kvgate serves text-only models)"),
    )
}

/// `input_json` data as compact JSON text (keys in the order sent), within OpenAI's limits.
pub(crate) fn json_text(data: &Value, p: &str) -> Result<String, ApiError> {
    let objects = match data {
        Value::Object(_) => true,
        Value::Array(a) => a.iter().all(Value::is_object),
        _ => false,
    };
    if !objects {
        return Err(ApiError::param(
            p,
            format!("{p}: must be an object or an array of objects"),
        ));
    }
    fn walk(v: &Value, depth: usize, max_depth: &mut usize, values: &mut usize) {
        *values += 1;
        let children: Box<dyn Iterator<Item = &Value>> = match v {
            Value::Object(o) => Box::new(o.values()),
            Value::Array(a) => Box::new(a.iter()),
            _ => return,
        };
        *max_depth = (*max_depth).max(depth + 1);
        for c in children {
            walk(c, depth + 1, max_depth, values);
        }
    }
    let (mut depth, mut values) = (0, 0);
    walk(data, 0, &mut depth, &mut values);
    if depth > JSON_DEPTH {
        return Err(ApiError::param(
            p,
            format!("{p}: at most {JSON_DEPTH} nested levels, got {depth}"),
        ));
    }
    if values > JSON_VALUES {
        return Err(ApiError::param(
            p,
            format!("{p}: at most {JSON_VALUES} values, got {values}"),
        ));
    }
    let text = data.to_string();
    if text.len() > JSON_BYTES {
        return Err(ApiError::param(
            p,
            format!("{p}: at most {JSON_BYTES} bytes of compact JSON, got {}", text.len()),
        ));
    }
    Ok(text)
}
