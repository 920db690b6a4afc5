//! Conversations to prompt text, the one way every caller renders them (chat completions, decisions
//! over a conversation state, and later protocols): the model's template, with tools when it renders
//! them; else tool traffic rewritten as text in Hermes' convention (`<tool_call>` / `<tool_response>`)
//! and the tools described in the system message. Rendering the same messages always gives the same
//! text, so a decision over a conversation and the follow-up chat completion share their prefix.

use serde_json::{json, Map, Value};

use crate::chat::ChatTemplate;
use crate::error::Result;

/// Opens a tool call in the Hermes convention (the fallback for templates without tools).
pub const TOOL_CALL_OPEN: &str = "<tool_call>";
/// Closes a tool call.
pub const TOOL_CALL_CLOSE: &str = "</tool_call>";

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
    messages: &Value,
    add_generation_prompt: bool,
    continue_final: bool,
    kwargs: &Map<String, Value>,
    tools: Option<&dyn PromptTools>,
) -> Result<String> {
    let text = if tmpl.supports_tools() {
        let t = tools.map(|t| t.template_tools());
        tmpl.render(messages, add_generation_prompt, t.as_ref(), kwargs)?
    } else {
        let sys = tools.map(|t| t.fallback_system());
        let adapted = adapt_messages(messages, sys.as_deref());
        tmpl.render(&adapted, add_generation_prompt, None, kwargs)?
    };
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

/// Rewrites tool traffic in normalised messages for a template that does not render it: assistant
/// `tool_calls` become `<tool_call>` text, `tool` messages become user messages in
/// `<tool_response>` tags (Hermes' convention), and the tools' description joins the system message.
pub fn adapt_messages(messages: &Value, system: Option<&str>) -> Value {
    let Some(arr) = messages.as_array() else {
        return messages.clone();
    };
    let mut out: Vec<Value> = vec![];
    for m in arr {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").and_then(Value::as_str).unwrap_or("");
        match role {
            "assistant" if m.get("tool_calls").is_some() => {
                let mut text = content.to_string();
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    let f = &c["function"];
                    let call = json!({"name": f["name"], "arguments": f["arguments"]});
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(&format!("{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"));
                }
                out.push(json!({"role": "assistant", "content": text}));
            }
            "tool" => out.push(json!({
                "role": "user",
                "content": format!("<tool_response>\n{content}\n</tool_response>"),
            })),
            _ => out.push(m.clone()),
        }
    }
    if let Some(sys) = system {
        match out.first_mut() {
            Some(first) if first.get("role").and_then(Value::as_str) == Some("system") => {
                let c = first["content"].as_str().unwrap_or("").to_string();
                first["content"] = format!("{c}\n\n{sys}").into();
            }
            _ => out.insert(0, json!({"role": "system", "content": sys})),
        }
    }
    Value::Array(out)
}
