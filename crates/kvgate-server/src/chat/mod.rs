//! `POST /v1/chat/completions`: messages rendered through the model's chat template (with
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`), then generated like a
//! completion; non-streaming or SSE (`chat.completion.chunk`), with `logprobs` / `top_logprobs`.

mod shape;

use shape::{ChatShape, ReasoningWanted};

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use kvgate_engine::GenerateRequest;
use kvgate_model::prompt::{render_conversation, Message, PromptTools, Role};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::events::{now_secs, request_id, submit_all};
use crate::openai::request::{endpoint_body, ChatFields, SamplingFields};
use crate::openai::respond::{respond, StreamUsage};
use crate::params::kind;
use crate::reasoning::ReasoningSplit;
use crate::sampling::{self, int_in};
use crate::state::{AppState, RequestTenant};
use crate::structured;
use crate::tools::stream::CallStream;
use crate::tools::{self, ToolSpec};
use kvgate_grammar::GrammarSpec;

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

/// A chat request read and checked up to its prompt's token ids: everything the generation needs but
/// the compiled grammar. What `/v1/chat/completions` submits and `/v1/chat/completions/render` shows.
pub(crate) struct Prepared {
    pub(crate) sf: SamplingFields,
    pub(crate) value: Value,
    pub(crate) model: String,
    pub(crate) ids: Vec<u32>,
    pub(crate) c: sampling::Common,
    constraint: Option<(&'static str, GrammarSpec)>,
    tool_spec: Option<ToolSpec>,
    reasoning: ReasoningWanted,
    want_lp: bool,
}

/// Reads a chat body: its fields, messages, template, tools, structured output and sampling, every
/// error a 400 naming the field; the rendered prompt encoded.
pub(crate) async fn prepare(st: &AppState, map: Map<String, Value>) -> Result<Prepared, ApiError> {
    let (sf, so, cf, value) = endpoint_body::<ChatFields>(map)?;
    if cf.echo == Some(true) {
        return Err(ApiError::param(
            "echo",
            "'echo: true' is not supported by kvgate on chat completions; only false is accepted",
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
    if cf.stream_reasoning == Some(false) {
        return Err(ApiError::param(
            "stream_reasoning",
            "'stream_reasoning: false' is not supported by kvgate (reasoning is streamed as it comes)",
        ));
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
    let text = render_with_tools(st, &messages, add_gen && !cont, cont, &kwargs, tool_spec.as_ref())?;
    let reasoning = ReasoningWanted {
        separate: cf.separate_reasoning.unwrap_or(true),
        include: cf.include_reasoning.unwrap_or(true),
        prompt_tail: ReasoningSplit::tail_of(&text),
    };
    let ids = st.encode("messages", text, false).await?;
    let mt = match (
        int_in("max_completion_tokens", cf.max_completion_tokens, 1, i64::MAX)?,
        int_in("max_tokens", sf.max_tokens, 1, i64::MAX)?,
    ) {
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let mut c = sampling::read(&sf, &st.defaults, st.engine.limits().vocab_size, mt)?;
    c.params.bad_words = st.bad_words(sf.bad_words.as_ref())?;
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
    Ok(Prepared {
        sf,
        value,
        model,
        ids,
        c,
        constraint,
        tool_spec,
        reasoning,
        want_lp,
    })
}

/// The handler.
pub async fn chat_completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/chat/completions")?;
    let Prepared {
        sf,
        value,
        model,
        ids,
        mut c,
        constraint,
        tool_spec,
        reasoning,
        want_lp,
    } = prepare(&st, map).await?;
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
        prompt_lp: c.prompt_logprobs,
        started: vec![false; n],
        calls: (0..n).map(|_| CallStream::default()).collect(),
        splits: (0..n).map(|_| ReasoningSplit::new(&reasoning.prompt_tail)).collect(),
        reasoning,
        tools: tool_spec,
    };
    let stream = c.stream.then_some(StreamUsage {
        include: c.include_usage,
        continuous: c.continuous_usage,
        prompt_tokens: prompt_len,
    });
    respond(tagged, n, stream, shape).await
}
