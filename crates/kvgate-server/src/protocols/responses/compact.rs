//! `POST /v1/responses/compact`: the served model summarises a conversation (a previous response's
//! and/or `input`, compaction items read as their summaries, so a window compacts again) into one
//! `compaction` item, kept server-side and named by its `encrypted_content`; the answer is the
//! compacted window — the latest user messages (newest first, within a budget) and that item — which
//! a later `/v1/responses` takes in its `input` in place of the turns it replaces.
//!
//! Codex's remote compaction (a `/v1/responses` input ending with a `compaction_trigger` item) gets
//! the same summary as exactly one `compaction` output item ([`answer_trigger`]).
//!
//! The window is prefilled before the answer (a one-token generation over it, with the tools the
//! request names, as the next turn renders it), retained under `prompt_cache_key` when one is given
//! like any session's turn: the next turn's prompt starts with the compacted state already warm.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvgate_model::prompt::{Message, Role};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::input;
use super::prepare::{read_tools_spec, Prepared};
use super::shape::ResponsesShape;
use super::wire::{OutputItem, ResponseObject, ResponseUsage, StreamEvent, WithItem, WithResponse};
use crate::http::error::{ApiError, SpecError};
use crate::http::middleware::RequestTenant;
use crate::ids::{item_id, now_secs};
use crate::pipeline::conversation::items::turn;
use crate::pipeline::conversation::render_with_tools;
use crate::pipeline::events::{collect, sse_named};
use crate::pipeline::generation::{submit, Generation};
use crate::pipeline::openai::request::{strict_body, Int, Refused, SamplingFields};
use crate::pipeline::openai::respond::Shape;
use crate::pipeline::reasoning::ReasoningSplit;
use crate::pipeline::sampling;
use crate::pipeline::tools::ToolSpec;
use crate::protocols::responses::ResponsesState;

/// What the model is asked at the end of the conversation.
const ASK: &str = "Summarise our conversation so far so that you can continue it from the summary alone: \
the goal, what was decided and done (with names, numbers and results), and what remains. Be concise; \
write only the summary.";

/// How the summary opens in the compacted window.
const LEAD: &str = "Summary of our conversation so far:\n\n";

/// The longest summary, in tokens.
const SUMMARY_TOKENS: usize = 512;

/// User messages kept verbatim in the window, newest first, up to this many characters in all.
const KEPT_USER_CHARS: usize = 2000;

/// A stored compaction: the summary the window's `compaction` item stands for.
#[derive(Debug, Clone)]
pub struct Compaction {
    pub summary: String,
}

impl Compaction {
    /// Its size in the store.
    pub fn size(c: &Compaction) -> usize {
        c.summary.len() + 64
    }
}

/// The request body (OpenAI's and the Open Responses spec's, plus what Codex sends with it).
#[derive(Debug, Default, Deserialize)]
struct CompactBody {
    model: Option<String>,
    input: Option<Value>,
    previous_response_id: Option<String>,
    instructions: Option<String>,
    prompt_cache_key: Option<String>,
    /// The tools the next turns offer: the window is prefilled as they render it.
    tools: Option<Vec<Value>>,
    parallel_tool_calls: Option<bool>,
    #[allow(dead_code)]
    reasoning: Option<Value>,
    #[allow(dead_code)]
    text: Option<Value>,
    #[allow(dead_code)]
    store: Option<bool>,
    #[allow(dead_code)]
    safety_identifier: Option<String>,
    #[allow(dead_code)]
    service_tier: Option<String>,
    #[allow(dead_code)]
    prompt_cache_options: Option<Value>,
    #[allow(dead_code)]
    prompt_cache_retention: Option<Value>,
    /// An image to compact with: refused (the served models read text).
    image: Refused,
}

/// One item of the compacted window.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WindowItem {
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<InputText>,
    },
    Compaction {
        id: String,
        encrypted_content: String,
        created_by: &'static str,
    },
}

/// An `input_text` part.
#[derive(Debug, Clone, Serialize)]
struct InputText {
    #[serde(rename = "type")]
    kind: &'static str,
    text: String,
}

/// The answer: `response.compaction`.
#[derive(Debug, Clone, Serialize)]
struct CompactResource {
    id: String,
    object: &'static str,
    created_at: u64,
    output: Vec<WindowItem>,
    usage: ResponseUsage,
}

/// The user messages kept in the window: the newest that fit [`KEPT_USER_CHARS`], in order.
fn kept_users(conversation: &[Message]) -> Vec<String> {
    let mut kept = vec![];
    let mut left = KEPT_USER_CHARS;
    for m in conversation.iter().rev().filter(|m| m.role == Role::User) {
        if m.content.len() > left {
            break;
        }
        left -= m.content.len();
        kept.push(m.content.clone());
    }
    kept.reverse();
    kept
}

