//! A Responses request read into what the pipeline submits: the conversation (a previous response's
//! or a stored conversation's items, then the input; compaction items read as their stored
//! summaries), the tools and tool choice, the guide, the sampling, and the `response` object that
//! echoes every setting with the value used (server defaults filled in). `create`, background runs
//! and compaction all start here.

use std::sync::Arc;

use kvgate_grammar::GrammarSpec;
use kvgate_model::prompt::Message;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::chains::Chains;
use super::finish::Kept;
use super::input;
use super::shape::Turn;
use super::wire::{
    ConversationRef, OutputItem, ResponseObject, ResponsesBody, ResponsesTool, ResponsesToolChoice, TextFormat,
    TextOptions, ToolEcho,
};
use crate::http::error::ApiError;
use crate::ids::{item_id, now_secs};
use crate::pipeline::conversation::item::InputItem;
use crate::pipeline::conversation::render_with_tools;
use crate::pipeline::generation::Generation;
use crate::pipeline::openai::request::SamplingFields;
use crate::pipeline::reasoning::ReasoningSplit;
use crate::pipeline::sampling::{self, int_in};
use crate::pipeline::tools::{self, FunctionDef, Tool, ToolChoice, ToolSpec};
use crate::protocols::responses::ResponsesState;

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

/// The tools offered, the custom tools' names, and the tools echoed.
type ReadTools = (Vec<Tool>, Vec<String>, Vec<ToolEcho>);

/// The request's tools in the shared types (custom tools as functions of `{input}`), the custom
/// tools' names, and the tools as the response echoes them; hosted tools are left out.
fn read_tools(tools: &[Value]) -> Result<ReadTools, ApiError> {
    let (mut out, mut custom, mut echo) = (vec![], vec![], vec![]);
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
            } => {
                let def = FunctionDef {
                    name: named(name)?,
                    description,
                    parameters: parameters.filter(|p| !p.is_null()),
                    strict,
                };
                echo.push(ToolEcho::Function {
                    name: def.name.clone(),
                    description: def.description.clone(),
                    parameters: def.parameters.clone(),
                    strict: def.strict.unwrap_or(false),
                });
                def
            }
            ResponsesTool::Custom { name, description } => {
                let name = named(name)?;
                custom.push(name.clone());
                echo.push(ToolEcho::Custom {
                    name: name.clone(),
                    description: description.clone(),
                });
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
    Ok((out, custom, echo))
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
        presence_penalty: b.presence_penalty,
        frequency_penalty: b.frequency_penalty,
        stream: b.stream,
        cache_salt: b.cache_salt.clone(),
        prompt_cache_key: b.prompt_cache_key.clone(),
        ..Default::default()
    }
}

