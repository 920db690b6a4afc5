//! Stored responses (`store: true`, the default): a bounded in-memory map from `resp_…` ids to the
//! response object and the conversation that produced it (what `previous_response_id` continues),
//! least recently used out first when either bound (entries, bytes) is reached; 0 entries turns storing
//! off. Each entry belongs to the API key that made it: another key sees a 404. Responses still being
//! generated are registered too, so `POST /v1/responses/{id}/cancel` can stop them and wait for the
//! signal that they ended (stored or forgotten), never polling. Background runs (`background: true`)
//! keep their snapshot here while they run, at most `max_entries` of them at once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kvgate_model::prompt::Message;
use tokio::sync::{watch, Notify};

use super::wire::ResponseObject;

struct Entry {
    tenant: Option<u32>,
    response: ResponseObject,
    conversation: Vec<Message>,
    bytes: usize,
    tick: u64,
}

#[derive(Default)]
struct Inner {
    map: HashMap<String, Entry>,
    lru: BTreeMap<u64, String>,
    tick: u64,
    bytes: usize,
    running: HashMap<String, Running>,
}

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
    max_bytes: usize,
    inner: Mutex<Inner>,
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

fn size(r: &ResponseObject, c: &[Message]) -> usize {
    serde_json::to_string(r).map_or(0, |s| s.len()) + c.iter().map(|m| m.content.len() + 64).sum::<usize>()
}

impl ResponseStore {
    /// A store of at most `max_entries` responses and `max_bytes` bytes (0 entries: off).
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseStore {
        ResponseStore {
            max_entries,
            max_bytes,
            inner: Mutex::new(Inner::default()),
            background: AtomicUsize::new(0),
        }
    }

    /// Whether storing is on.
    pub fn enabled(&self) -> bool {
        self.max_entries > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps a finished response and its conversation (the output included); a cancel of it now
    /// finds it ended.
    pub fn put(&self, tenant: Option<u32>, response: ResponseObject, conversation: Vec<Message>) {
        self.insert(tenant, response, conversation, true);
    }

    /// Keeps the snapshot of a response still running in the background (`GET` polls it; a cancel
    /// still stops it).
    pub fn put_running(&self, tenant: Option<u32>, response: ResponseObject) {
        self.insert(tenant, response, vec![], false);
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

    fn insert(&self, tenant: Option<u32>, response: ResponseObject, conversation: Vec<Message>, ended: bool) {
        if !self.enabled() {
            return;
        }
        let bytes = size(&response, &conversation);
        if bytes > self.max_bytes {
            return;
        }
        let mut g = self.lock();
        let id = response.id.clone();
        if ended {
            g.running.remove(&id);
        }
        if let Some(old) = g.map.remove(&id) {
            g.lru.remove(&old.tick);
            g.bytes -= old.bytes;
        }
        g.tick += 1;
        let tick = g.tick;
        g.bytes += bytes;
        g.lru.insert(tick, id.clone());
        g.map.insert(
            id,
            Entry {
                tenant,
                response,
                conversation,
                bytes,
                tick,
            },
        );
        while g.map.len() > self.max_entries || g.bytes > self.max_bytes {
            let Some((_, old)) = g.lru.pop_first() else { break };
            if let Some(e) = g.map.remove(&old) {
                g.bytes -= e.bytes;
            }
        }
    }

    /// The stored response `id` of `tenant`, with its conversation.
    pub fn get(&self, tenant: Option<u32>, id: &str) -> Option<(ResponseObject, Vec<Message>)> {
        let mut g = self.lock();
        let e = g.map.get(id).filter(|e| e.tenant == tenant)?;
        let (r, c, old) = (e.response.clone(), e.conversation.clone(), e.tick);
        g.tick += 1;
        let tick = g.tick;
        g.lru.remove(&old);
        g.lru.insert(tick, id.to_string());
        if let Some(e) = g.map.get_mut(id) {
            e.tick = tick;
        }
        Some((r, c))
    }

    /// Deletes the stored response `id` of `tenant`; false when there is none.
    pub fn delete(&self, tenant: Option<u32>, id: &str) -> bool {
        let mut g = self.lock();
        if g.map.get(id).is_none_or(|e| e.tenant != tenant) {
            return false;
        }
        if let Some(e) = g.map.remove(id) {
            g.lru.remove(&e.tick);
            g.bytes -= e.bytes;
        }
        true
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
        self.lock().running.insert(id.to_string(), r);
        cancel
    }

    /// Forgets a running response (it ended without being stored).
    pub fn ended(&self, id: &str) {
        self.lock().running.remove(id);
    }

    /// Cancels response `id` of `tenant`.
    pub fn cancel(&self, tenant: Option<u32>, id: &str) -> Cancel {
        let g = self.lock();
        if let Some(r) = g.running.get(id).filter(|r| r.tenant == tenant) {
            r.cancel.notify_one();
            return Cancel::Stopped(r.ended.subscribe());
        }
        match g.map.get(id).filter(|e| e.tenant == tenant) {
            Some(e) => Cancel::Ended(e.response.status),
            None => Cancel::Missing,
        }
    }
}
