//! Stored responses (`store: true`, the default): a [`Bounded`] map from `resp_…` ids to the
//! response object and the conversation that produced it (what `previous_response_id` continues),
//! least recently used out first when either bound (entries, bytes) is reached; 0 entries turns storing
//! off. Each entry belongs to the API key that made it: another key sees a 404. Responses still being
//! generated are registered too, so `POST /v1/responses/{id}/cancel` can stop them and wait for the
//! signal that they ended (stored or forgotten), never polling. Background runs (`background: true`)
//! keep their snapshot here while they run, at most `max_entries` of them at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kvgate_model::prompt::Message;
use tokio::sync::{watch, Notify};

use super::wire::ResponseObject;
use crate::pipeline::bounded::Bounded;

/// A stored response and the conversation that produced it.
type Stored = (ResponseObject, Vec<Message>);

/// A response being generated: its key, the cancel signal it listens to, and the end signal a
/// cancel waits on (dropped, so every receiver wakes, once the response is stored or forgotten).
struct Running {
    tenant: Option<u32>,
    cancel: Arc<Notify>,
    ended: watch::Sender<()>,
}

/// The store.
pub struct ResponseStore {
    max_entries: usize,
    map: Bounded<Stored>,
    running: Mutex<HashMap<String, Running>>,
    background: AtomicUsize,
}

/// One background run's place in the bound, given back when dropped.
pub struct BackgroundSlot(Arc<ResponseStore>);

impl Drop for BackgroundSlot {
    fn drop(&mut self) {
        self.0.background.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a cancel found.
#[derive(Debug)]
pub enum Cancel {
    /// A running response was told to stop; the receiver wakes once it has ended (stored, when it
    /// is stored).
    Stopped(watch::Receiver<()>),
    /// The response already ended with this status.
    Ended(&'static str),
    /// No such response (for this key).
    Missing,
}

fn size((r, c): &Stored) -> usize {
    serde_json::to_string(r).map_or(0, |s| s.len()) + c.iter().map(|m| m.content.len() + 64).sum::<usize>()
}

impl ResponseStore {
    /// A store of at most `max_entries` responses and `max_bytes` bytes (0 entries: off).
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore {
            max_entries,
            map: Bounded::new(max_entries, max_bytes, size),
            running: Mutex::new(HashMap::new()),
            background: AtomicUsize::new(0),
        }
    }

    /// Whether storing is on.
    pub fn enabled(&self) -> bool {
        self.map.enabled()
    }

    fn running_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Running>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a finished response and its conversation (the output included); a cancel of it now
    /// finds it ended (stored first, then unregistered: a cancel in between finds one or the other).
    pub fn put(&self, tenant: Option<u32>, response: ResponseObject, conversation: Vec<Message>) {
        let id = response.id.clone();
        self.map.put(tenant, &id, (response, conversation));
        self.running_map().remove(&id);
    }

    /// Keeps the snapshot of a response still running in the background (`GET` polls it; a cancel
    /// still stops it).
    pub fn put_running(&self, tenant: Option<u32>, response: ResponseObject) {
        let id = response.id.clone();
        self.map.put(tenant, &id, (response, vec![]));
    }

    /// Background runs in flight, and a guard that counts one more until dropped; `None` when
    /// `max_entries` are already running (the store's bound).
    pub fn background(self: &Arc<Self>) -> Option<BackgroundSlot> {
        let n = self.background.fetch_add(1, Ordering::SeqCst);
        if n >= self.max_entries {
            self.background.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(BackgroundSlot(self.clone()))
    }

    /// The most background runs in flight at once.
    pub fn max_background(&self) -> usize {
        self.max_entries
    }

    /// The stored response `id` of `tenant`, with its conversation.
    pub fn get(&self, tenant: Option<u32>, id: &str) -> Option<(ResponseObject, Vec<Message>)> {
        self.map.get(tenant, id)
    }

    /// Deletes the stored response `id` of `tenant`; false when there is none.
    pub fn delete(&self, tenant: Option<u32>, id: &str) -> bool {
        self.map.delete(tenant, id)
    }

    /// Registers a response being generated; the handle is notified when it is cancelled.
    pub fn running(&self, tenant: Option<u32>, id: &str) -> Arc<Notify> {
        let cancel = Arc::new(Notify::new());
        let (ended, _) = watch::channel(());
        let r = Running {
            tenant,
            cancel: cancel.clone(),
            ended,
        };
        self.running_map().insert(id.to_string(), r);
        cancel
    }

    /// Forgets a running response (it ended without being stored).
    pub fn ended(&self, id: &str) {
        self.running_map().remove(id);
    }

    /// Cancels response `id` of `tenant`.
    pub fn cancel(&self, tenant: Option<u32>, id: &str) -> Cancel {
        if let Some(r) = self.running_map().get(id).filter(|r| r.tenant == tenant) {
            r.cancel.notify_one();
            return Cancel::Stopped(r.ended.subscribe());
        }
        match self.map.read(tenant, id, |(r, _)| r.status) {
            Some(status) => Cancel::Ended(status),
            None => Cancel::Missing,
        }
    }
}