/// Generates over `prompt` greedily, at most `max_tokens`; the text and usage.
async fn generate(
    st: &Arc<ResponsesState>,
    headers: &HeaderMap,
    tenant: Option<u32>,
    prompt: Vec<u32>,
    max_tokens: usize,
    session: Option<String>,
) -> Result<(String, kvgate_engine::Usage), ApiError> {
    let sf = SamplingFields {
        temperature: Some(0.0),
        max_tokens: Some(Int(max_tokens as i64)),
        ..Default::default()
    };
    let c = sampling::read(
        &sf,
        st.defaults(),
        st.engine().limits().vocab_size,
        Some(max_tokens as i64),
    )?;
    let g = Generation {
        prompts: vec![prompt],
        sampling: c,
        guide: None,
        session,
        breakpoints: vec![],
        breakpoints_only: false,
    };
    let tagged = submit(st, headers, tenant, g).await?.tagged;
    let (choices, _, usage) = collect(tagged, 1).await?;
    Ok((choices.into_iter().next().map(|c| c.text).unwrap_or_default(), usage))
}

/// Summarises `conversation` (rendered with `tools`) into a stored compaction and prefills the
/// compacted window (retained under `session`): the compaction's reference, the user messages the
/// window keeps, and the summary's usage.
pub(super) async fn summarise(
    st: &Arc<ResponsesState>,
    headers: &HeaderMap,
    tenant: Option<u32>,
    conversation: &[Message],
    tools: Option<&ToolSpec>,
    session: Option<String>,
) -> Result<(String, Vec<String>, kvgate_engine::Usage), ApiError> {
    // the summary: the conversation, then the ask — cut from the oldest turn on until the summary has
    // room (a window is compacted because it is nearly full): a turn shorter than the excess is dropped,
    // a longer one keeps its end
    let mut asked = conversation.to_vec();
    asked.push(turn(Role::User, ASK.into()));
    let max = st.engine().limits().max_model_len;
    let (ids, tail, room) = loop {
        let text = render_with_tools(st, &asked, true, false, &Map::new(), tools)?;
        let tail = ReasoningSplit::tail_of(&text);
        let chars = text.len();
        let ids = st.encode("input", text, false).await?;
        let over = (ids.len() + SUMMARY_TOKENS).saturating_sub(max);
        // (the ask is last; the system messages stay)
        let (first, ask) = (
            asked.iter().position(|m| m.role != Role::System).unwrap_or(0),
            asked.len() - 1,
        );
        if over == 0 || first >= ask {
            let room = st.engine().limits().room_after(ids.len())?;
            break (ids, tail, room);
        }
        // the prompt's own characters per token, with slack for the estimate
        let cut = (over + 16) * chars / ids.len().max(1) * 5 / 4;
        let c = &asked[first].content;
        if c.len() > cut + 64 {
            asked[first].content = c[c.floor_char_boundary(cut)..].to_string();
        } else {
            asked.remove(first);
        }
    };
    let (out, usage) = generate(st, headers, tenant, ids, SUMMARY_TOKENS.min(room), None).await?;
    let (_, answer) = ReasoningSplit::whole(&tail, &out);
    let answer = match tools {
        Some(spec) => spec.parse(&answer).0.unwrap_or_default(),
        None => answer,
    };
    let summary = format!("{LEAD}{}", answer.trim());

    // the window, as the next turn reads it
    let users = kept_users(conversation);
    let cmp = item_id("cmp");
    st.compactions().put(
        tenant,
        &cmp,
        Compaction {
            summary: summary.clone(),
        },
    );
    let mut window: Vec<Message> = conversation
        .iter()
        .filter(|m| m.role == Role::System)
        .cloned()
        .collect();
    window.extend(users.iter().map(|u| turn(Role::User, u.clone())));
    window.push(turn(Role::Assistant, summary));
    let text = render_with_tools(st, &window, false, false, &Map::new(), tools)?;
    let ids = st.encode("input", text, false).await?;
    // prefilled (one token generated and dropped), retained for the session's next turn
    generate(st, headers, tenant, ids, 1, session).await?;
    Ok((cmp, users, usage))
}

