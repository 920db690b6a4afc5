//! A Responses request's input as a conversation: `instructions` first (as the system message), then
//! the items in order — messages (`developer` reads as `system`), earlier function and custom tool
//! calls folded into the assistant message they belong to, their outputs as `tool` messages, earlier
//! reasoning dropped (the model re-reads the conversation), item references replaced by the items
//! they name (the previous response's output or the conversation's). Images, files and audio are
//! refused with a 400 naming the item.

use kvgate_model::prompt::{Message, Role};
use serde_json::Value;

use super::wire::{Content, Item, Part};
use crate::http::error::ApiError;
use crate::pipeline::cache::{Marked, Ttl};
use crate::pipeline::conversation::items::{turn as message, CallBody, Folder};
use crate::pipeline::openai::request::typed;

/// The text of a content, and the breakpoint one of its parts carries (its own ttl), if any.
fn text_of(c: &Content, at: &str) -> Result<(String, Option<Option<Ttl>>), ApiError> {
    match c {
        Content::Text(s) => Ok((s.clone(), None)),
        Content::Parts(parts) => {
            let mut out = String::new();
            let mut mark = None;
            for (i, p) in parts.iter().enumerate() {
                match p {
                    Part::InputText {
                        text,
                        prompt_cache_breakpoint,
                    } => {
                        out.push_str(text);
                        if let Some(b) = prompt_cache_breakpoint {
                            mark = Some(b.ttl);
                        }
                    }
                    Part::OutputText { text } => out.push_str(text),
                    Part::Refusal { refusal } => out.push_str(refusal),
                    Part::InputImage {} | Part::InputFile {} | Part::InputAudio {} => {
                        return Err(ApiError::param(
                            "input",
                            format!("{at}.content[{i}]: images, files and audio are not supported by kvgate (the served model reads text)"),
                        ))
                    }
                }
            }
            Ok((out, mark))
        }
    }
}

/// The items of `input` (a string is one user message).
pub fn items(input: &Value) -> Result<Vec<Item>, ApiError> {
    match input {
        Value::String(s) => Ok(vec![Item::Message {
            role: "user".into(),
            content: Content::Text(s.clone()),
        }]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut v = v.clone();
                if let Some(o) = v.as_object_mut() {
                    if !o.contains_key("type") && o.contains_key("role") {
                        o.insert("type".into(), Value::from("message"));
                    }
                }
                typed::<Item>(&v).map_err(|e| ApiError::param("input", format!("input[{i}]: {e}")))
            })
            .collect(),
        _ => Err(ApiError::param("input", "'input' must be a string or a list of items")),
    }
}

/// The conversation `items` make after `history` (a previous response's), with `instructions` first;
/// and the messages a prompt-cache breakpoint closes. An output need not answer a call in the input
/// (a continuation's calls are in the history, a compacted window's are gone).
pub fn conversation(instructions: Option<&str>, history: Vec<Message>, items: &[Item]) -> Result<Marked, ApiError> {
    let mut start = vec![];
    if let Some(ins) = instructions.filter(|s| !s.is_empty()) {
        start.push(message(Role::System, ins.to_string()));
    }
    start.extend(history.into_iter().filter(|m| m.role != Role::System));
    let mut f: Folder<Option<Ttl>> = Folder::starting_with(start);
    for (i, it) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        match it {
            Item::Message { role, content } => {
                let role = match role.as_str() {
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    "system" | "developer" => Role::System,
                    other => {
                        return Err(ApiError::param(
                            "input",
                            format!("{at}.role must be user, assistant, system or developer, got {other:?}"),
                        ))
                    }
                };
                let (text, mark) = text_of(content, &at)?;
                f.message(role, text, mark);
            }
            Item::FunctionCall {
                call_id,
                name,
                arguments,
            } => {
                f.call(call_id, name, CallBody::Function(arguments));
            }
            Item::CustomToolCall { call_id, name, input } => {
                f.call(call_id, name, CallBody::Custom(input));
            }
            Item::FunctionCallOutput { call_id, output } | Item::CustomToolCallOutput { call_id, output } => {
                let (text, mark) = text_of(output, &at)?;
                f.output(call_id, text, mark);
            }
            Item::Reasoning {} | Item::CompactionTrigger {} => {}
            // read into the summary's message by `resolve_compactions` before this
            Item::Compaction { .. } => {
                return Err(ApiError::param(
                    "input",
                    format!("{at}: a compaction item must be one /v1/responses/compact returned"),
                ))
            }
            // resolved by `resolve_references` before this
            Item::ItemReference { .. } => {
                return Err(ApiError::param(
                    "input",
                    format!("{at}: an item reference names an item of the previous response or the conversation"),
                ))
            }
        }
    }
    if f.messages().iter().all(|m| m.role == Role::System) {
        return Err(ApiError::param("input", "'input' holds no message to answer"));
    }
    Ok(f.finish())
}

