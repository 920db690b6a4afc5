//! What the Responses routes (`/v1/responses…`, `/v1/conversations…`) share: the application's state
//! and the three stores this protocol keeps — stored responses, conversations and compactions, each
//! bounded by `--responses-store-entries` and `--responses-store-memory`. A new stored Responses
//! object is a field here and its store; nothing outside this protocol holds one.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::conversations::store::ConversationStore;
use super::replay::{self, Replay};
use super::store::ResponseStore;
use super::Compaction;
use crate::http::state::AppState;
use crate::pipeline::bounded::Bounded;

/// The Responses protocol's state.
pub(crate) struct ResponsesState {
    /// The application's state (engine, tokenizer, template, settings).
    app: Arc<AppState>,
    /// Stored responses.
    responses: Arc<ResponseStore>,
    /// Stored conversations.
    conversations: ConversationStore,
    /// Stored compactions (`POST /v1/responses/compact`), by reference.
    compactions: Bounded<Compaction>,
    /// Background runs' events, by response id (`replay.rs`).
    replays: Bounded<Replay>,
    /// WebSocket connections open (`socket.rs`).
    sockets: AtomicUsize,
}

impl ResponsesState {
    /// Empty stores of at most `entries` objects and `bytes` bytes each, over `app`.
    pub(crate) fn new(app: Arc<AppState>, entries: usize, bytes: usize) -> ResponsesState {
        ResponsesState {
            app,
            responses: Arc::new(ResponseStore::new(entries, bytes)),
            conversations: ConversationStore::new(entries, bytes),
            compactions: Bounded::new(entries, bytes, Compaction::size),
            replays: Bounded::new(entries, bytes, replay::size),
            sockets: AtomicUsize::new(0),
        }
    }

    /// Counts one more WebSocket connection, unless `max` are open; the count goes down when the
    /// returned guard drops.
    pub(crate) fn open_socket(self: &Arc<Self>, max: usize) -> Option<SocketSlot> {
        let open = self.sockets.fetch_add(1, Ordering::SeqCst);
        if open >= max {
            self.sockets.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(SocketSlot(self.clone()))
    }

    /// Stored responses.
    pub(crate) fn responses(&self) -> &Arc<ResponseStore> {
        &self.responses
    }

    /// Stored conversations.
    pub(crate) fn conversations(&self) -> &ConversationStore {
        &self.conversations
    }

    /// Stored compactions.
    pub(crate) fn compactions(&self) -> &Bounded<Compaction> {
        &self.compactions
    }

    /// Background runs' events.
    pub(crate) fn replays(&self) -> &Bounded<Replay> {
        &self.replays
    }
}

/// A Responses route reads the application's state through its own.
impl Deref for ResponsesState {
    type Target = AppState;

    fn deref(&self) -> &AppState {
        &self.app
    }
}

/// One open WebSocket connection, counted while it lives.
pub(crate) struct SocketSlot(Arc<ResponsesState>);

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.0.sockets.fetch_sub(1, Ordering::SeqCst);
    }
}
