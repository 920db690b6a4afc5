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
use kvgate_engine::{Event, FinishReason, GenerateRequest, TokenLogprob};
use kvgate_model::prompt::{render_conversation, Message, PromptTools, Role};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::events::{collect, merged, now_secs, request_id, sse, submit_all};
use crate::openai::request::{endpoint_body, ChatFields};
use crate::openai::response::{
    to_json, AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, Delta,
    FunctionCallOut, StopReason, TokenLogprobOut, ToolCallOut, TopLogprob, UsageOut,
};
use crate::params::kind;
use crate::sampling::{self, int_in};
use crate::state::{AppState, RequestTenant};
use crate::structured;
use crate::tools::stream::{CallStream, Piece};
use crate::tools::{self, call_id, ParsedCall, ToolSpec};

/// Checks and normalises OpenAI chat messages: content parts of type `text` are joined with newlines
/// (as vLLM does for string-content templates); anything else is refused with its location.
pub fn normalize_messages(v: Option<&Value>, field: &str) -> Result<Vec<Message>, ApiError> {
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
        let Some(r) = Role::parse(role) else {
            let roles: Vec<&str> = Role::ALL.iter().map(|r| r.as_str()).collect();
            return Err(ApiError::param(
                field,
                format!("{field}[{i}].role must be one of {}, got {role:?}", roles.join(", ")),
            ));
        };
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
        let mut n = Message::text(r, content);
        n.name = obj.get("name").and_then(Value::as_str).map(str::to_string);
        if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
            let calls = tools::normalize_tool_calls(calls, &format!("{field}[{i}].tool_calls"))
                .map_err(|e| ApiError::param(field, e))?;
            n.tool_calls = Some(calls);
        }
        if let Some(id) = obj.get("tool_call_id").filter(|v| !v.is_null()) {
            let id = id
                .as_str()
                .ok_or_else(|| ApiError::param(field, format!("{field}[{i}].tool_call_id must be a string")))?;
            n.tool_call_id = Some(id.to_string());
        }
        out.push(n);
    }
    Ok(out)
}

/// The text bytes of normalised messages (their contents and tool calls): what decides, before any
/// rendering or tokenizing, whether they can fit the context.
pub fn message_bytes(messages: &[Message]) -> usize {
    messages.iter().map(Message::text_bytes).sum()
}

/// Renders messages with the model's template exactly as `/v1/chat/completions` does (no tools).
pub fn render(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    render_with_tools(st, messages, add_generation_prompt, continue_final, kwargs, None)
}

/// Renders messages and, when offered, tools ([`kvgate_model::prompt::render_conversation`]).
pub fn render_with_tools(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&ToolSpec>,
) -> Result<String, ApiError> {
    let tmpl = st
        .chat
        .as_ref()
        .ok_or_else(|| ApiError::bad("this model has no chat template; use /v1/completions"))?;
    let offered = tools.map(|t| t as &dyn PromptTools);
    render_conversation(tmpl, messages, add_generation_prompt, continue_final, kwargs, offered)
        .map_err(|e| ApiError::param("messages", e.to_string()))
}

fn chat_logprobs(st: &AppState, lps: &[TokenLogprob]) -> ChatLogprobs {
    let text = |id: u32| st.tokenizer.decode(&[id], false).unwrap_or_default();
    let content = lps
        .iter()
        .map(|l| {
            let s = text(l.token);
            TokenLogprobOut {
                bytes: s.as_bytes().to_vec(),
                token: s,
                logprob: l.logprob,
                top_logprobs: l
                    .top
                    .iter()
                    .map(|&(id, lp)| {
                        let s = text(id);
                        TopLogprob {
                            bytes: s.as_bytes().to_vec(),
                            token: s,
                            logprob: lp,
                        }
                    })
                    .collect(),
            }
        })
        .collect();
    ChatLogprobs { content }
}

/// A parsed call as it goes out (`index` only in stream deltas).
fn call_out(c: &ParsedCall, index: Option<usize>) -> ToolCallOut {
    ToolCallOut {
        index,
        id: call_id(),
        kind: "function",
        function: FunctionCallOut {
            name: c.name.clone(),
            arguments: c.arguments.clone(),
        },
    }
}

