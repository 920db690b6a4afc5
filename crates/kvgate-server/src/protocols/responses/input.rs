//! A Responses request's input as a conversation: `instructions` first (as the system message), then
//! the items in order — messages (`developer` reads as `system`), earlier function and custom tool
//! calls folded into the assistant message they belong to, their outputs as `tool` messages, earlier
//! reasoning dropped (the model re-reads the conversation), item references replaced by the items
//! they name (the previous response's output or the conversation's). Images, files and audio are
//! refused with a 400 naming the item.

use kvgate_model::prompt::{Message, Role};
use serde_json::Value;

use crate::http::error::ApiError;
use crate::pipeline::cache::Marked;
use crate::pipeline::conversation::fold::{fold, Rules};
use crate::pipeline::conversation::item::{self, InputItem, Unknown};
use crate::pipeline::conversation::items::{turn as message, Folder};

/// The items of `input` (a string is one user message), read as Responses reads them: fields kvgate
/// does not read are let go (clients echo output items back with fields of their own); a refusal's
/// param is `input`, its message names the path.
pub(crate) fn items(input: &Value) -> Result<Vec<InputItem>, ApiError> {
    item::read_list(input, "input", Unknown::Ignore).map_err(|e| e.in_field("input"))
}

/// The conversation `items` make after `history` (a previous response's), with `instructions` first;
/// and the messages a prompt-cache breakpoint closes. An output need not answer a call in the input
/// (a continuation's calls are in the history, a compacted window's are gone).
pub(crate) fn conversation(
    instructions: Option<&str>,
    history: Vec<Message>,
    items: Vec<InputItem>,
) -> Result<Marked, ApiError> {
    let mut start = vec![];
    if let Some(ins) = instructions.filter(|s| !s.is_empty()) {
        start.push(message(Role::System, ins.to_string()));
    }
    start.extend(history.into_iter().filter(|m| m.role != Role::System));
    let mut f = Folder::starting_with(start);
    fold(&mut f, items, "input", Rules { strict: false }).map_err(|e| e.in_field("input"))?;
    if f.messages().iter().all(|m| m.role == Role::System) {
        return Err(ApiError::param("input", "'input' holds no message to answer"));
    }
    Ok(f.finish())
}

/// `items` with each `item_reference` replaced by the item it names among `referable()` (the
/// previous response's output items, or the stored conversation's: read only when a reference is
/// there); one it does not name is a 404 naming it.
pub(crate) fn resolve_references(
    input: Vec<InputItem>,
    referable: impl FnOnce() -> Vec<InputItem>,
) -> Result<Vec<InputItem>, ApiError> {
    if !input.iter().any(|i| matches!(i, InputItem::ItemReference(_))) {
        return Ok(input);
    }
    let referable = referable();
    input
        .into_iter()
        .enumerate()
        .map(|(i, it)| match it {
            InputItem::ItemReference(r) => {
                let id = r.id.unwrap_or_default();
                match referable.iter().find(|v| v.id() == Some(id.as_str())) {
                    Some(v) => Ok(v.clone()),
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
pub(crate) fn resolve_compactions(
    items: Vec<InputItem>,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<InputItem>, ApiError> {
    items
        .into_iter()
        .enumerate()
        .map(|(i, it)| match it {
            InputItem::Compaction(c) => match lookup(&c.encrypted_content) {
                Some(summary) => Ok(InputItem::assistant(summary)),
                None => Err(ApiError::NotFound(format!(
                    "input[{i}]: no stored compaction {:?} for this key (compactions are bounded by --responses-store-entries)",
                    c.encrypted_content
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
        let (msgs, marks) = conversation(Some("You are kvgate."), vec![], items(&input).unwrap()).unwrap();
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
            .and_then(|it| conversation(None, vec![], it))
            .unwrap_err();
        assert!(e.to_string().contains("input[0].content[0]"), "{e}");
        // a reference becomes the item it names, or a 404 naming it
        let named =
            items(&json!([{"type": "function_call", "id": "fc_1", "call_id": "c", "name": "f", "arguments": "{}"}]));
        let it = items(&json!([{"type": "item_reference", "id": "fc_1"}])).unwrap();
        let resolved = resolve_references(it.clone(), || named.unwrap()).unwrap();
        assert!(matches!(&resolved[0], InputItem::FunctionCall(c) if c.call_id == "c"));
        let e = resolve_references(it, Vec::new).unwrap_err();
        assert!(e.to_string().contains("fc_1"), "{e}");
        assert!(items(&json!(5)).is_err());
        assert!(items(&json!([{"type": "bogus"}]))
            .unwrap_err()
            .to_string()
            .contains("input[0]"));
    }
}
