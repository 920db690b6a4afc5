//! The Responses stream events on the wire: one variant per event type, each serialized as
//! `{"type", "sequence_number", ...}`, and the bodies of the small routes (delete, cancel).

use serde::Serialize;

use super::object::{OutputItem, OutputText, ResponseObject};
use crate::pipeline::openai::response::TokenLogprobOut;

/// A `response.created` / `.in_progress` / `.completed` / `.incomplete` / `.failed` event's body.
#[derive(Debug, Clone, Serialize)]
pub struct WithResponse {
    pub sequence_number: usize,
    pub response: ResponseObject,
}

/// A `response.output_item.added` / `.done` event's body.
#[derive(Debug, Clone, Serialize)]
pub struct WithItem {
    pub sequence_number: usize,
    pub output_index: usize,
    pub item: OutputItem,
}

/// A `response.content_part.added` / `.done` event's body.
#[derive(Debug, Clone, Serialize)]
pub struct WithPart {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub content_index: usize,
    pub part: OutputText,
}

/// A text delta of an item's content (`response.output_text.delta` carries `logprobs`, the
/// reasoning text's delta does not).
#[derive(Debug, Clone, Serialize)]
pub struct TextDelta {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub content_index: usize,
    pub delta: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprobOut>>,
}

/// An item's content text, whole (`response.output_text.done`, `response.reasoning_text.done`).
#[derive(Debug, Clone, Serialize)]
pub struct TextDone {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub content_index: usize,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprobOut>>,
}

/// A call's arguments (or custom input) delta.
#[derive(Debug, Clone, Serialize)]
pub struct CallDelta {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub delta: String,
}

/// `response.function_call_arguments.done`.
#[derive(Debug, Clone, Serialize)]
pub struct ArgumentsDone {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub name: String,
    pub arguments: String,
}

/// `response.custom_tool_call_input.done`.
#[derive(Debug, Clone, Serialize)]
pub struct InputDone {
    pub sequence_number: usize,
    pub item_id: String,
    pub output_index: usize,
    pub name: String,
    pub input: String,
}

/// One stream event, a variant per event type; serialized as `{"type", "sequence_number", ...}`.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type")]
pub enum StreamEvent {
    #[serde(rename = "response.created")]
    Created(WithResponse),
    #[serde(rename = "response.in_progress")]
    InProgress(WithResponse),
    #[serde(rename = "response.completed")]
    Completed(WithResponse),
    #[serde(rename = "response.incomplete")]
    Incomplete(WithResponse),
    #[serde(rename = "response.failed")]
    Failed(WithResponse),
    #[serde(rename = "response.output_item.added")]
    ItemAdded(WithItem),
    #[serde(rename = "response.output_item.done")]
    ItemDone(WithItem),
    #[serde(rename = "response.content_part.added")]
    PartAdded(WithPart),
    #[serde(rename = "response.content_part.done")]
    PartDone(WithPart),
    #[serde(rename = "response.output_text.delta")]
    TextDelta(TextDelta),
    #[serde(rename = "response.output_text.done")]
    TextDone(TextDone),
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningDelta(TextDelta),
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningDone(TextDone),
    #[serde(rename = "response.function_call_arguments.delta")]
    ArgumentsDelta(CallDelta),
    #[serde(rename = "response.function_call_arguments.done")]
    ArgumentsDone(ArgumentsDone),
    #[serde(rename = "response.custom_tool_call_input.delta")]
    InputDelta(CallDelta),
    #[serde(rename = "response.custom_tool_call_input.done")]
    InputDone(InputDone),
}

impl StreamEvent {
    /// The event's type (its SSE `event:` name).
    pub fn kind(&self) -> &'static str {
        match self {
            StreamEvent::Created(_) => "response.created",
            StreamEvent::InProgress(_) => "response.in_progress",
            StreamEvent::Completed(_) => "response.completed",
            StreamEvent::Incomplete(_) => "response.incomplete",
            StreamEvent::Failed(_) => "response.failed",
            StreamEvent::ItemAdded(_) => "response.output_item.added",
            StreamEvent::ItemDone(_) => "response.output_item.done",
            StreamEvent::PartAdded(_) => "response.content_part.added",
            StreamEvent::PartDone(_) => "response.content_part.done",
            StreamEvent::TextDelta(_) => "response.output_text.delta",
            StreamEvent::TextDone(_) => "response.output_text.done",
            StreamEvent::ReasoningDelta(_) => "response.reasoning_text.delta",
            StreamEvent::ReasoningDone(_) => "response.reasoning_text.done",
            StreamEvent::ArgumentsDelta(_) => "response.function_call_arguments.delta",
            StreamEvent::ArgumentsDone(_) => "response.function_call_arguments.done",
            StreamEvent::InputDelta(_) => "response.custom_tool_call_input.delta",
            StreamEvent::InputDone(_) => "response.custom_tool_call_input.done",
        }
    }

    /// Sets the event's `sequence_number`.
    pub fn set_sequence(&mut self, n: usize) {
        let slot = match self {
            StreamEvent::Created(e)
            | StreamEvent::InProgress(e)
            | StreamEvent::Completed(e)
            | StreamEvent::Incomplete(e)
            | StreamEvent::Failed(e) => &mut e.sequence_number,
            StreamEvent::ItemAdded(e) | StreamEvent::ItemDone(e) => &mut e.sequence_number,
            StreamEvent::PartAdded(e) | StreamEvent::PartDone(e) => &mut e.sequence_number,
            StreamEvent::TextDelta(e) | StreamEvent::ReasoningDelta(e) => &mut e.sequence_number,
            StreamEvent::TextDone(e) | StreamEvent::ReasoningDone(e) => &mut e.sequence_number,
            StreamEvent::ArgumentsDelta(e) | StreamEvent::InputDelta(e) => &mut e.sequence_number,
            StreamEvent::ArgumentsDone(e) => &mut e.sequence_number,
            StreamEvent::InputDone(e) => &mut e.sequence_number,
        };
        *slot = n;
    }
}

/// `DELETE /v1/responses/{id}`'s body.
#[derive(Debug, Clone, Serialize)]
pub struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}

/// A cancelled response that was not stored (`store: false`): what `cancel` answers with.
#[derive(Debug, Clone, Serialize)]
pub struct Stub {
    pub id: String,
    pub object: &'static str,
    pub status: &'static str,
}