/// `POST /v1/responses/compact`.
pub async fn compact(
    State(st): State<Arc<ResponsesState>>,
    headers: HeaderMap,
    RequestTenant(tenant): RequestTenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, SpecError> {
    let map = st.json_body(&headers, body)?;
    st.check_generates("/v1/responses/compact")?;
    let b: CompactBody = strict_body(map)?;
    // the spec requires it here (a create may leave it out)
    let Some(model) = b.model.as_deref() else {
        return Err(SpecError::from(ApiError::param("model", "'model' is required")));
    };
    st.check_model(Some(model))?;
    if b.image.is_some() {
        return Err(SpecError::from(ApiError::param(
            "image",
            "images are not supported by kvgate (the served model reads text)",
        )));
    }
    if !st.compactions().enabled() {
        return Err(SpecError::from(ApiError::param(
            "input",
            "compactions are kept server-side and this server stores none (--responses-store-entries 0)",
        )));
    }
    let before = match b.previous_response_id.as_deref() {
        None => vec![],
        Some(id) => st.responses().get(tenant, id).map(|(_, c)| c).ok_or_else(|| {
            ApiError::NotFound(format!("previous_response_id {id:?}: no stored response with that id"))
        })?,
    };
    let items = match &b.input {
        None | Some(Value::Null) => vec![],
        Some(v) => input::items(v)?,
    };
    if before.is_empty() && items.is_empty() {
        return Err(SpecError::from(ApiError::param(
            "input",
            "'input' or 'previous_response_id' must give a conversation to compact",
        )));
    }
    let items = input::resolve_compactions(items, |r| st.compactions().get(tenant, r).map(|c| c.summary))?;
    let (conversation, _) = input::conversation(b.instructions.as_deref(), before, items)?;
    let tools: Option<ToolSpec> = read_tools_spec(b.tools.as_deref().unwrap_or_default(), b.parallel_tool_calls)?;

    let (cmp, users, usage) =
        summarise(&st, &headers, tenant, &conversation, tools.as_ref(), b.prompt_cache_key).await?;
    let mut output: Vec<WindowItem> = users
        .into_iter()
        .map(|text| WindowItem::Message {
            id: item_id("msg"),
            status: "completed",
            role: "user",
            content: vec![InputText {
                kind: "input_text",
                text,
            }],
        })
        .collect();
    output.push(WindowItem::Compaction {
        id: cmp.clone(),
        encrypted_content: cmp,
        created_by: "kvgate",
    });
    Ok(Json(CompactResource {
        id: item_id("resp"),
        object: "response.compaction",
        created_at: now_secs(),
        output,
        usage: ResponseUsage::of(&usage),
    })
    .into_response())
}

/// A `/v1/responses` request whose input ends with Codex's `compaction_trigger` (its remote
/// compaction): answered with the conversation compacted into exactly one `compaction` item — the
/// `response` object, or its events (`created`, `in_progress`, the item `added` and `done`,
/// `completed`) when streamed.
pub(super) async fn answer_trigger(
    st: Arc<ResponsesState>,
    headers: HeaderMap,
    p: Prepared,
) -> Result<Response, ApiError> {
    let stream = p.generation.sampling.stream;
    let (response, events, _) = trigger(&st, &headers, p).await?;
    if !stream {
        return Ok(Json(response).into_response());
    }
    let chunk = events
        .iter()
        .map(|e| (Some(e.kind()), serde_json::to_string(e).unwrap_or_default()))
        .collect();
    Ok(sse_named(
        futures::stream::iter(vec![chunk]),
        ResponsesShape::DONE_MARKER,
    ))
}

/// The compaction a `compaction_trigger` asks for: the response (completed, one `compaction` item,
/// stored when it asked to be), its events numbered, and the conversation it compacted (what a
/// continuation of it reads) — for `POST /v1/responses` and the WebSocket mode alike.
pub(super) async fn trigger(
    st: &Arc<ResponsesState>,
    headers: &HeaderMap,
    p: Prepared,
) -> Result<(ResponseObject, Vec<StreamEvent>, Vec<Message>), ApiError> {
    let Prepared { mut response, turn, .. } = p;
    let session = response.prompt_cache_key.clone();
    let (cmp, _, usage) = summarise(
        st,
        headers,
        turn.kept.tenant,
        &turn.kept.conversation,
        turn.tools.as_ref(),
        session,
    )
    .await?;
    let item = OutputItem::Compaction {
        id: cmp.clone(),
        encrypted_content: cmp,
        created_by: "kvgate",
    };
    let opened = response.clone();
    response.output = vec![item.clone()];
    response.usage = Some(ResponseUsage::of(&usage));
    response.status = "completed";
    response.completed_at = Some(now_secs());
    super::finish::compacted(st, turn.kept.tenant, &response, turn.kept.conversation.clone());
    let with = |response| WithResponse {
        sequence_number: 0,
        response,
    };
    let added = WithItem {
        sequence_number: 0,
        output_index: 0,
        item,
    };
    let mut events = vec![
        StreamEvent::Created(with(opened.clone())),
        StreamEvent::InProgress(with(opened)),
        StreamEvent::ItemAdded(added.clone()),
        StreamEvent::ItemDone(added),
        StreamEvent::Completed(with(response.clone())),
    ];
    for (i, e) in events.iter_mut().enumerate() {
        e.set_sequence(i);
    }
    Ok((response, events, turn.kept.conversation))
}
