//! `POST /v1/responses` and the stored responses' routes (`GET` / `DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`), on the shared request pipeline: the input items become a
//! conversation ([`input`]), rendered through the chat template with the tools, sampled as chat is,
//! and written by [`shape::ResponsesShape`] as the `response` object or its typed events.
//!
//! Tools: flat `function` tools as chat's; `custom` (freeform) tools offered as functions of one
//! string `input` and answered as `custom_tool_call` items; hosted tools kvgate cannot run
//! (`web_search`, `namespace`, `file_search`, …, which Codex sends by default) are left out of the
//! prompt, so the model never calls them. `text.format` (`json_schema`, `json_object`) goes through
//! llguidance. `previous_response_id` continues a stored conversation — whose tokens are usually still
//! warm: a stored response's state is retained as a session's for the next turn.

mod input;
mod shape;
pub mod store;
mod wire;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use kvgate_grammar::GrammarSpec;
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::state::{AppState, RequestTenant};
use crate::pipeline::conversation::render_with_tools;
use crate::pipeline::events::{item_id, now_secs};
use crate::pipeline::generation::{submit, Generation};
use crate::pipeline::openai::request::{strict_body, SamplingFields};
use crate::pipeline::openai::respond::{respond, respond_until, Stop, StreamUsage};
use crate::pipeline::reasoning::ReasoningSplit;
use crate::pipeline::sampling::{self, int_in};
use crate::pipeline::tools::{self, FunctionDef, Tool, ToolChoice, ToolSpec};

use shape::{ResponsesShape, Turn};
use store::Cancel;
use wire::{
    Deleted, ReasoningEcho, ResponseObject, ResponsesBody, ResponsesTool, ResponsesToolChoice, Stub, TextFormat,
    TextOptions,
};

/// Hosted tools kvgate cannot run: left out of the prompt.
const HOSTED: [&str; 10] = [
    "web_search",
    "web_search_preview",
    "namespace",
    "file_search",
    "code_interpreter",
    "image_generation",
    "local_shell",
    "computer_use_preview",
    "mcp",
    "tool_search",
];

/// The schema a custom tool is offered under: a function of one string `input`.
const CUSTOM_INPUT: &str = r#"{"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}"#;

/// The request's tools in the shared types (custom tools as functions of `{input}`) and the custom
/// tools' names; hosted tools are left out.
fn read_tools(tools: &[Value]) -> Result<(Vec<Tool>, Vec<String>), ApiError> {
    let (mut out, mut custom) = (vec![], vec![]);
    for (i, t) in tools.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        if HOSTED.contains(&kind) {
            continue;
        }
        let tool = ResponsesTool::deserialize(t).map_err(|e| match kind {
            "function" | "custom" => ApiError::param("tools", format!("tools[{i}]: {e}")),
            other => ApiError::param(
                "tools",
                format!("tools[{i}].type {other:?} is not supported by kvgate (function and custom tools are)"),
            ),
        })?;
        let named =
            |name: Option<String>| name.ok_or_else(|| ApiError::param("tools", format!("tools[{i}].name is required")));
        let function = match tool {
            ResponsesTool::Function {
                name,
                description,
                parameters,
                strict,
            } => FunctionDef {
                name: named(name)?,
                description,
                parameters: parameters.filter(|p| !p.is_null()),
                strict,
            },
            ResponsesTool::Custom { name, description } => {
                let name = named(name)?;
                custom.push(name.clone());
                FunctionDef {
                    name,
                    description,
                    parameters: serde_json::from_str(CUSTOM_INPUT).ok(),
                    strict: None,
                }
            }
        };
        out.push(Tool {
            kind: "function".into(),
            function,
        });
    }
    Ok((out, custom))
}

/// `tool_choice` in the shared type (the Responses API names a function flat; a hosted tool's
/// choice reads as `auto`, since kvgate offers none).
fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(ToolChoice::Auto);
    };
    let c = ResponsesToolChoice::deserialize(v)
        .map_err(|e| ApiError::param("tool_choice", format!("'tool_choice' is not a tool choice: {e}")))?;
    match c {
        ResponsesToolChoice::Mode(m) => ToolChoice::of_mode(&m),
        ResponsesToolChoice::Typed { kind, name } => match (kind.as_str(), name) {
            ("function" | "custom", Some(name)) => Ok(ToolChoice::Named(name)),
            (k, _) if HOSTED.contains(&k) => Ok(ToolChoice::Auto),
            (k, _) => Err(ApiError::param(
                "tool_choice",
                format!("'tool_choice' must be a mode or {{\"type\": \"function\", \"name\": …}}, got type {k:?}"),
            )),
        },
    }
}

