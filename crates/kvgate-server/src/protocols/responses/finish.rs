//! Where a Responses turn ends, whatever way it ends — the one room that writes to the protocol's
//! stores after a turn ran: the input and output items added to the stored conversation the turn
//! belongs to (once), the response stored with its conversation (the output as the assistant's turn)
//! when it asked to be, and its registration for `POST /v1/responses/{id}/cancel` ended. The shape
//! (`shape.rs`) only writes events and hands the finished response here; background runs
//! (`background.rs`), a cancelled non-streamed create (`mod.rs`) and a compaction (`compact.rs`) end
//! here too.

use std::sync::Arc;

use kvgate_model::prompt::{Message, Role};
use tokio::sync::oneshot;

use super::wire::{OutputItem, ResponseObject};
use super::ResponsesState;
use crate::pipeline::conversation::item::InputItem;
use crate::pipeline::conversation::items::{custom_call, function_call};

/// What a turn leaves behind besides its response, kept from the request until the turn ends.
pub(crate) struct Kept {
    /// The API key's tenant (stored objects are per key).
    pub(crate) tenant: Option<u32>,
    /// Whether the response asked to be stored (and the server stores any).
    pub(crate) store: bool,
    /// The conversation the request answered.
    pub(crate) conversation: Vec<Message>,
    /// The stored conversation (`/v1/conversations`) the items are added to, until they are.
    pub(crate) conversation_id: Option<String>,
    /// The input's items as the conversation keeps them.
    pub(crate) appended: Vec<InputItem>,
    /// On a WebSocket: where the answered response and its conversation go (the connection keeps
    /// the last response of each chain, stored or not).
    pub(crate) chain: Option<oneshot::Sender<(String, Vec<Message>)>>,
    /// A background run: a failed response is stored too (its client polls for it).
    pub(crate) background: bool,
}

/// A turn's way to its end: what it keeps, and the stores it ends in.
pub(crate) struct Record {
    st: Arc<ResponsesState>,
    kept: Kept,
}

impl Record {
    /// The record of a turn that keeps `kept`.
    pub(crate) fn new(st: Arc<ResponsesState>, kept: Kept) -> Record {
        Record { st, kept }
    }

    /// The turn answered with `response` (completed, incomplete or cancelled in its stream): the
    /// items added to the stored conversation, the response stored with the conversation and its
    /// output as the assistant's turn.
    pub(crate) fn answered(&mut self, response: &ResponseObject) {
        let k = &mut self.kept;
        if let Some(id) = k.conversation_id.take() {
            let mut items = std::mem::take(&mut k.appended);
            items.extend(response.output.iter().filter_map(OutputItem::as_input));
            // (a conversation deleted meanwhile keeps nothing)
            let _ = self.st.conversations().append(k.tenant, &id, items);
        }
        let keep = k.store && self.st.responses().enabled();
        if !keep && k.chain.is_none() {
            return;
        }
        let mut conv = k.conversation.clone();
        conv.push(self.assistant_turn(response));
        if let Some(tx) = self.kept.chain.take() {
            let _ = tx.send((response.id.clone(), conv.clone()));
        }
        if keep {
            self.st.responses().put(self.kept.tenant, response.clone(), conv);
        }
    }

    /// The response's output as the assistant's turn a continuation re-reads (calls as tool calls, a
    /// compaction as its summary, no thinking).
    fn assistant_turn(&self, response: &ResponseObject) -> Message {
        let mut turn = Message {
            role: Role::Assistant,
            content: String::new(),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        };
        for item in &response.output {
            match item {
                OutputItem::Message { content, .. } => {
                    content.iter().for_each(|c| turn.content.push_str(&c.text));
                }
                OutputItem::FunctionCall {
                    call_id,
                    name,
                    arguments,
                    ..
                } => turn
                    .tool_calls
                    .get_or_insert_with(Vec::new)
                    .push(function_call(call_id, name, arguments)),
                OutputItem::CustomToolCall {
                    call_id, name, input, ..
                } => turn
                    .tool_calls
                    .get_or_insert_with(Vec::new)
                    .push(custom_call(call_id, name, input)),
                // the next turn re-reads the conversation, not the thinking
                OutputItem::Reasoning { .. } => {}
                OutputItem::Compaction { encrypted_content, .. } => {
                    if let Some(c) = self.st.compactions().get(self.kept.tenant, encrypted_content) {
                        turn.content.push_str(&c.summary);
                    }
                }
            }
        }
        turn
    }

    /// The turn failed with `response` (status `failed`, its error set): a background run's is
    /// stored, so that a poll finds how it ended.
    pub(crate) fn failed(&self, response: &ResponseObject) {
        if self.kept.background {
            unanswered(&self.st, self.kept.tenant, response.clone(), true);
        }
    }

    /// The turn's registration for cancel ends (the stream ended, failed or was cancelled).
    pub(crate) fn ended(&self, id: &str) {
        self.st.responses().ended(id);
    }
}

/// A turn that ended without an answer to store with it (cancelled before it answered, or failed
/// outside its stream): the response is stored as it is, without a conversation, when it asked to
/// be; `always` stores it whatever it asked (a background run's response is always stored).
pub(crate) fn unanswered(st: &ResponsesState, tenant: Option<u32>, response: ResponseObject, always: bool) {
    if always || response.store {
        st.responses().put(tenant, response, vec![]);
    }
}

/// A compaction turn (Codex's `compaction_trigger`) or a WebSocket warm-up (`generate: false`): the
/// response stored with the conversation it read, when it asked to be.
pub(crate) fn compacted(
    st: &ResponsesState,
    tenant: Option<u32>,
    response: &ResponseObject,
    conversation: Vec<Message>,
) {
    if response.store {
        st.responses().put(tenant, response.clone(), conversation);
    }
}
