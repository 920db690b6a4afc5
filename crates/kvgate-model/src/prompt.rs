//! Conversations to prompt text, the one way every caller renders them (chat completions, decisions
//! over a conversation state, and later protocols): the model's template, with tools when it renders
//! them; else tool traffic rewritten as text in Hermes' convention (`<tool_call>` / `<tool_response>`)
//! and the tools described in the system message. Rendering the same messages always gives the same
//! text, so a decision over a conversation and the follow-up chat completion share their prefix.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::chat::ChatTemplate;
use crate::error::Result;

/// Opens a tool call in the Hermes convention (the fallback for templates without tools).
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

/// Who says a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
    /// The developer prompt (OpenAI's newer name for system).
    Developer,
}

impl Role {
    /// Every role, in OpenAI's order.
    pub const ALL: [Role; 5] = [Role::System, Role::User, Role::Assistant, Role::Tool, Role::Developer];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Developer => "developer",
        }
    }

    /// The role a wire name names.
    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// The function a tool call calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: the JSON the model wrote (an object when it parses, else the raw string), as
    /// templates read them.
    pub arguments: Value,
}

/// One tool call of an assistant message, as templates read it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id as the client sent it (null when it sent none).
    pub id: Value,
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: ToolCallKind,
    /// The call.
    pub function: FunctionCall,
}

/// The kind of a tool call (only functions exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolCallKind {
    /// A function call.
    Function,
}

/// One message of a conversation, normalised: text content (content parts joined), and the tool
/// traffic fields where its role has them. Serialises to exactly what chat templates read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Who says it.
    pub role: Role,
    /// Its text.
    pub content: String,
    /// The speaker's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// An assistant's tool calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message of `role` saying `content`.
    pub fn text(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// Its text bytes (content and tool calls as JSON): what decides, before rendering, whether a
    /// conversation can fit the context.
    pub fn text_bytes(&self) -> usize {
        self.content.len()
            + self
                .tool_calls
                .as_ref()
                .map_or(0, |c| serde_json::to_string(c).map_or(0, |s| s.len()))
    }
}

/// Tools offered to a render, in the one form the template needs (only that one is built).
pub trait PromptTools {
    /// The `tools` template variable (OpenAI's tool list), for a template that renders tools.
    fn template_tools(&self) -> Value;
    /// The tools described as system text, for a template that does not.
    fn fallback_system(&self) -> String;
}

/// Renders normalised `messages` with `tmpl`: through the template's own tool support when it has
/// it, else with tool traffic adapted ([`adapt_messages`]). With `continue_final`, the text ends
/// right after the last message's content (the model continues it).
pub fn render_conversation(
    tmpl: &ChatTemplate,
    messages: &[Message],
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&dyn PromptTools>,
) -> Result<String> {
    let text = if tmpl.supports_tools() {
        let t = tools.map(|t| t.template_tools());
        tmpl.render(&to_value(messages), add_generation_prompt, t.as_ref(), kwargs)?
    } else {
        let sys = tools.map(|t| t.fallback_system());
        let adapted = adapt_messages(messages, sys.as_deref());
        tmpl.render(&to_value(&adapted), add_generation_prompt, None, kwargs)?
    };
    if continue_final {
        let last = messages.last().map_or("", |m| m.content.as_str());
        if let Some(pos) = text.rfind(last).filter(|_| !last.is_empty()) {
            return Ok(text[..pos + last.len()].to_string());
        }
    }
    Ok(text)
}

/// Messages as the template variable.
fn to_value(messages: &[Message]) -> Value {
    // serialising plain strings, enums and JSON values cannot fail
    serde_json::to_value(messages).unwrap_or(Value::Null)
}

/// Rewrites tool traffic in normalised messages for a template that does not render it: assistant
/// `tool_calls` become `<tool_call>` text, `tool` messages become user messages in
/// `<tool_response>` tags (Hermes' convention), and the tools' description joins the system message.
pub fn adapt_messages(messages: &[Message], system: Option<&str>) -> Vec<Message> {
    let mut out: Vec<Message> = vec![];
    for m in messages {
        match (m.role, &m.tool_calls) {
            (Role::Assistant, Some(calls)) => {
                let mut text = m.content.clone();
                for c in calls {
                    let call = json!({"name": c.function.name, "arguments": c.function.arguments});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"));
                }
                out.push(Message::text(Role::Assistant, text));
            }
            (Role::Tool, _) => out.push(Message::text(
                Role::User,
                format!("<tool_response>\n{}\n</tool_response>", m.content),
            )),
            _ => out.push(m.clone()),
        }
    }
    if let Some(sys) = system {
        match out.first_mut() {
            Some(first) if first.role == Role::System => {
                first.content = format!("{}\n\n{sys}", first.content);
            }
            _ => out.insert(0, Message::text(Role::System, sys)),
        }
    }
    out
}