/// The sampling fields a Responses body sets, in chat's terms.
fn sampling_fields(b: &ResponsesBody) -> SamplingFields {
    SamplingFields {
        model: b.model.clone(),
        max_tokens: b.max_output_tokens,
        temperature: b.temperature,
        top_p: b.top_p,
        stream: b.stream,
        cache_salt: b.cache_salt.clone(),
        prompt_cache_key: b.prompt_cache_key.clone(),
        ..Default::default()
    }
}

fn refuse(b: &ResponsesBody) -> Result<(), ApiError> {
    if b.background == Some(true) {
        return Err(ApiError::param(
            "background",
            "'background' responses are not supported by kvgate",
        ));
    }
    if b.conversation.is_some() {
        return Err(ApiError::param(
            "conversation",
            "'conversation' is not supported by kvgate; use previous_response_id",
        ));
    }
    if b.prompt.is_some() {
        return Err(ApiError::param(
            "prompt",
            "stored prompt templates ('prompt') are not supported by kvgate",
        ));
    }
    if let Some(t) = b.truncation.as_deref().filter(|t| !matches!(*t, "disabled" | "auto")) {
        return Err(ApiError::param(
            "truncation",
            format!("'truncation' must be \"disabled\" or \"auto\", got {t:?}"),
        ));
    }
    if let Some(s) = b
        .service_tier
        .as_deref()
        .filter(|s| !matches!(*s, "auto" | "default" | "flex" | "priority"))
    {
        return Err(ApiError::param(
            "service_tier",
            format!("'service_tier' must be auto, default, flex or priority, got {s:?}"),
        ));
    }
    int_in("top_logprobs", b.top_logprobs, 0, 0).map_err(|_| {
        ApiError::param(
            "top_logprobs",
            "'top_logprobs' on /v1/responses is not supported by kvgate (0 or absent)",
        )
    })?;
    int_in("max_tool_calls", b.max_tool_calls, 1, i64::MAX)?;
    Ok(())
}

