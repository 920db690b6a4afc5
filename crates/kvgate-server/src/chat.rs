//! `POST /v1/chat/completions`: messages rendered through the model's chat template (with
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`), then generated like a
//! completion; non-streaming or SSE (`chat.completion.chunk`), with `logprobs` / `top_logprobs`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::stream::StreamExt;
use kvgate_engine::{Event, GenerateRequest, TokenLogprob};
use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::events::{collect, merged, now_secs, request_id, running_usage, sse, stop_reason, submit_all, usage_json};
use crate::params::{kind, Body};
use crate::sampling::{self, COMMON, UNSUPPORTED};
use crate::state::AppState;
use crate::structured;
use crate::tools::stream::{CallStream, Piece};
use crate::tools::{self, call_id, call_json, ToolSpec};

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// Checks and normalises OpenAI chat messages: content parts of type `text` are joined with newlines
/// (as vLLM does for string-content templates); anything else is refused with its location.
pub fn normalize_messages(v: Option<&Value>, field: &str) -> Result<Value, ApiError> {
    let arr = match v {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::param(field, format!("'{field}' must not be empty"))),
        None => return Err(ApiError::param(field, format!("'{field}' is required"))),
        Some(other) => {
            return Err(ApiError::param(
                field,
                format!("'{field}' must be a list of messages, got {}", kind(other)),
            ))
        }
    };
    let mut out = Vec::with_capacity(arr.len());
    for (i, m) in arr.iter().enumerate() {
        let Value::Object(obj) = m else {
            return Err(ApiError::param(
                field,
                format!("{field}[{i}] must be an object, got {}", kind(m)),
            ));
        };
        let role = obj
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::param(field, format!("{field}[{i}].role is required and must be a string")))?;
        if !ROLES.contains(&role) {
            return Err(ApiError::param(
                field,
                format!("{field}[{i}].role must be one of {}, got {role:?}", ROLES.join(", ")),
            ));
        }
        let content = match obj.get("content") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut texts = vec![];
                for (j, p) in parts.iter().enumerate() {
                    match (
                        p.get("type").and_then(Value::as_str),
                        p.get("text").and_then(Value::as_str),
                    ) {
                        (Some("text"), Some(t)) => texts.push(t.to_string()),
                        (Some(t), _) if t != "text" => {
                            return Err(ApiError::param(
                                field,
                                format!(
                                    "{field}[{i}].content[{j}]: content of type {t:?} is not supported (text only)"
                                ),
                            ))
                        }
                        _ => {
                            return Err(ApiError::param(
                                field,
                                format!("{field}[{i}].content[{j}] must be {{\"type\": \"text\", \"text\": ...}}"),
                            ))
                        }
                    }
                }
                texts.join("\n")
            }
            None | Some(Value::Null) if role == "assistant" => String::new(),
            None | Some(Value::Null) => {
                return Err(ApiError::param(field, format!("{field}[{i}].content is required")))
            }
            Some(other) => {
                return Err(ApiError::param(
                    field,
                    format!(
                        "{field}[{i}].content must be a string or a list of text parts, got {}",
                        kind(other)
                    ),
                ))
            }
        };
        for k in obj.keys() {
            match (k.as_str(), role) {
                ("role" | "content" | "name", _) | ("tool_calls", "assistant") | ("tool_call_id", "tool") => {}
                ("refusal", "assistant") => {}
                ("tool_calls" | "tool_call_id" | "function_call" | "audio" | "refusal", _) => {
                    if !obj[k].is_null() {
                        return Err(ApiError::param(
                            field,
                            format!("{field}[{i}].{k} is not supported by kvgate on a {role} message"),
                        ));
                    }
                }
                (other, _) => {
                    return Err(ApiError::param(
                        field,
                        format!("{field}[{i}] has an unknown field '{other}'"),
                    ))
                }
            }
        }
        let mut n = Map::new();
        n.insert("role".into(), role.into());
        n.insert("content".into(), content.into());
        if let Some(name) = obj.get("name").and_then(Value::as_str) {
            n.insert("name".into(), name.into());
        }
        if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = tools::normalize_tool_calls(calls, &format!("{field}[{i}].tool_calls"))
                .map_err(|e| ApiError::param(field, e))?;
            n.insert("tool_calls".into(), calls);
        }
        if let Some(id) = obj.get("tool_call_id").filter(|v| !v.is_null()) {
            let id = id
                .as_str()
                .ok_or_else(|| ApiError::param(field, format!("{field}[{i}].tool_call_id must be a string")))?;
            n.insert("tool_call_id".into(), id.into());
        }
        out.push(Value::Object(n));
    }
    Ok(Value::Array(out))
}

/// Renders messages with the model's template exactly as `/v1/chat/completions` does (no tools).
pub fn render(
    st: &AppState,
    messages: &Value,
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    render_with_tools(st, messages, add_generation_prompt, continue_final, kwargs, None)
}

/// Renders messages and, when offered, tools: through the template when it renders tools, else with
/// the tools described in the system message and tool traffic rewritten as text
/// ([`tools::adapt_messages`]).
pub fn render_with_tools(
    st: &AppState,
    messages: &Value,
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&ToolSpec>,
) -> Result<String, ApiError> {
    let tmpl = st
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::bad("this model has no chat template; use /v1/completions"))?;
    let rendered = if tmpl.supports_tools() {
        let t = tools.map(ToolSpec::template_tools);
        tmpl.render(messages, add_generation_prompt, t.as_ref(), kwargs)
    } else {
        let sys = tools.map(ToolSpec::fallback_system);
        let adapted = tools::adapt_messages(messages, sys.as_deref());
        tmpl.render(&adapted, add_generation_prompt, None, kwargs)
    };
    let text = rendered.map_err(|e| ApiError::param("messages", e.to_string()))?;
    if continue_final {
        let last = messages
            .as_array()
            .and_then(|a| a.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(pos) = text.rfind(last).filter(|_| !last.is_empty()) {
            return Ok(text[..pos + last.len()].to_string());
        }
    }
    Ok(text)
}

fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> Value {
    let entry = |id: u32, lp: f32| {
        let s = st.tokenizer.decode(&[id], false).unwrap_or_default();
        let bytes: Vec<u8> = s.as_bytes().to_vec();
        (s, lp, bytes)
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let (s, lp, bytes) = entry(l.token, l.logprob);
            let top: Vec<Value> = l
                .top
                .iter()
                .map(|(id, lp)| {
                    let (s, lp, bytes) = entry(*id, *lp);
                    json!({"token": s, "logprob": lp, "bytes": bytes})
                })
                .collect();
            json!({"token": s, "logprob": lp, "bytes": bytes, "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// The assistant message of a finished choice: tool calls parsed out when tools were offered.
fn message(text: &str, tools: Option<&ToolSpec>) -> (Value, bool) {
    let Some(spec) = tools else {
        return (json!({"role": "assistant", "content": text}), false);
    };
    let (content, calls) = spec.parse(text);
    if calls.is_empty() {
        return (
            json!({"role": "assistant", "content": content, "tool_calls": []}),
            false,
        );
    }
    let calls: Vec<Value> = calls.iter().map(|c| call_json(c, &call_id())).collect();
    (
        json!({"role": "assistant", "content": content, "tool_calls": calls}),
        true,
    )
}

/// `finish_reason`: `tool_calls` when a choice that stopped by itself made calls.
fn finish_reason(reason: Option<kvgate_engine::FinishReason>, called: bool) -> Value {
    match reason {
        Some(kvgate_engine::FinishReason::Stop) if called => "tool_calls".into(),
        Some(r) => r.as_str().into(),
        None => Value::Null,
    }
}

/// The handler.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    let b = Body::new(&map);
    let mut allowed: Vec<&str> = COMMON.iter().copied().filter(|k| *k != "echo").collect();
    allowed.extend([
        "messages",
        "logprobs",
        "top_logprobs",
        "max_completion_tokens",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ]);
    allowed.extend(structured::FIELDS);
    let mut unsupported = UNSUPPORTED.to_vec();
    unsupported.push("echo");
    b.only(&allowed, &unsupported)?;
    let model = st.check_model(b.str("model")?)?;
    let messages = normalize_messages(b.raw("messages"), "messages")?;
    let add_gen = b.bool("add_generation_prompt")?.unwrap_or(true);
    let cont = b.bool("continue_final_message")?.unwrap_or(false);
    if add_gen && cont && b.raw("add_generation_prompt").is_some() {
        return Err(ApiError::param(
            "continue_final_message",
            "'continue_final_message' cannot be combined with 'add_generation_prompt'",
        ));
    }
    let kwargs = b.object("chat_template_kwargs")?.cloned().unwrap_or_default();
    for reserved in ["messages", "add_generation_prompt", "tools"] {
        if kwargs.contains_key(reserved) {
            return Err(ApiError::param(
                "chat_template_kwargs",
                format!("'chat_template_kwargs' cannot set '{reserved}'"),
            ));
        }
    }
    let tool_spec = tools::read(&b)?;
    let mut constraint = structured::read(&b)?;
    if let Some(g) = tool_spec.as_ref().and_then(ToolSpec::grammar) {
        if let Some((field, _)) = &constraint {
            return Err(ApiError::param(
                field,
                format!("'{field}' cannot be combined with a 'tool_choice' that forces a call"),
            ));
        }
        constraint = Some(("tool_choice", g));
    }
    let text = render_with_tools(&st, &messages, add_gen && !cont, cont, &kwargs, tool_spec.as_ref())?;
    let ids = st
        .tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::param("messages", e.to_string()))?;
    let mt = match (
        b.int_in("max_completion_tokens", 1, i64::MAX)?,
        b.int_in("max_tokens", 1, i64::MAX)?,
    ) {
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let mut c = sampling::read(&b, &st.defaults, st.engine.limits().vocab_size, mt)?;
    let room = st.engine.limits().room_after(ids.len())?;
    if !c.max_tokens_given {
        c.params.max_tokens = room;
    }
    let want_lp = b.bool("logprobs")?.unwrap_or(false);
    let top = b.int_in("top_logprobs", 0, 20)?;
    if top.is_some() && !want_lp {
        return Err(ApiError::param(
            "top_logprobs",
            "'top_logprobs' requires 'logprobs' to be true",
        ));
    }
    if want_lp {
        c.params.logprobs = Some(top.unwrap_or(0) as usize);
    }
    if let Some((field, spec)) = constraint {
        c.params.guide = Some(structured::compile(st.grammars.clone(), field, spec).await?);
    }
    if st.args.log_requests {
        tracing::info!(body = %serde_json::Value::Object(map.clone()), "chat request");
    }
    let n = c.params.n;
    let prompt_len = ids.len();
    let tagged = submit_all(
        &st,
        vec![GenerateRequest {
            prompt: ids,
            params: c.params.clone(),
            cache_salt: c.cache_salt.clone(),
        }],
    )?;
    let id = request_id("chatcmpl");
    let created = now_secs();
    if !c.stream {
        let (choices, _, usage) = collect(tagged, n).await?;
        let out: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let (msg, called) = message(&ch.text, tool_spec.as_ref());
                json!({
                    "index": i,
                    "message": msg,
                    "logprobs": if want_lp { chat_logprobs(&st, &ch.logprobs) } else { Value::Null },
                    "finish_reason": finish_reason(ch.finish, called),
                    "stop_reason": stop_reason(&ch.stop),
                })
            })
            .collect();
        return Ok(axum::Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": out,
            "usage": usage_json(&usage),
        }))
        .into_response());
    }
    let include_usage = c.include_usage;
    let continuous = c.continuous_usage;
    let mut emitted = 0usize;
    let mut started = vec![false; n];
    let mut calls: Vec<CallStream> = (0..n).map(|_| CallStream::default()).collect();
    let stream = merged(tagged).map(move |(_, ev)| {
        let chunk = |index: usize, delta: Value, lp: Value, finish: Value, stop: Value| {
            json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish, "stop_reason": stop}],
            })
        };
        let mut out = vec![];
        let mut open = |choice: usize, out: &mut Vec<Value>| {
            if !started[choice] {
                started[choice] = true;
                out.push(chunk(choice, json!({"role": "assistant", "content": ""}), Value::Null, Value::Null, Value::Null));
            }
        };
        // Text deltas of a choice, through its tool-call stream when tools were offered.
        let deltas = |choice: usize, pieces: Vec<Piece>, calls: &CallStream| -> Vec<Value> {
            let first = calls.calls() - pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count();
            let mut k = first;
            pieces
                .into_iter()
                .map(|p| match p {
                    Piece::Content(t) => json!({"content": t}),
                    Piece::Call(c) => {
                        let mut v = call_json(&c, &call_id());
                        v["index"] = k.into();
                        k += 1;
                        json!({"tool_calls": [v]})
                    }
                })
                .map(|d| chunk(choice, d, Value::Null, Value::Null, Value::Null))
                .collect()
        };
        match ev {
            Event::Token { choice, text, logprob, .. } => {
                emitted += 1;
                open(choice, &mut out);
                let lp = match (want_lp, logprob) {
                    (true, Some(l)) => chat_logprobs(&st, &[l]),
                    _ => Value::Null,
                };
                match (&tool_spec, calls.get_mut(choice)) {
                    (Some(spec), Some(cs)) => {
                        let pieces = cs.push(spec, &text);
                        out.extend(deltas(choice, pieces, cs));
                        if !lp.is_null() {
                            out.push(chunk(choice, json!({}), lp, Value::Null, Value::Null));
                        }
                    }
                    _ => {
                        if !text.is_empty() || !lp.is_null() {
                            out.push(chunk(choice, json!({"content": text}), lp, Value::Null, Value::Null));
                        }
                    }
                }
            }
            Event::Finished { choice, reason, text, stop } => {
                open(choice, &mut out);
                let delta = match (&tool_spec, calls.get_mut(choice)) {
                    (Some(spec), Some(cs)) => {
                        let mut pieces = cs.push(spec, &text);
                        pieces.extend(cs.finish(spec));
                        out.extend(deltas(choice, pieces, cs));
                        json!({})
                    }
                    _ if text.is_empty() => json!({}),
                    _ => json!({"content": text}),
                };
                let called = calls.get(choice).is_some_and(|c| c.calls() > 0);
                out.push(chunk(choice, delta, Value::Null, finish_reason(Some(reason), called), stop_reason(&stop)));
            }
            Event::Done(u) => {
                if include_usage {
                    out.push(json!({
                        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [], "usage": usage_json(&u),
                    }));
                }
            }
            Event::Error(e) => out.push(ApiError::from(e).body()),
            Event::PromptLogprobs(_) | Event::Decision { .. } => {}
        }
        if continuous {
            for c in out.iter_mut().filter(|c| c.get("usage").is_none() && c.get("choices").is_some()) {
                c["usage"] = running_usage(prompt_len, emitted);
            }
        }
        out
    });
    Ok(sse(stream))
}