/// `items` with each `item_reference` replaced by the item it names among `referable()` (the
/// previous response's output items, or the stored conversation's: read only when a reference is
/// there); one it does not name is a 404 naming it.
pub fn resolve_references(input: Vec<Item>, referable: impl FnOnce() -> Vec<Value>) -> Result<Vec<Item>, ApiError> {
    if !input.iter().any(|i| matches!(i, Item::ItemReference { .. })) {
        return Ok(input);
    }
    let referable = referable();
    input
        .into_iter()
        .enumerate()
        .map(|(i, it)| match it {
            Item::ItemReference { id } => {
                let found = referable
                    .iter()
                    .find(|v| v.get("id").and_then(Value::as_str) == Some(id.as_str()));
                match found {
                    Some(v) => Ok(items(&Value::Array(vec![v.clone()]))?.remove(0)),
                    None => Err(ApiError::NotFound(format!(
                        "input[{i}]: no item {id:?} in the previous response's output or the conversation (item references name those)"
                    ))),
                }
            }
            other => Ok(other),
        })
        .collect()
}

/// `items` with each `compaction` item replaced by its stored summary (an assistant message, the
/// turn that closes the compacted window); one `lookup` does not know is a 404 naming the item.
pub fn resolve_compactions(items: Vec<Item>, lookup: impl Fn(&str) -> Option<String>) -> Result<Vec<Item>, ApiError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, it)| match it {
            Item::Compaction { encrypted_content, .. } => match lookup(&encrypted_content) {
                Some(summary) => Ok(Item::Message {
                    role: "assistant".into(),
                    content: Content::Text(summary),
                }),
                None => Err(ApiError::NotFound(format!(
                    "input[{i}]: no stored compaction {encrypted_content:?} for this key (compactions are bounded by --responses-store-entries)"
                ))),
            },
            other => Ok(other),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_become_a_conversation() {
        let input = json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Paris?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}", "id": "fc_1", "status": "completed"},
            {"type": "function_call", "call_id": "call_2", "name": "weather", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]}
        ]);
        let (msgs, marks) = conversation(Some("You are kvgate."), vec![], &items(&input).unwrap()).unwrap();
        assert!(marks.is_empty());
        let roles: Vec<Role> = msgs.iter().map(|m| m.role).collect();
        assert_eq!(
            roles,
            [
                Role::System,
                Role::System,
                Role::User,
                Role::Assistant,
                Role::Tool,
                Role::Assistant
            ]
        );
        assert_eq!(msgs[2].content, "Weather in Paris?");
        let calls = msgs[3].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].function.arguments, json!({"city": "Paris"}));
        assert_eq!(calls[1].function.arguments, json!("not json"));
        assert_eq!(msgs[4].tool_call_id.as_deref(), Some("call_1"));
        let e = items(&json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]))
            .and_then(|it| conversation(None, vec![], &it))
            .unwrap_err();
        assert!(e.to_string().contains("input[0].content[0]"), "{e}");
        // a reference becomes the item it names, or a 404 naming it
        let named = json!([{"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"}]);
        let it = items(&json!([{"type": "item_reference", "id": "fc_1"}])).unwrap();
        let resolved = resolve_references(it.clone(), || named.as_array().unwrap().clone()).unwrap();
        assert!(matches!(&resolved[0], Item::FunctionCall { call_id, .. } if call_id == "c"));
        let e = resolve_references(it, Vec::new).unwrap_err();
        assert!(e.to_string().contains("fc_1"), "{e}");
        assert!(items(&json!(5)).is_err());
        assert!(items(&json!([{"type": "bogus"}]))
            .unwrap_err()
            .to_string()
            .contains("input[0]"));
    }
}