/// `POST /v1/responses`.
pub async fn create(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/responses")?;
    if st.settings().log_requests {
        let logged = Value::Object(map.clone());
        tracing::info!(body = %logged, "responses request");
    }
    let b: ResponsesBody = strict_body(map)?;
    refuse(&b)?;
    let model = st.check_model(b.model.as_deref())?;
    let store = b.store.unwrap_or(true) && st.responses().enabled();
    let history = match b.previous_response_id.as_deref() {
        None => vec![],
        Some(id) => st.responses().get(tenant, id).map(|(_, c)| c).ok_or_else(|| {
            ApiError::NotFound(format!("previous_response_id {id:?}: no stored response with that id (responses are stored with store: true, bounded by --responses-store-entries)"))
        })?,
    };
    let input = b
        .input
        .as_ref()
        .ok_or_else(|| ApiError::param("input", "'input' is required"))?;
    let items = input::items(input)?;
    let (conversation, marked) = input::conversation(b.instructions.as_deref(), history, &items)?;
    let writes = crate::pipeline::cache::select(&marked, b.prompt_cache_options.as_ref());
    let (tool_list, custom) = read_tools(b.tools.as_deref().unwrap_or_default())?;
    let choice = tool_choice(b.tool_choice.as_ref())?;
    let tool_spec = tools::spec(tool_list, choice, b.parallel_tool_calls)?;
    let mut constraint = match b.text.as_ref().and_then(|t| t.format.clone()) {
        None | Some(TextFormat::Text) => None,
        Some(TextFormat::JsonObject) => Some(("text", GrammarSpec::JsonObject)),
        Some(TextFormat::JsonSchema { schema, strict, .. }) => Some((
            "text",
            GrammarSpec::JsonSchema {
                schema,
                strict: strict.unwrap_or(false),
            },
        )),
    };
    if let Some(g) = tool_spec.as_ref().and_then(ToolSpec::grammar) {
        if constraint.is_some() {
            return Err(ApiError::param(
                "text",
                "'text.format' cannot be combined with a 'tool_choice' that forces a call",
            ));
        }
        constraint = Some(("tool_choice", g));
    }
    let text = render_with_tools(&st, &conversation, true, false, &Map::new(), tool_spec.as_ref())?;
    let prompt_tail = ReasoningSplit::tail_of(&text);
    let ids = st.encode("input", text, false).await?;
    let breakpoints =
        crate::pipeline::cache::boundaries(&st, &conversation, &writes, &Map::new(), tool_spec.as_ref(), &ids).await?;
    let sf = sampling_fields(&b);
    let mt = int_in("max_output_tokens", b.max_output_tokens, 1, i64::MAX)?;
    let mut c = sampling::read(&sf, st.defaults(), st.engine().limits().vocab_size, mt)?;
    let room = st.engine().limits().room_after(ids.len())?;
    if !c.max_tokens_given {
        c.params.max_tokens = room;
    }
    let id = item_id("resp");
    let prompt_len = ids.len();
    let stream = c.stream;
    // a stored response may be continued: its state is a session's (retained for the next turn)
    let generation = Generation {
        prompts: vec![ids],
        sampling: c,
        guide: constraint,
        session: b.prompt_cache_key.clone().or_else(|| store.then(|| id.clone())),
        breakpoints,
        breakpoints_only: writes.only,
    };
    let response = ResponseObject {
        id: id.clone(),
        object: "response",
        created_at: now_secs(),
        status: "in_progress",
        model,
        output: vec![],
        usage: None,
        incomplete_details: None,
        error: None,
        instructions: b.instructions.clone(),
        max_output_tokens: mt,
        parallel_tool_calls: b.parallel_tool_calls.unwrap_or(true),
        previous_response_id: b.previous_response_id.clone(),
        temperature: b.temperature,
        top_p: b.top_p,
        tool_choice: b.tool_choice.clone().unwrap_or_else(|| Value::String("auto".into())),
        tools: b.tools.clone().unwrap_or_default(),
        text: b.text.clone().unwrap_or(TextOptions {
            format: Some(TextFormat::Text),
            verbosity: None,
        }),
        truncation: b.truncation.clone().unwrap_or_else(|| "disabled".into()),
        metadata: b.metadata.clone().unwrap_or_default(),
        store,
        reasoning: b
            .reasoning
            .clone()
            .unwrap_or_else(|| serde_json::to_value(ReasoningEcho::default()).unwrap_or_default()),
        service_tier: b.service_tier.clone().unwrap_or_else(|| "default".into()),
        background: false,
        user: b.user.clone(),
    };
    let tagged = submit(&st, &headers, tenant, generation).await?.tagged;
    let turn = Turn {
        tools: tool_spec,
        custom,
        conversation,
        tenant,
        store,
        prompt_tail,
    };
    let shape = ResponsesShape::new(st.clone(), response.clone(), turn);
    // `POST /v1/responses/{id}/cancel` may stop it, streamed or not
    let cancelled = st.responses().running(tenant, &id);
    if stream {
        let stream = StreamUsage {
            include: false,
            continuous: false,
            prompt_tokens: prompt_len,
        };
        // the registration goes with the stream, however it ends (a client gone included)
        let running = Running(st.clone(), id.clone());
        let stop: Stop = Box::pin(async move {
            let _running = running;
            cancelled.notified().await
        });
        return respond_until(tagged, 1, Some(stream), shape, Some(stop)).await;
    }
    let out = tokio::select! {
        r = respond(tagged, 1, None, shape) => r,
        _ = cancelled.notified() => {
            let mut r = response;
            r.status = "cancelled";
            st.responses().put(tenant, r.clone(), vec![]);
            Ok(axum::Json(r).into_response())
        }
    };
    st.responses().ended(&id);
    out
}

/// A streamed response's registration for cancel, dropped with its stream.
struct Running(Arc<AppState>, String);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.responses().ended(&self.1);
    }
}

/// `GET /v1/responses/{id}`.
pub async fn get(
    State(st): State<Arc<AppState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match st.responses().get(tenant, &id) {
        Some((r, _)) => Ok(axum::Json(r).into_response()),
        None => Err(not_found(&id)),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("no stored response with id {id:?}"))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(st): State<Arc<AppState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match st.responses().delete(tenant, &id) {
        true => Ok(axum::Json(Deleted {
            id,
            object: "response.deleted",
            deleted: true,
        })
        .into_response()),
        false => Err(not_found(&id)),
    }
}

/// `POST /v1/responses/{id}/cancel`: stops a response still being generated (not streamed) and
/// returns it with status `cancelled`; a finished one is a 400 naming its status.
pub async fn cancel(
    State(st): State<Arc<AppState>>,
    RequestTenant(tenant): RequestTenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    match st.responses().cancel(tenant, &id) {
        Cancel::Missing => Err(not_found(&id)),
        Cancel::Ended(status) => Err(ApiError::param(
            "response_id",
            format!("response {id:?} cannot be cancelled: its status is {status:?}"),
        )),
        Cancel::Stopped(mut ended) => {
            // the sender is dropped once the response is stored or forgotten: `changed` then errs
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), ended.changed()).await;
            match st.responses().get(tenant, &id) {
                Some((r, _)) => Ok(axum::Json(r).into_response()),
                None => Ok(axum::Json(Stub {
                    id,
                    object: "response",
                    status: "cancelled",
                })
                .into_response()),
            }
        }
    }
}
