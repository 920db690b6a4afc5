//! `POST /v1/chat/completions`: messages rendered through the model's chat template (with
//! `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`), then generated like a
//! completion; non-streaming or SSE (`chat.completion.chunk`), with `logprobs` / `top_logprobs`.

mod shape;
mod wire;

use shape::{ChatShape, ReasoningWanted};
use wire::ChatFields;

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::middleware::RequestTenant;
use crate::http::state::AppState;
use crate::ids::{now_secs, request_id};
use crate::pipeline::cache;
use crate::pipeline::conversation::{message_bytes, messages_marked, render_with_tools};
use crate::pipeline::generation::{submit, Generation};
use crate::pipeline::openai::request::{endpoint_body, SamplingFields};
use crate::pipeline::openai::respond::respond;
use crate::pipeline::reasoning::ReasoningSplit;
use crate::pipeline::render::{Rendered, Sampling};
use crate::pipeline::sampling::{self, int_in};
use crate::pipeline::structured;
use crate::pipeline::tools::stream::CallStream;
use crate::pipeline::tools::{self, ToolSpec};
use kvgate_grammar::GrammarSpec;

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
    /// Prompt-cache breakpoints: prompt prefixes (tokens) to keep and for how long.
    breakpoints: Vec<(usize, std::time::Duration)>,
    /// Explicit caching mode: no session retention.
    breakpoints_only: bool,
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
    let (messages, marked) = messages_marked(cf.messages.as_ref().filter(|v| !v.is_null()), "messages")?;
    let writes = cache::select(&marked, sf.prompt_cache_options.as_ref());
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
    let breakpoints = cache::boundaries(st, &messages, &writes, &kwargs, tool_spec.as_ref(), &ids).await?;
    let mt = match (
        int_in("max_completion_tokens", cf.max_completion_tokens, 1, i64::MAX)?,
        int_in("max_tokens", sf.max_tokens, 1, i64::MAX)?,
    ) {
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let mut c = sampling::read(&sf, st.defaults(), st.engine().limits().vocab_size, mt)?;
    c.params.bad_words = st.bad_words(sf.bad_words.as_ref())?;
    let room = st.engine().limits().room_after(ids.len())?;
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
        breakpoints,
        breakpoints_only: writes.only,
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
        c,
        constraint,
        tool_spec,
        reasoning,
        want_lp,
        breakpoints,
        breakpoints_only,
    } = prepare(&st, map).await?;
    if st.settings().log_requests {
        tracing::info!(body = %value, "chat request");
    }
    let generation = Generation {
        prompts: vec![ids],
        sampling: c,
        guide: constraint,
        session: sf.prompt_cache_key,
        breakpoints,
        breakpoints_only,
    };
    let sub = submit(&st, &headers, tenant, generation).await?;
    let n = sub.sampling.params.n;
    let shape = ChatShape {
        st,
        id: request_id("chatcmpl"),
        created: now_secs(),
        model,
        want_lp,
        prompt_lp: sub.sampling.prompt_logprobs,
        started: vec![false; n],
        calls: (0..n).map(|_| CallStream::default()).collect(),
        splits: (0..n).map(|_| ReasoningSplit::new(&reasoning.prompt_tail)).collect(),
        reasoning,
        tools: tool_spec,
    };
    let stream = sub.stream_usage();
    respond(sub.tagged, n, stream, shape).await
}

/// `POST /v1/chat/completions/render`.
pub(crate) async fn render(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/chat/completions/render")?;
    let p = prepare(&st, map).await?;
    Ok(axum::Json(Rendered {
        request_id: request_id("chatcmpl"),
        sampling_params: Sampling::from(&p.c.params),
        model: p.model,
        stream: p.c.stream,
        cache_salt: p.c.cache_salt,
        token_ids: p.ids,
    })
    .into_response())
}