fn refuse(b: &ResponsesBody) -> Result<(), ApiError> {
    if b.conversation.is_some() && b.previous_response_id.is_some() {
        return Err(ApiError::param(
            "conversation",
            "'conversation' and 'previous_response_id' cannot be used together",
        ));
    }
    if b.background == Some(true) && b.store == Some(false) {
        return Err(ApiError::param(
            "background",
            "'background' responses must be stored: 'store' cannot be false",
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
    int_in("max_tool_calls", b.max_tool_calls, 1, i64::MAX)?;
    Ok(())
}

/// The tools of a compaction request as the next turns offer them (tool choice `auto`).
pub(super) fn read_tools_spec(tools: &[Value], parallel: Option<bool>) -> Result<Option<ToolSpec>, ApiError> {
    let (list, _, _) = read_tools(tools)?;
    tools::spec(list, ToolChoice::Auto, parallel)
}

/// A request read and ready to submit.
pub(super) struct Prepared {
    pub generation: Generation,
    pub response: ResponseObject,
    pub turn: Turn,
    pub prompt_len: usize,
    /// The input ends with Codex's `compaction_trigger`: the answer is a compaction.
    pub trigger: bool,
}

/// An f32 setting as the request would have written it (0.7, not 0.699999988).
fn echo(x: f32) -> f64 {
    x.to_string().parse().unwrap_or(x as f64)
}

/// What comes before the input.
struct History {
    /// A previous response's conversation.
    messages: Vec<Message>,
    /// A stored conversation's items.
    items: Vec<InputItem>,
    /// The items an `item_reference` may name.
    referable: Referable,
}

/// The items an `item_reference` may name, read only when the input holds one.
enum Referable {
    /// The previous response's output items.
    Output(Vec<OutputItem>),
    /// The stored conversation's items.
    Stored(Vec<InputItem>),
    None,
}

impl Referable {
    /// The items, as input items.
    fn items(self) -> Vec<InputItem> {
        match self {
            Referable::Output(o) => o.iter().filter_map(OutputItem::as_input).collect(),
            Referable::Stored(v) => v,
            Referable::None => vec![],
        }
    }
}

/// The conversation before the input: a previous response's (one the connection keeps first, on a
/// WebSocket), or a stored conversation's items.
fn history(
    st: &ResponsesState,
    tenant: Option<u32>,
    b: &ResponsesBody,
    chains: Option<&Chains>,
) -> Result<History, ApiError> {
    if let Some(id) = b.previous_response_id.as_deref() {
        if let Some(conv) = chains.and_then(|c| c.get(id)) {
            return Ok(History {
                messages: conv.clone(),
                items: vec![],
                referable: Referable::None,
            });
        }
        let (response, conv) = st.responses().get(tenant, id).ok_or_else(|| {
            ApiError::NotFound(format!("previous_response_id {id:?}: no stored response with that id (responses are stored with store: true, bounded by --responses-store-entries)"))
        })?;
        return Ok(History {
            messages: conv,
            items: vec![],
            referable: Referable::Output(response.output),
        });
    }
    if let Some(c) = &b.conversation {
        let stored = st.conversations().items(tenant, c.id())?;
        return Ok(History {
            messages: vec![],
            items: stored.clone(),
            referable: Referable::Stored(stored),
        });
    }
    Ok(History {
        messages: vec![],
        items: vec![],
        referable: Referable::None,
    })
}

/// Reads `b` (already strictly parsed) for `tenant`: the generation to submit, the response object
/// (status `in_progress`) and what its shape needs. On a WebSocket, `chains` are the responses the
/// connection keeps (`store: false` included), continued before the stored ones, and every turn's
/// state is retained for the next.
pub(super) async fn prepare(
    st: &Arc<ResponsesState>,
    tenant: Option<u32>,
    b: &ResponsesBody,
    model: String,
    chains: Option<&Chains>,
) -> Result<Prepared, ApiError> {
    refuse(b)?;
    let store = b.store.unwrap_or(true) && st.responses().enabled();
    let History {
        messages: before,
        mut items,
        referable,
    } = history(st, tenant, b, chains)?;
    let input = b
        .input
        .as_ref()
        .ok_or_else(|| ApiError::param("input", "'input' is required"))?;
    let own = input::resolve_references(input::items(input)?, || referable.items())?;
    let appended = match &b.conversation {
        Some(_) => own.iter().cloned().map(InputItem::stored).collect(),
        None => vec![],
    };
    let trigger = matches!(own.last(), Some(InputItem::CompactionTrigger(_)));
    items.extend(own);
    let items = input::resolve_compactions(items, |r| st.compactions().get(tenant, r).map(|c| c.summary))?;
    let (conversation, marked) = input::conversation(b.instructions.as_deref(), before, items)?;
    let writes = crate::pipeline::cache::select(&marked, b.prompt_cache_options.as_ref());
    let (tool_list, custom, tools_echo) = read_tools(b.tools.as_deref().unwrap_or_default())?;
    let choice = tool_choice(b.tool_choice.as_ref())?;
    let tool_spec = tools::spec(tool_list, choice, b.parallel_tool_calls)?;
    let mut text = b.text.clone().unwrap_or_default();
    let mut constraint = match text.format.get_or_insert(TextFormat::Text) {
        TextFormat::Text => None,
        TextFormat::JsonObject => Some(("text", GrammarSpec::JsonObject)),
        TextFormat::JsonSchema { schema, strict, .. } => {
            let strict = *strict.get_or_insert(false);
            Some((
                "text",
                GrammarSpec::JsonSchema {
                    schema: schema.clone(),
                    strict,
                },
            ))
        }
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
    let sf = sampling_fields(b);
    let mt = int_in("max_output_tokens", b.max_output_tokens, 1, i64::MAX)?;
    let mut c = sampling::read(&sf, st.defaults(), st.engine().limits().vocab_size, mt)?;
    // the output text's tokens' logprobs: asked by `include` or by `top_logprobs` (0 to 20 alternatives)
    let top = int_in("top_logprobs", b.top_logprobs, 0, 20)?.unwrap_or(0);
    let logprobs = top > 0 || b.include.iter().flatten().any(|i| i == "message.output_text.logprobs");
    if logprobs {
        c.params.logprobs = Some(top as usize);
    }
    // a compaction renders its own prompt (`compact::summarise`, cut to fit): the conversation it is
    // asked about is usually too long for the window, so it is neither rendered nor checked here
    let (ids, prompt_tail, breakpoints) = if trigger {
        (vec![], String::new(), vec![])
    } else {
        let rendered = render_with_tools(st, &conversation, true, false, &Map::new(), tool_spec.as_ref())?;
        let tail = ReasoningSplit::tail_of(&rendered);
        let ids = st.encode("input", rendered, false).await?;
        let breakpoints =
            crate::pipeline::cache::boundaries(st, &conversation, &writes, &Map::new(), tool_spec.as_ref(), &ids)
                .await?;
        let room = st.engine().limits().room_after(ids.len())?;
        if !c.max_tokens_given {
            c.params.max_tokens = room;
        }
        (ids, tail, breakpoints)
    };
    let id = item_id("resp");
    let conversation_id = b.conversation.as_ref().map(|c| c.id().to_string());
    let response = ResponseObject {
        id: id.clone(),
        object: "response",
        created_at: now_secs(),
        completed_at: None,
        status: "in_progress",
        model,
        output: vec![],
        usage: None,
        incomplete_details: None,
        error: None,
        instructions: b.instructions.clone(),
        max_output_tokens: mt,
        max_tool_calls: int_in("max_tool_calls", b.max_tool_calls, 1, i64::MAX)?,
        parallel_tool_calls: b.parallel_tool_calls.unwrap_or(true),
        previous_response_id: b.previous_response_id.clone(),
        temperature: echo(c.params.temperature),
        top_p: echo(c.params.top_p),
        presence_penalty: echo(c.params.presence_penalty),
        frequency_penalty: echo(c.params.frequency_penalty),
        top_logprobs: top,
        tool_choice: b.tool_choice.clone().unwrap_or_else(|| Value::String("auto".into())),
        tools: tools_echo,
        text: TextOptions {
            format: text.format,
            verbosity: text.verbosity,
        },
        truncation: b.truncation.clone().unwrap_or_else(|| "disabled".into()),
        metadata: b.metadata.clone().unwrap_or_default(),
        store,
        reasoning: b.reasoning.clone().unwrap_or_default(),
        service_tier: b.service_tier.clone().unwrap_or_else(|| "default".into()),
        background: b.background.unwrap_or(false),
        user: b.user.clone(),
        safety_identifier: b.safety_identifier.clone(),
        prompt_cache_key: b.prompt_cache_key.clone(),
        conversation: conversation_id.clone().map(|id| ConversationRef { id }),
    };
    // a stored response (or a conversation) may be continued: its state is a session's, retained for
    // the next turn
    let session = b
        .prompt_cache_key
        .clone()
        .or_else(|| conversation_id.clone())
        .or_else(|| (store || chains.is_some()).then(|| id.clone()));
    let prompt_len = ids.len();
    let generation = Generation {
        prompts: vec![ids],
        sampling: c,
        guide: constraint,
        session,
        breakpoints,
        breakpoints_only: writes.only,
    };
    let turn = Turn {
        tools: tool_spec,
        custom,
        prompt_tail,
        logprobs,
        kept: Kept {
            tenant,
            store,
            conversation,
            conversation_id,
            appended,
            chain: None,
            background: false,
        },
    };
    Ok(Prepared {
        generation,
        response,
        turn,
        prompt_len,
        trigger,
    })
}
