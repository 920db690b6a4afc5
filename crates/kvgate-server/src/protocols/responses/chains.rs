//! The responses a WebSocket connection keeps (`store: false` included), so that its next turn
//! continues one without a stored response: by id, the conversation each answered, at most
//! [`MAX_CHAINS`] (the oldest goes first); a continued response gives way to its continuation.

use std::collections::{HashMap, VecDeque};

use kvgate_model::prompt::Message;

/// Most chains one connection keeps (the oldest goes first).
pub(crate) const MAX_CHAINS: usize = 64;

/// The responses a connection keeps, by id: the conversation each answered, with its answer.
#[derive(Default)]
pub(crate) struct Chains {
    by_id: HashMap<String, Vec<Message>>,
    order: VecDeque<String>,
}

impl Chains {
    /// The conversation response `id` ended, when the connection keeps it.
    pub(crate) fn get(&self, id: &str) -> Option<&Vec<Message>> {
        self.by_id.get(id)
    }

    /// Keeps `id` as the end of its chain (`continued` is no longer one).
    pub(super) fn keep(&mut self, id: String, conversation: Vec<Message>, continued: Option<&str>) {
        if let Some(prev) = continued {
            self.evict(prev);
        }
        if self.order.len() >= MAX_CHAINS {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
        self.order.push_back(id.clone());
        self.by_id.insert(id, conversation);
    }

    pub(super) fn evict(&mut self, id: &str) {
        if self.by_id.remove(id).is_some() {
            self.order.retain(|k| k != id);
        }
    }
}
