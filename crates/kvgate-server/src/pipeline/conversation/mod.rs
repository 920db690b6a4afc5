//! The conversation room: OpenAI-style wire messages (`role`, string or text-part `content`, `name`,
//! an assistant's `tool_calls`, a tool's `tool_call_id`) read into typed [`Message`]s — every refusal
//! a 400 naming the exact path (`messages[2].content[0]`) —, their size checked before any tokenizing,
//! and rendered through the model's chat template (with tools when offered). Every protocol that takes
//! a conversation (chat, responses, `/v1/systemone` states, `/tokenize`, the render endpoints) reads
//! and renders it here, so the same messages give the same prompt, and the same warm prefix,
//! whichever door they came in by.

pub(crate) mod fold;
pub(crate) mod item;
pub(crate) mod items;
mod wire;

use kvgate_model::prompt::{render_conversation, Message, PromptTools};
use serde_json::{Map, Value};

use crate::http::error::ApiError;
use crate::http::state::AppState;
use crate::pipeline::tools::ToolSpec;

/// Checks and types OpenAI chat messages ([`wire::read`]): text parts joined with newlines, anything
/// else refused with its exact path.
pub(crate) fn normalize_messages(v: Option<&Value>, field: &str) -> Result<Vec<Message>, ApiError> {
    wire::read(v, field)
}

/// [`normalize_messages`], and the messages a prompt-cache breakpoint closes (index, own ttl).
pub(crate) fn messages_marked(v: Option<&Value>, field: &str) -> Result<crate::pipeline::cache::Marked, ApiError> {
    wire::read_marked(v, field)
}

/// The text bytes of normalised messages (their contents and tool calls): what decides, before any
/// rendering or tokenizing, whether they can fit the context.
pub(crate) fn message_bytes(messages: &[Message]) -> usize {
    messages.iter().map(Message::text_bytes).sum()
}

/// Renders messages with the model's template exactly as `/v1/chat/completions` does (no tools).
pub(crate) fn render(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
) -> Result<String, ApiError> {
    render_with_tools(st, messages, add_generation_prompt, continue_final, kwargs, None)
}

/// Renders messages and, when offered, tools ([`kvgate_model::prompt::render_conversation`]).
pub(crate) fn render_with_tools(
    st: &AppState,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&ToolSpec>,
) -> Result<String, ApiError> {
    let tmpl = st.chat().ok_or_else(|| {
        ApiError::bad("this model has no chat template: serve it with --chat-template, or use /v1/completions")
    })?;
    let offered = tools.map(|t| t as &dyn PromptTools);
    render_conversation(tmpl, messages, add_generation_prompt, continue_final, kwargs, offered)
        .map_err(|e| ApiError::param("messages", e.to_string()))
}