/// The assistant message of a finished choice: tool calls parsed out when tools were offered.
fn message(text: &str, tools: Option<&ToolSpec>) -> (AssistantMessage, bool) {
    let Some(spec) = tools else {
        let m = AssistantMessage {
            role: "assistant",
            content: Some(text.to_string()),
            tool_calls: None,
        };
        return (m, false);
    };
    let (content, calls) = spec.parse(text);
    let called = !calls.is_empty();
    let m = AssistantMessage {
        role: "assistant",
        content,
        tool_calls: Some(calls.iter().map(|c| call_out(c, None)).collect()),
    };
    (m, called)
}

/// `finish_reason`: `tool_calls` when a choice that stopped by itself made calls.
fn finish_reason(reason: Option<FinishReason>, called: bool) -> Option<&'static str> {
    match reason {
        Some(FinishReason::Stop) if called => Some("tool_calls"),
        r => r.map(FinishReason::as_str),
    }
}

/// The handler.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    let (sf, so, cf, value) = endpoint_body::<ChatFields>(map)?;
    if cf.echo.is_some() {
        return Err(ApiError::param(
            "echo",
            "'echo' is not supported by kvgate on chat completions",
        ));
    }
    let model = st.check_model(sf.model.as_deref())?;
    let messages = normalize_messages(cf.messages.as_ref().filter(|v| !v.is_null()), "messages")?;
    let add_gen = cf.add_generation_prompt.unwrap_or(true);
    let cont = cf.continue_final_message.unwrap_or(false);
    if add_gen && cont && cf.add_generation_prompt.is_some() {
        return Err(ApiError::param(
            "continue_final_message",
            "'continue_final_message' cannot be combined with 'add_generation_prompt'",
        ));
    }
    let kwargs = cf.chat_template_kwargs.clone().unwrap_or_default();
    for reserved in ["messages", "add_generation_prompt", "tools"] {
        if kwargs.contains_key(reserved) {
            return Err(ApiError::param(
                "chat_template_kwargs",
                format!("'chat_template_kwargs' cannot set '{reserved}'"),
            ));
        }
    }
    let tool_spec = tools::read(cf.tools.as_ref(), cf.tool_choice.as_ref(), cf.parallel_tool_calls)?;
    let mut constraint = structured::read(&so)?;
    if let Some(g) = tool_spec.as_ref().and_then(ToolSpec::grammar) {
        if let Some((field, _)) = &constraint {
            return Err(ApiError::param(
                field,
                format!("'{field}' cannot be combined with a 'tool_choice' that forces a call"),
            ));
        }
        constraint = Some(("tool_choice", g));
    }
    st.check_prompt_bytes("messages", message_bytes(&messages))?;
    let text = render_with_tools(&st, &messages, add_gen && !cont, cont, &kwargs, tool_spec.as_ref())?;
    let ids = st.encode("messages", text, false).await?;
    let mt = match (
        int_in("max_completion_tokens", cf.max_completion_tokens, 1, i64::MAX)?,
        int_in("max_tokens", sf.max_tokens, 1, i64::MAX)?,
    ) {
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let mut c = sampling::read(&sf, &st.defaults, st.engine.limits().vocab_size, mt)?;
    let room = st.engine.limits().room_after(ids.len())?;
    if !c.max_tokens_given {
        c.params.max_tokens = room;
    }
    let want_lp = cf.logprobs.unwrap_or(false);
    let top = int_in("top_logprobs", cf.top_logprobs, 0, 20)?;
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
        tracing::info!(body = %value, "chat request");
    }
    c.cache_salt = st.salted(tenant, c.cache_salt.take());
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
        let choices = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let (message, called) = message(&ch.text, tool_spec.as_ref());
                ChatChoice {
                    index: i,
                    message,
                    logprobs: want_lp.then(|| chat_logprobs(&st, &ch.logprobs)),
                    finish_reason: finish_reason(ch.finish, called),
                    stop_reason: StopReason::of(&ch.stop),
                }
            })
            .collect();
        let out = ChatCompletion {
            id,
            object: "chat.completion",
            created,
            model,
            choices,
            usage: UsageOut::of(&usage),
        };
        return Ok(axum::Json(out).into_response());
    }
    let include_usage = c.include_usage;
    let continuous = c.continuous_usage;
    let mut emitted = 0usize;
    let mut started = vec![false; n];
    let mut calls: Vec<CallStream> = (0..n).map(|_| CallStream::default()).collect();
    let stream = merged(tagged).map(move |(_, ev)| {
        let chunk = |choices: Vec<ChunkChoice>, usage: Option<UsageOut>| ChatChunk {
            id: id.clone(),
            object: "chat.completion.chunk",
            created,
            model: model.clone(),
            choices,
            usage,
        };
        let choice = |index: usize, delta: Delta| ChunkChoice {
            index,
            delta,
            logprobs: None,
            finish_reason: None,
            stop_reason: None,
        };
        let mut out: Vec<ChatChunk> = vec![];
        let mut open = |index: usize, out: &mut Vec<ChatChunk>| {
            if !started[index] {
                started[index] = true;
                let d = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    tool_calls: None,
                };
                out.push(chunk(vec![choice(index, d)], None));
            }
        };
        // Text deltas of a choice, through its tool-call stream when tools were offered.
        let deltas = |index: usize, pieces: Vec<Piece>, calls: &CallStream| -> Vec<ChatChunk> {
            let mut k = calls.calls() - pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count();
            pieces
                .into_iter()
                .map(|p| match p {
                    Piece::Content(t) => Delta {
                        content: Some(t),
                        ..Default::default()
                    },
                    Piece::Call(c) => {
                        k += 1;
                        Delta {
                            tool_calls: Some(vec![call_out(&c, Some(k - 1))]),
                            ..Default::default()
                        }
                    }
                })
                .map(|d| chunk(vec![choice(index, d)], None))
                .collect()
        };
        match ev {
            Event::Token {
                choice: index,
                text,
                logprob,
                ..
            } => {
                emitted += 1;
                open(index, &mut out);
                let lp = match (want_lp, logprob) {
                    (true, Some(l)) => Some(chat_logprobs(&st, &[l])),
                    _ => None,
                };
                match (&tool_spec, calls.get_mut(index)) {
                    (Some(spec), Some(cs)) => {
                        let pieces = cs.push(spec, &text);
                        out.extend(deltas(index, pieces, cs));
                        if lp.is_some() {
                            let mut c = choice(index, Delta::default());
                            c.logprobs = lp;
                            out.push(chunk(vec![c], None));
                        }
                    }
                    _ => {
                        if !text.is_empty() || lp.is_some() {
                            let mut c = choice(
                                index,
                                Delta {
                                    content: Some(text),
                                    ..Default::default()
                                },
                            );
                            c.logprobs = lp;
                            out.push(chunk(vec![c], None));
                        }
                    }
                }
            }
            Event::Finished {
                choice: index,
                reason,
                text,
                stop,
            } => {
                open(index, &mut out);
                let delta = match (&tool_spec, calls.get_mut(index)) {
                    (Some(spec), Some(cs)) => {
                        let mut pieces = cs.push(spec, &text);
                        pieces.extend(cs.finish(spec));
                        out.extend(deltas(index, pieces, cs));
                        Delta::default()
                    }
                    _ if text.is_empty() => Delta::default(),
                    _ => Delta {
                        content: Some(text),
                        ..Default::default()
                    },
                };
                let called = calls.get(index).is_some_and(|c| c.calls() > 0);
                let mut c = choice(index, delta);
                c.finish_reason = finish_reason(Some(reason), called);
                c.stop_reason = StopReason::of(&stop);
                out.push(chunk(vec![c], None));
            }
            Event::Done(u) => {
                if include_usage {
                    out.push(chunk(vec![], Some(UsageOut::of(&u))));
                }
            }
            Event::Error(e) => return vec![ApiError::from(e).body().to_string()],
            Event::PromptLogprobs(_) => {}
        }
        if continuous {
            for c in out.iter_mut().filter(|c| c.usage.is_none()) {
                c.usage = Some(UsageOut::running(prompt_len, emitted));
            }
        }
        out.iter().map(to_json).collect()
    });
    Ok(sse(stream))
}
