//! `POST /v1/chat/completions`: messages rendered through the model's chat template (with
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`), then generated like a
//! completion; non-streaming or SSE (`chat.completion.chunk`), with `logprobs` / `top_logprobs`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kvgate_engine::{FinishReason, GenerateRequest, StopMatch, TokenLogprob, Usage};
use kvgate_model::prompt::{render_conversation, Message, PromptTools, Role};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::events::{now_secs, request_id, submit_all, ChoiceOut};
use crate::openai::request::{endpoint_body, ChatFields};
use crate::openai::respond::{respond, PromptLogprobs, Shape, StreamUsage};
use crate::openai::response::{
    AssistantMessage, ChatChoice, ChatChunk, ChatCompletion, ChatLogprobs, ChunkChoice, Delta, FunctionCallOut,
    StopReason, TokenLogprobOut, ToolCallOut, TopLogprob, UsageOut,
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
        // omitted when the model made none, as OpenAI does
        tool_calls: called.then(|| calls.iter().map(|c| call_out(c, None)).collect()),
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
    if st.settings.log_requests {
        tracing::info!(body = %value, "chat request");
    }
    c.cache_salt = st.salted(tenant, c.cache_salt.take());
    let retain = st.retain_for(&headers, sf.prompt_cache_key.as_deref(), tenant);
    let n = c.params.n;
    let prompt_len = ids.len();
    let tagged = submit_all(
        &st,
        vec![GenerateRequest {
            prompt: ids,
            params: c.params.clone(),
            cache_salt: c.cache_salt.clone(),
            retain,
        }],
    )?;
    let shape = ChatShape {
        st,
        id: request_id("chatcmpl"),
        created: now_secs(),
        model,
        want_lp,
        started: vec![false; n],
        calls: (0..n).map(|_| CallStream::default()).collect(),
        tools: tool_spec,
    };
    let stream = c.stream.then_some(StreamUsage {
        include: c.include_usage,
        continuous: c.continuous_usage,
        prompt_tokens: prompt_len,
    });
    respond(tagged, n, stream, shape).await
}

/// How a chat completion writes engine events: `chat.completion` and `chat.completion.chunk`, the
/// assistant role opening each choice, tool calls parsed out of the text when tools were offered.
struct ChatShape {
    st: Arc<AppState>,
    id: String,
    created: u64,
    model: String,
    want_lp: bool,
    /// Per choice: whether its role chunk went out.
    started: Vec<bool>,
    /// Per choice: its tool-call parser (when tools were offered).
    calls: Vec<CallStream>,
    tools: Option<ToolSpec>,
}

impl ChatShape {
    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<UsageOut>) -> ChatChunk {
        ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn delta(&self, index: usize, delta: Delta) -> ChatChunk {
        self.chunk(
            vec![ChunkChoice {
                index,
                delta,
                logprobs: None,
                finish_reason: None,
                stop_reason: None,
            }],
            None,
        )
    }

    /// The role chunk, before a choice's first delta.
    fn open(&mut self, index: usize, out: &mut Vec<ChatChunk>) {
        if let Some(false) = self.started.get(index) {
            self.started[index] = true;
            let d = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                tool_calls: None,
            };
            out.push(self.delta(index, d));
        }
    }

    /// Text pieces of a choice as deltas, calls numbered after the calls it already made.
    fn pieces(&self, index: usize, pieces: Vec<Piece>) -> Vec<ChatChunk> {
        let made = self.calls.get(index).map_or(0, CallStream::calls);
        let mut k = made - pieces.iter().filter(|p| matches!(p, Piece::Call(_))).count();
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
            .map(|d| self.delta(index, d))
            .collect()
    }
}

impl Shape for ChatShape {
    type Chunk = ChatChunk;
    type Body = ChatCompletion;

    fn token(
        &mut self,
        _prompt: usize,
        index: usize,
        _token: u32,
        text: String,
        logprob: Option<TokenLogprob>,
    ) -> Vec<ChatChunk> {
        let mut out = vec![];
        self.open(index, &mut out);
        let lp = match (self.want_lp, logprob) {
            (true, Some(l)) => Some(chat_logprobs(&self.st, &[l])),
            _ => None,
        };
        let pieces = match (&self.tools, self.calls.get_mut(index)) {
            (Some(spec), Some(cs)) => Some(cs.push(spec, &text)),
            _ => None,
        };
        match pieces {
            Some(pieces) => {
                out.extend(self.pieces(index, pieces));
                if lp.is_some() {
                    let mut c = self.delta(index, Delta::default());
                    c.choices[0].logprobs = lp;
                    out.push(c);
                }
            }
            None => {
                if !text.is_empty() || lp.is_some() {
                    let d = Delta {
                        content: Some(text),
                        ..Default::default()
                    };
                    let mut c = self.delta(index, d);
                    c.choices[0].logprobs = lp;
                    out.push(c);
                }
            }
        }
        out
    }

    fn finished(
        &mut self,
        _prompt: usize,
        index: usize,
        reason: FinishReason,
        text: String,
        stop: Option<StopMatch>,
    ) -> Vec<ChatChunk> {
        let mut out = vec![];
        self.open(index, &mut out);
        let pieces = match (&self.tools, self.calls.get_mut(index)) {
            (Some(spec), Some(cs)) => {
                let mut pieces = cs.push(spec, &text);
                pieces.extend(cs.finish(spec));
                Some(pieces)
            }
            _ => None,
        };
        let delta = match pieces {
            Some(pieces) => {
                out.extend(self.pieces(index, pieces));
                Delta::default()
            }
            None if text.is_empty() => Delta::default(),
            None => Delta {
                content: Some(text),
                ..Default::default()
            },
        };
        let called = self.calls.get(index).is_some_and(|c| c.calls() > 0);
        let mut c = self.delta(index, delta);
        c.choices[0].finish_reason = finish_reason(Some(reason), called);
        c.choices[0].stop_reason = StopReason::of(&stop);
        out.push(c);
        out
    }

    fn usage_chunk(&self, usage: UsageOut) -> ChatChunk {
        self.chunk(vec![], Some(usage))
    }

    fn set_running_usage(chunk: &mut ChatChunk, usage: UsageOut) {
        chunk.usage.get_or_insert(usage);
    }

    fn body(self, choices: Vec<ChoiceOut>, _: PromptLogprobs, usage: Usage) -> ChatCompletion {
        let choices = choices
            .iter()
            .enumerate()
            .map(|(i, ch)| {
                let (message, called) = message(&ch.text, self.tools.as_ref());
                ChatChoice {
                    index: i,
                    message,
                    logprobs: self.want_lp.then(|| chat_logprobs(&self.st, &ch.logprobs)),
                    finish_reason: finish_reason(ch.finish, called),
                    stop_reason: StopReason::of(&ch.stop),
                }
            })
            .collect();
        ChatCompletion {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices,
            usage: UsageOut::of(&usage),
        }
    }
}
